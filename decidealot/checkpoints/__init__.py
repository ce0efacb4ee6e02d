"""Where local checkpoints come from: bundle manifests, download, verification, install."""
