"""Von: the option-marker decision model (ModernBERT), served locally in a worker process.

`provider` is the gateway side and imports no torch; `engine` (with `model`, `render` and
`readout`) runs in the worker.
"""
