"""Decision providers, one folder each; `gateway/` and `worker/` hold what local ones share."""
