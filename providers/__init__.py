"""Decision providers, one folder each: Laya, Von, CLM (local, in worker processes), Jev (hosted).

A provider folder's layout (`descriptor`, `gateway/`, `worker/`, `tiny`) is in
docs/architecture.md. `gateway/` and `worker/` here hold what the local providers share: the
worker process client and the worker's host.
"""
