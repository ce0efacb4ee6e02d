"""Tiny random Laya checkpoints in upstream's on-disk format (laya.md §8), for all variants.

The result loads with both `laya.load(path, device="cpu")` and our engine, offline; weights are
drawn with a wide initialiser so option probabilities differ measurably.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import ModernBertConfig, ModernBertModel

from decidealot.providers import tiny as shared
from decidealot.providers.laya import CHECKPOINTS as VARIANTS

_CORPUS = [
    "The customer requests a refund for a duplicate payment.",
    "choice question: Which department should handle this? billing technical sales",
    "score question: level 0: routine level 1: important level 2: urgent",
    "noul question: false: no, the statement does not hold true: yes, the statement holds",
    '{"operation": "delete", "resource": "protected-record", "reversible": false}',
    "Mein Konto wurde zweimal belastet, bitte helfen Sie mir.",
    "Je voudrais annuler ma commande, merci beaucoup.",
    "Мой заказ не пришёл вовремя. 我的订单没有到。 注文が届きません。 주문이 도착하지 않았습니다.",
    "طلبي لم يصل. मेरा ऑर्डर नहीं आया। ההזמנה שלי לא הגיעה. Η παραγγελία μου δεν έφτασε.",
]

# Per variant: special tokens by role (in id order, the first of each), RoPE thetas (full,
# sliding), budgets and the shipped temperatures (laya.md §1.3, out-of-range `choice:11+` too).
_SHIPPED_BY_OPTIONS = {
    "choice:2": 1.9063563346862793,
    "choice:3-5": 1.7601518630981445,
    "choice:6-10": 1.0000158548355103,
    "choice:11+": 0.10058280825614929,
    "score:3-5": 1.2514300346374512,
    "noul:2": 1.983399510383606,
}
_GEMMA_ROLES = {f"{name}_token": f"<{name}>" for name in ("pad", "eos", "bos", "unk", "mask")} | {
    "cls_token": "<bos>",
    "sep_token": "<eos>",
}
_ENGLISH = {
    "roles": shared.BERT_ROLES,
    "rope": (160000.0, 10000.0),
    "encoder": "answerdotai/ModernBERT-large",
    "model_name": "rl-agent",
    "max_len": 128,
    "head_max_len": 48,
    "temperature": [1.6369030475616455, 1.2514300346374512, 1.983399510383606],
    "temperature_by_options": _SHIPPED_BY_OPTIONS,
}
_VARIANT: dict[str, dict[str, Any]] = {
    "english": _ENGLISH,
    "multilingual": {
        **_ENGLISH,
        "roles": _GEMMA_ROLES,
        "rope": (160000.0, 160000.0),
        "encoder": "jhu-clsp/mmBERT-base",
        "max_len": 160,
        "head_max_len": 64,
        "temperature": [1.0, 1.0, 1.0],
        "temperature_by_options": {},
    },
    "typed-decisions": {
        **_ENGLISH,
        "model_name": "laya-typed-decisions",
        "max_len": 160,
        "head_max_len": 64,
        "temperature": [1.0148024559020996, 1.0374259948730469, 1.0575125217437744],
    },
}

HIDDEN = 64
HEAD_LAYERS = 2
N_ACT = 2

SIZES = ("tiny", "tiny512", "base")
"""`tiny512`: `tiny` with a third layer and english's budgets (512 / 192), for benches at real
row lengths; `base`: ModernBERT-base's shape and embedding rows (a real model's compute)."""
_TINY_SHAPE = {
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "global_attn_every_n_layers": 2,
    "local_attention": 32,
    "initializer_range": 0.5,
}
_SHAPES = {"tiny": _TINY_SHAPE, "tiny512": {**_TINY_SHAPE, "num_hidden_layers": 3}}
BASE_BUDGET = {"max_len": 512, "head_max_len": 192}


def _random_weights(config: ModernBertConfig) -> dict[str, torch.Tensor]:
    d = config.hidden_size
    weights = {"encoder." + k: v for k, v in ModernBertModel(config).state_dict().items()}
    for j in range(HEAD_LAYERS):
        layer = torch.nn.TransformerEncoderLayer(
            d, max(1, d // 64), 4 * d, 0.1, batch_first=True, norm_first=True
        )
        weights.update({f"head.layers.{j}.{k}": v for k, v in layer.state_dict().items()})
    weights["type_emb.weight"] = torch.randn(3, d)
    scorer = torch.nn.Sequential(
        torch.nn.LayerNorm(d), torch.nn.Linear(d, d), torch.nn.GELU(), torch.nn.Linear(d, 1)
    )
    weights.update({"scorer." + k: v for k, v in scorer.state_dict().items()})
    act_head = torch.nn.Sequential(
        torch.nn.Linear(d + 4, 256), torch.nn.GELU(), torch.nn.Linear(256, N_ACT)
    )
    weights.update({"act_head." + k: v for k, v in act_head.state_dict().items()})
    weights["temperature"] = torch.ones(3)
    # Spread the head's LayerNorm gains and the scorer's output so option probabilities differ
    # clearly (near-uniform answers would make parity tests weak).
    for name, value in weights.items():
        if name.startswith(("head.", "scorer.")) and name.endswith("weight") and value.dim() == 1:
            weights[name] = 1.0 + 0.5 * torch.randn_like(value)
    weights["scorer.3.weight"] = weights["scorer.3.weight"] * 8.0
    return weights


def build_laya_checkpoint(
    path: Path,
    variant: str,
    *,
    seed: int = 0,
    size: str = "tiny",
    shape: Mapping[str, Any] | None = None,
    budget: Mapping[str, int] | None = None,
) -> Path:
    """A random `variant` checkpoint of `size` (`base`: about 330 MB) written to `path`; `shape`
    and `budget` override entries of the size's encoder shape and row budgets."""
    if variant not in _VARIANT:
        raise ValueError(f"unknown Laya variant {variant!r}; expected one of {VARIANTS}")
    if size not in SIZES:
        raise ValueError(f"unknown Laya checkpoint size {size!r}; expected one of {SIZES}")
    spec = _VARIANT[variant] | (BASE_BUDGET if size != "tiny" else {}) | dict(budget or {})
    path.mkdir(parents=True, exist_ok=True)
    tok = shared.bpe_tokenizer(
        path / "tokenizer", _CORPUS, spec["roles"], 400, drop=("backend", "is_local")
    )
    full, sliding = spec["rope"]
    config = shared.modernbert_config(
        tok,
        {**_SHAPES.get(size, shared.MODERNBERT_BASE), **(shape or {})},
        vocab_size=shared.MODERNBERT_VOCAB_SIZE if size == "base" else len(tok),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": full},
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding},
        },
    )
    config.save_pretrained(str(path / "encoder"))
    torch.manual_seed(seed)
    weights = _random_weights(config)
    save_file(
        {k: v.detach().half().contiguous() for k, v in weights.items()},
        str(path / "model.safetensors"),
    )
    rl_config = {
        "encoder": spec["encoder"],
        "model_name": spec["model_name"],
        "head_layers": HEAD_LAYERS,
        "act_costs": {"escalate": 0.5},
        "max_len": spec["max_len"],
        "head_max_len": spec["head_max_len"],
        "temperature": spec["temperature"],
        "temperature_by_options": spec["temperature_by_options"],
        "amp_dtype": "bf16",
        "max_prefixes": 6,
        "cost_wrong_act": 3.0,
    }
    (path / "rl_agent_config.json").write_text(json.dumps(rl_config, indent=2))
    return path


def write_bundles(root: Path) -> dict[str, Path]:
    return {f"laya-{key}": build_laya_checkpoint(root / f"laya-{key}", key) for key in VARIANTS}
