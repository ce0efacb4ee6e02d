"""Von: the option-marker decision model (ModernBERT), served locally in a worker process.

Its gateway side is the shared `CheckpointProvider` on its one checkpoint; `worker/` (`engine`
with `model`, `render` and `readout`) runs in the worker.
"""
