"""Laya: three ModernBERT-family decision checkpoints with per-request checkpoint routing.

`gateway/` routes a request to a checkpoint (`router`, `lang`), without torch; `worker/` renders
its rows, runs the model and reads the answers out (`engine`, `model`, `render`, `readout`).
"""

CHECKPOINTS = ("english", "multilingual", "typed-decisions")
"""The worker's checkpoint keys; each is bundle `laya-<key>`, replaced by its setting."""
