"""Small random checkpoints of every local model in the upstream on-disk formats (answers carry
no meaning) for the tests, the benchmarks and `decidealot checkpoints tiny DIR`, who alone import
this module (it imports torch): what the providers' `tiny` modules share, and their writer.
"""

from __future__ import annotations

import json
import pkgutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import ModernBertConfig, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from decidealot import registry
from decidealot.registry import Descriptor

MODERNBERT_BASE: dict[str, Any] = {  # ModernBERT-base's encoder shape, for base-sized benches
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "initializer_range": 0.02,
}
BERT_ROLES = {f"{name}_token": f"[{name.upper()}]" for name in ("unk", "cls", "sep", "pad", "mask")}
MODERNBERT_VOCAB_SIZE = 50368  # a base-sized checkpoint's rows (its tiny tokenizer uses few)


def modernbert_config(
    tok: PreTrainedTokenizerFast, shape: dict[str, Any], **extra: Any
) -> ModernBertConfig:
    """The encoder config for `shape`, the tokenizer's special ids and upstream's 8192 window."""
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


def bpe_tokenizer(
    out: Path,
    corpus: Sequence[str],
    roles: dict[str, str],
    vocab_size: int,
    *,
    finish: Callable[[Tokenizer], None] = lambda backend: None,
    drop: Sequence[str] = (),
    **options: Any,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any UTF-8 text, no unknown tokens) with `roles`' special
    tokens, saved to `out`; `drop`: keys its `tokenizer_config.json` leaves out."""
    backend = Tokenizer(models.BPE(unk_token=roles["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(dict.fromkeys(roles.values())),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    finish(backend)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **roles, **options)
    tok.save_pretrained(str(out))
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in drop:
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2))
    return tok


def write_checkpoints(directory: Path) -> list[tuple[Descriptor, dict[str, Path]]]:
    """One random checkpoint per bundle of every registered provider, under `directory`."""
    transformers_logging.disable_progress_bar()  # stderr stays for errors
    return [
        (descriptor, pkgutil.resolve_name(descriptor.tiny.writer)(directory))
        for descriptor in registry.registered()
        if descriptor.tiny is not None
    ]
