"""What the tiny Laya and Von builders share: a ModernBERT config sized to a tiny tokenizer."""

from __future__ import annotations

from typing import Any

from transformers import ModernBertConfig, PreTrainedTokenizerFast


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
