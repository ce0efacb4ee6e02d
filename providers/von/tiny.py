"""Tiny random Von checkpoints in upstream's on-disk format (von.md §6), both attention modes.

The result loads with the unmodified von-sdk 1.3.7 backend (`VON_CHECKPOINT_DIR=<dir>`) and with
our engine, offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Tokenizer
from tokenizers.processors import TemplateProcessing
from transformers import ModernBertModel

from decidealot.providers import tiny as shared
from decidealot.providers.von.worker.model import OptionMarkerScorer

_CORPUS = [
    "The customer requests a refund for a duplicate payment of 1250 dollars.",
    "Which department should handle this? billing technical sales support",
    "Routine, answer in the normal queue. Important, answer soon. Urgent, interrupt.",
    "Yes, condition holds true. No, condition is false.",
    '{"operation": "delete", "resource": "protected-record", "reversible": false}',
    "summary: A request changes access for an account that holds protected records.",
    "The invoice dated 2026-09-22 lists 3 items at 19.99 each; order 84213 shipped.",
]

HIDDEN = 32
LOCAL_ATTENTION = 16

SIZES = ("tiny", "long", "small", "base")
_TINY_SHAPE = {
    "hidden_size": HIDDEN,
    "intermediate_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "global_attn_every_n_layers": 3,
    "local_attention": LOCAL_ATTENTION,
    "initializer_range": 0.1,  # with the scorer's gain: probabilities spread, rarely saturate
}
_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": _TINY_SHAPE,
    "long": {
        **_TINY_SHAPE,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "global_attn_every_n_layers": 1,
    },
    "small": {
        "hidden_size": 384,
        "intermediate_size": 576,
        "num_hidden_layers": 6,
        "num_attention_heads": 6,
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
        "initializer_range": 0.02,
    },
    "base": {**shared.MODERNBERT_BASE, "vocab_size": shared.MODERNBERT_VOCAB_SIZE},
}
"""`tiny` (tests) has a full and two sliding layers, both mask kinds; `long` is it cut to one global
layer and one head, for states past the 8192-token window, where a pass costs what its masks
cost; `small` (7.7M parameters, ModernBERT's layer pattern) is for benchmarks; `base`, with
ModernBERT-base's shape and vocabulary (a tiny tokenizer), times a load (bench/switch.py)."""

DEFAULT_CALIBRATION_MAP: dict[str, float] = {
    "bias": 1.2,
    "entropy": 0.5,
    "log_tokens": 0.3,
    "n_options": 0.1,
    "lo": 0.5,
    "hi": 12.0,
}
DEFAULT_NOUL_PRIOR: dict[str, float] = {"a": 0.6, "b": 0.05}


def _mask_and_template(backend: Tokenizer) -> None:
    """`[MASK]` absorbs the space before it; rows are `[CLS] ... [SEP]`, as Von's tokenizer."""
    backend.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def build_von_checkpoint(
    path: Path,
    *,
    independent_options: bool,
    seed: int = 0,
    digit_split: bool = True,
    calibration_map: dict[str, float] | None = DEFAULT_CALIBRATION_MAP,
    noul_prior: dict[str, float] | None = DEFAULT_NOUL_PRIOR,
    temperature: float = 1.0,
    size: str = "tiny",
) -> Path:
    """A random Von checkpoint of `size` written to `path`; without a `calibration_map` and a
    `noul_prior` the scalar `temperature` and the 0.7 debias coefficient apply."""
    if size not in SIZES:
        raise ValueError(f"unknown Von checkpoint size {size!r}; expected one of {SIZES}")
    path.mkdir(parents=True, exist_ok=True)
    tok = shared.bpe_tokenizer(
        path, _CORPUS, shared.BERT_ROLES, 300, finish=_mask_and_template, model_max_length=8192
    )
    config = shared.modernbert_config(tok, _SHAPES[size])
    torch.manual_seed(seed)
    encoder = ModernBertModel(config)
    encoder.save_pretrained(str(path))
    scorer = OptionMarkerScorer(config.hidden_size)
    parts = {"encoder": encoder.state_dict(), "scorer": scorer.state_dict()}
    weights = {f"{part}.{k}": v.detach().clone() for part, d in parts.items() for k, v in d.items()}
    # An untouched random head gives p ≈ 1/K; a large output gain makes probabilities differ.
    weights["scorer.out_proj.weight"] *= 100.0
    torch.save(weights, path / "option_marker.pt")
    calibration: dict[str, object] = {
        "temperature": temperature,
        "independent_options": independent_options,
        "digit_split": digit_split,
    }
    if calibration_map is not None:
        calibration["calibration_map"] = dict(calibration_map)
    if noul_prior is not None:
        calibration["noul_zero_shot_prior"] = dict(noul_prior)
    (path / "marker_calibration.json").write_text(json.dumps(calibration, indent=2))
    return path


def write_bundles(root: Path) -> dict[str, Path]:
    """The `von-1.1` bundle at random, in the mode and scalar temperature the bundle ships."""
    path = build_von_checkpoint(
        root / "von-1.1",
        independent_options=False,
        digit_split=False,
        calibration_map=None,
        noul_prior=None,
        temperature=2.2,
    )
    return {"von-1.1": path}
