"""Decision providers, one folder each (layout: docs/architecture.md); `gateway/` and `worker/`
here hold what the local providers share."""
