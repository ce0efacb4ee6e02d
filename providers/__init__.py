"""Decision providers, one folder each: Laya, Von, CLM (local, in worker processes), Jev (hosted).

In a provider's folder, `descriptor` is what the service knows of it (registered in the
`decidealot.providers` entry-point group), `gateway/` runs in the gateway process (never torch),
`worker/` runs in its worker process, `tiny` writes random checkpoints (CLI and tests), and a
module at the folder's root is read by both processes. `gateway/` and `worker/` here hold what
the local providers share: the worker process client and the worker's host.
"""
