"""Laya: three ModernBERT-family decision checkpoints with per-request checkpoint routing."""

CHECKPOINTS = ("english", "multilingual", "typed-decisions")
"""The worker's checkpoint keys; each is bundle `laya-<key>`, replaced by its setting."""
