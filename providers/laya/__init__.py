"""Laya: three ModernBERT-family decision checkpoints with per-request checkpoint routing.

Gateway-side modules (`provider`, `router`, `lang`, `render`, `readout`) never import torch;
`model` and `engine` run only in the worker subprocess.
"""
