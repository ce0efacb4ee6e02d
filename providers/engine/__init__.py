"""The seam between the gateway and a worker process, in four roles (vLLM's engine triad):

- `protocol`: what a worker hosts (the `Engine` protocol) and the messages both sides exchange;
- `client` (gateway): `WorkerClient`, the one handle on a worker process, and `ProcessRuntime`,
  the local runtime residency loads and unloads over such clients;
- `proc` (worker process): the loop around the core, its pipes and its exit;
- `core` (worker process): `EngineCore`, the prepare and compute threads and the `planner`, with
  no I/O, so tests drive it in their own process.

`inprocess` is a worker's loop in a thread of the calling process, for tests and benches.
"""
