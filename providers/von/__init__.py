"""Von: the option-marker decision model (ModernBERT), served locally in a worker process."""
