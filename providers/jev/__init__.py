"""Jev: TypeSafe's hosted System One API, passed through; it runs in the gateway only.

Jev takes no residency slot and no lane: `gateway/client` talks to the operator's fixed
TypeSafe URL with the operator's key, `catalog` caches TypeSafe's model list, `wire` builds
TypeSafe's request and checks its answers, and `provider` joins them behind
`decidealot.protocols.HostedProvider`.
"""
