"""Small random checkpoints of every local model, in the upstream on-disk formats: what the
providers' `tiny` modules share, and the writer of them all.

One code path for the test suite, the benchmarks and `decidealot checkpoints tiny DIR`; the
answers carry no meaning. torch is imported here, so only the CLI, tests and benches do.
"""

from __future__ import annotations

import pkgutil
from pathlib import Path
from typing import Any

from transformers import ModernBertConfig, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from decidealot import registry
from decidealot.registry import Descriptor

MODERNBERT_BASE: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "initializer_range": 0.02,
}
"""ModernBERT-base's encoder shape, for the benchmarks' base-sized checkpoints."""
MODERNBERT_VOCAB_SIZE = 50368
"""ModernBERT's vocabulary size: a base-sized checkpoint's embedding rows (its tokenizer stays
tiny, so only the first few hundred ever occur)."""


def modernbert_config(
    tok: PreTrainedTokenizerFast, shape: dict[str, Any], **extra: Any
) -> ModernBertConfig:
    """The encoder config for `shape`, with the tokenizer's special ids and the 8192 window
    upstream loads; `extra` (a vocabulary size, RoPE parameters) overrides the rest."""
    values: dict[str, Any] = {
        "vocab_size": len(tok),
        **shape,
        "max_position_embeddings": 8192,
        "pad_token_id": tok.pad_token_id,
        "cls_token_id": tok.cls_token_id,
        "sep_token_id": tok.sep_token_id,
        "bos_token_id": tok.cls_token_id,
        "eos_token_id": tok.sep_token_id,
    }
    return ModernBertConfig(**(values | extra))


def write_checkpoints(directory: Path) -> list[tuple[Descriptor, dict[str, Path]]]:
    """Write one random checkpoint per bundle of every registered provider under `directory`:
    each provider with its bundle name -> path."""
    transformers_logging.disable_progress_bar()  # stderr stays for errors
    return [
        (descriptor, pkgutil.resolve_name(descriptor.tiny.writer)(directory))
        for descriptor in registry.registered()
        if descriptor.tiny is not None
    ]
