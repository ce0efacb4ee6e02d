"""Laya: three ModernBERT-family decision checkpoints with per-request checkpoint routing."""

CHECKPOINTS = ("english", "multilingual", "typed-decisions")  # bundle `laya-<key>` each
