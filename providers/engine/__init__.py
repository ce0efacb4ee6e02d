"""The seam between the gateway and a worker process, in four roles: `protocol`, `client`
(gateway), `proc` and `core` (worker); `inprocess` runs a worker's loop in a thread, for tests
and benches. docs/architecture.md, "The seam", says what each holds.
"""
