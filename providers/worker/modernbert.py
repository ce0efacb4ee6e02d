"""ModernBERT's encoder in plain torch, and what Laya's and Von's engines share around it.

transformers' `ModernBertModel` is a hundred lines of arithmetic behind `modeling_utils`, whose
import cost a worker start more than torch itself (docs/performance.md, "Model switches"). This
is that arithmetic, op for op and in order, with its parameter names: upstream's state dicts
load strictly and hidden states equal transformers' (tests/worker/test_modernbert.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from decidealot.config import LONG_STATES
from decidealot.contract import Cut
from decidealot.errors import state_too_long
from decidealot.jobs import CheckpointLoad, EngineSpec
from decidealot.providers.json_files import read_json_object
from decidealot.providers.worker import compiled, int8
from decidealot.providers.worker.bf16 import Lowered, lower_guarded
from decidealot.providers.worker.precision import AUTOCAST, checkpoint_load, engine_precision

FULL = "full_attention"
SLIDING = "sliding_attention"
_DEFAULT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}
_ACTIVATIONS = {"gelu": F.gelu}  # the `ACT2FN` entries a checkpoint may name (gelu: exact erf)


class ModernBertConfigError(ValueError):
    """A `config.json` this encoder cannot run as transformers would."""


@dataclass(frozen=True)
class Config:
    """The `ModernBertConfig` fields the pass reads, with transformers' (base) defaults."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_attention_heads: int = 12
    layer_types: tuple[str, ...] = ()
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    local_attention: int = 128
    rope_theta: tuple[tuple[str, float], ...] = ()  # (layer type, theta) pairs
    hidden_activation: str = "gelu"
    model_type: str = ""

    @property
    def sliding_window(self) -> int:
        """Half the local window: a sliding layer's key is at most this far from its query."""
        return self.local_attention // 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def layer_norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.hidden_size, eps=self.norm_eps, bias=self.norm_bias)

    @classmethod
    def read(cls, path: Path) -> Config:
        """`path` (a `config.json`) as transformers 5 reads it, or transformers 4's RoPE keys."""
        return cls.of(read_json_object(path, ModernBertConfigError))

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Config:
        try:
            layers = int(raw.get("num_hidden_layers", 22))
            every = int(raw.get("global_attn_every_n_layers", 3))
            types = raw.get("layer_types")
            if types is None:
                types = [SLIDING if i % every else FULL for i in range(layers)]
            scalars = {  # every int, float, bool and str field, as transformers casts it
                f.name: _CASTS[f.type](raw.get(f.name, f.default))
                for f in fields(cls)
                if f.type in _CASTS
            }
            config = cls(
                **scalars, layer_types=tuple(str(t) for t in types), rope_theta=_rope_theta(raw)
            )
        except ModernBertConfigError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ModernBertConfigError(
                f"malformed ModernBERT config ({type(exc).__name__})"
            ) from exc
        if config.model_type != "modernbert":
            raise ModernBertConfigError("not a ModernBERT config (model_type)")
        if set(config.layer_types) - {FULL, SLIDING}:
            raise ModernBertConfigError(
                "layer_types may hold only full_attention and sliding_attention"
            )
        if config.hidden_size % config.num_attention_heads:
            raise ModernBertConfigError("hidden_size is not a multiple of num_attention_heads")
        if config.hidden_activation not in _ACTIVATIONS:
            raise ModernBertConfigError(
                f"unsupported hidden_activation {config.hidden_activation!r}"
            )
        return config


_CASTS = {"int": int, "float": float, "bool": bool, "str": str}  # by a field's annotation string


def _rope_theta(raw: Mapping[str, object]) -> tuple[tuple[str, float], ...]:
    """Per layer type: transformers 5's `rope_parameters`, else 4's keys, else ModernBERT's."""
    if raw.get("rope_scaling") is not None:
        raise ModernBertConfigError("rope_scaling is not supported")
    legacy = {FULL: raw.get("global_rope_theta"), SLIDING: raw.get("local_rope_theta")}
    parameters = raw.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise ModernBertConfigError("rope_parameters is not an object")
    thetas = []
    for kind in (FULL, SLIDING):
        own = parameters.get(kind) or {}
        if own.get("rope_type", "default") != "default":
            raise ModernBertConfigError(f"RoPE type {own['rope_type']!r} is not supported")
        theta = own.get("rope_theta", legacy[kind])
        thetas.append((kind, float(_DEFAULT_THETA[kind] if theta is None else theta)))
    return tuple(thetas)


Rope = tuple[torch.Tensor, torch.Tensor]  # a layer type's RoPE cos and sin for a pass


class Output(NamedTuple):  # transformers' `BaseModelOutput`, as far as callers read it
    last_hidden_state: torch.Tensor


def embedding(rows: int, width: int) -> nn.Embedding:
    """An `nn.Embedding` left uninitialised: its own init would import torch._dynamo (seconds)."""
    return nn.Embedding(rows, width, _weight=torch.empty(rows, width))


class Embeddings(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.tok_embeddings = embedding(config.vocab_size, config.hidden_size)
        self.norm = config.layer_norm()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.tok_embeddings(input_ids))


class MLP(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        d, width = config.hidden_size, config.intermediate_size
        self.Wi = nn.Linear(d, 2 * width, bias=config.mlp_bias)
        self.Wo = nn.Linear(width, d, bias=config.mlp_bias)
        self.act = _ACTIVATIONS[config.hidden_activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(hidden).chunk(2, dim=-1)
        return self.Wo(self.act(value) * gate)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: Config) -> None:
        super().__init__()
        d = config.hidden_size
        self.head_dim = config.head_dim
        self.Wqkv = nn.Linear(d, 3 * d, bias=config.attention_bias)
        self.Wo = nn.Linear(d, d, bias=config.attention_bias)

    def forward(self, hidden: torch.Tensor, rope: Rope, mask: torch.Tensor | None) -> torch.Tensor:
        shape = hidden.shape[:-1]
        qkv = self.Wqkv(hidden).view(*shape, 3, -1, self.head_dim)
        # RoPE on queries and keys at once (`[rows, L, 2, heads, dim]`): the same elementwise
        # arithmetic as one by one, in half the ops.
        cos, sin = (part[:, :, None, None, :] for part in rope)
        qk = qkv[..., :2, :, :]
        dtype = qk.dtype
        qk = (qk.float() * cos + _rotate_half(qk.float()) * sin).to(dtype)
        query, key = (part.transpose(1, 2) for part in qk.unbind(dim=-3))
        value = qkv[..., 2, :, :].transpose(1, 2)
        attended = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=self.head_dim**-0.5
        )
        attended = attended.transpose(1, 2).contiguous()
        return self.Wo(attended.reshape(*shape, -1).contiguous())


class Layer(nn.Module):
    def __init__(self, config: Config, index: int) -> None:
        super().__init__()
        self.attention_type = config.layer_types[index]
        self.attn_norm: nn.Module = nn.Identity() if index == 0 else config.layer_norm()
        self.attn = Attention(config)
        self.mlp_norm = config.layer_norm()
        self.mlp = MLP(config)

    def forward(self, hidden: torch.Tensor, rope: Rope, mask: torch.Tensor | None) -> torch.Tensor:
        hidden = hidden + self.attn(self.attn_norm(hidden), rope, mask)
        return hidden + self.mlp(self.mlp_norm(hidden))


class ModernBert(nn.Module):
    """`transformers.ModernBertModel` in eval with sdpa attention: the same parameter names, call
    (a 2-D padding mask, or a dict of 4-D masks per layer type) and `last_hidden_state`."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Layer(config, i) for i in range(len(config.layer_types)))
        self.final_norm = config.layer_norm()
        self.compute_dtype = torch.float32  # bf16 once `lower_guarded` made the linears bf16
        dim = config.head_dim
        for kind, theta in config.rope_theta:
            steps = torch.arange(0, dim, 2, dtype=torch.float, device="cpu")
            self.register_buffer(
                f"{kind}_inv_freq", 1.0 / (theta ** (steps / dim)), persistent=False
            )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | dict[str, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> Output:
        length = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)
        hidden = self.embeddings(input_ids)
        masks = (
            {
                kind: self._lowered(additive(mask, self._attention_dtype(hidden)))
                for kind, mask in attention_mask.items()
            }
            if isinstance(attention_mask, dict)
            else self._masks(attention_mask, length, hidden)
        )
        rope = {
            kind: self._rope(hidden, position_ids, kind) for kind in set(self.config.layer_types)
        }
        for layer in self.layers:
            kind = layer.attention_type
            hidden = layer(hidden, rope[kind], masks[kind])
        return Output(self.final_norm(hidden))

    def _rope(self, hidden: torch.Tensor, position_ids: torch.Tensor, kind: str) -> Rope:
        inv_freq: torch.Tensor = getattr(self, f"{kind}_inv_freq")
        freqs = position_ids[..., None].float() * inv_freq.to(device=hidden.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(hidden.dtype), angles.sin().to(hidden.dtype)

    def _masks(
        self, padding: torch.Tensor | None, length: int, hidden: torch.Tensor
    ) -> dict[str, torch.Tensor | None]:
        """transformers' sdpa masks, made additive once per pass: full layers' `[rows, 1, 1, L]`,
        sliding ones' `[rows, 1, L, L]`, None where nothing is masked. sdpa would convert a bool
        mask on every call, an expanded one an L x L pass more: together a fifth of a small pass."""
        device, dtype = hidden.device, self._attention_dtype(hidden)
        keys = None if padding is None else padding.to(device=device, dtype=torch.bool)
        # compiled: no branch on the data (a graph break); an all-ones mask changes nothing
        unpadded = keys is None or (not torch.compiler.is_compiling() and bool(keys.all()))
        full = None if unpadded else additive(keys[:, None, None, :], dtype)  # type: ignore[index]
        window = self.config.sliding_window
        sliding = None
        if not (unpadded and length < window):
            # |i - j| <= window as a band: a tenth of the time of an int64 L x L difference
            near = torch.ones(length, length, dtype=torch.bool, device=device)
            allowed = near.tril_(window).triu_(-window)[None, None, :, :]
            if keys is not None:
                allowed = allowed & keys[:, None, None, :]
            sliding = additive(allowed, dtype)
        return {FULL: full, SLIDING: sliding}

    def _lowered(self, mask: torch.Tensor | None) -> torch.Tensor | None:
        """A caller's float mask in `compute_dtype`: sdpa takes one only in its queries' dtype."""
        if mask is None or self.compute_dtype == torch.float32:
            return mask
        return mask.to(self.compute_dtype)

    def _attention_dtype(self, hidden: torch.Tensor) -> torch.dtype:
        """The dtype sdpa sees its queries in: autocast's where it is on, else `compute_dtype`."""
        kind = hidden.device.type
        if torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
        return self.compute_dtype


def additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask (True: may attend) as the additive one sdpa would make of it on every call."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf")
    )


def load(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Assign `state`'s tensors to `module`, strictly: they become its parameters, uncopied."""
    module.load_state_dict(state, strict=True, assign=True)


class Precision(NamedTuple):
    amp_dtype: torch.dtype  # a pass's autocast dtype: CUDA's bf16 or fp16, else fp32 (none)
    linears: int8.Quantised
    lowered: Lowered | None  # under bf16 on a CPU: whether bf16 passed the probe


def at_precision(
    encoder: ModernBert,
    precision: str,
    device: torch.device,
    probe: Callable[[], torch.Tensor],
    others: tuple[nn.Module, ...] = (),
) -> Precision:
    """A loaded `encoder` in `precision` (resolved), checked on `probe`: int8 linear layers, or
    bf16 ones on a CPU (`others`' too), where CUDA autocasts. The scorers stay fp32."""
    cpu_bf16 = precision == "bf16" and device.type == "cpu"
    return Precision(
        torch.float32 if cpu_bf16 else AUTOCAST.get(precision, torch.float32),
        int8.quantize_guarded(encoder, probe) if precision == "int8" else int8.unquantised(encoder),
        lower_guarded(encoder, probe, others) if cpu_bf16 else None,
    )


def probe_rows(
    config: Config, length: int = int8.PROBE_LENGTH
) -> tuple[torch.Tensor, torch.Tensor]:
    """A probe's input: random ids (seeded: every load decides alike), four marker positions."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (int8.PROBE_ROWS, length), generator=generator)
    return ids, torch.linspace(1, length - 2, 4).long()


def warm_up_rows(config: Config, length: int) -> list[list[tuple[list[int], list[int]]]]:
    """The compile's warm-up passes (`compiled`), as (ids, marker positions) per row: the
    probe's rows cut ragged, then one row alone (torch specialises a size of 1). Four markers
    each; rows, markers and lengths all differ, so no two dimensions share one symbol."""
    ids, _ = probe_rows(config, length)
    markers = torch.linspace(1, length - len(ids) - 3, 4).long().tolist()
    ragged = [(ids[i, : length - i].tolist(), markers) for i in range(len(ids))]
    return [ragged, [(ids[0, : length - len(ids) - 1].tolist(), markers)]]


def autocast(device: torch.device, dtype: torch.dtype) -> AbstractContextManager[object]:
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class AtPrecision(compiled.Compilable, Protocol):
    """What `Checkpoints` reports of a loaded model (Laya's `Checkpoint`, a `VonModel`), which
    its compile thread may compile."""

    linears: int8.Quantised
    lowered: Lowered | None


M = TypeVar("M", bound=AtPrecision)


class Checkpoints(Generic[M]):
    """A Laya or Von engine's checkpoints by key, each loaded once, by `spec.preload` or the
    first thread to ask, and reported; and the options both engines read."""

    def __init__(
        self,
        engine: str,
        spec: EngineSpec,
        report: Callable[[CheckpointLoad], None],
        load: Callable[[str, torch.device, str, str | None], M],
        *,
        keys: Sequence[str],
        on_cuda: str,
    ) -> None:
        calibrations = spec.options.get("calibrations", {})
        if not isinstance(calibrations, dict) or not all(
            key in keys and isinstance(path, str) for key, path in calibrations.items()
        ):
            raise ValueError(
                f"{engine} engine option calibrations must map checkpoint keys {list(keys)} "
                "to files"
            )
        self.long_states = spec.options.get("long_states", "cut")
        if self.long_states not in LONG_STATES:
            raise ValueError(f"{engine} engine option long_states must be one of {LONG_STATES}")
        self.device = torch.device(spec.device)
        self._engine, self._report, self._load = engine, report, load
        self._paths, self._calibrations = dict(spec.checkpoints), calibrations
        # `on_cuda`: what `auto` means on a GPU, the precision the engine's upstream runs there
        self._precision = engine_precision(spec.options, spec.device, on_cuda=on_cuda)
        self._loaded: dict[str, M] = {}
        self._lock = threading.Lock()
        # the gateway passes `DECIDEALOT_COMPILE`; an engine built by a tool compiles nothing
        self._compile = str(spec.options.get("compile", "off"))
        if self._compile not in compiled.MODES:
            raise ValueError(f"{engine} engine option compile must be one of {compiled.MODES}")
        cache = spec.options.get("compile_cache")
        self._compile_cache = cache if isinstance(cache, str) else None
        self._loads: dict[str, CheckpointLoad] = {}
        self._to_compile: list[str] = []  # loaded keys whose pass waits for the compile thread
        for key in spec.preload:
            self(key)

    def __call__(self, key: str) -> M:
        loaded = self._loaded.get(key)
        if loaded is not None:
            return loaded
        if key not in self._paths:
            raise ValueError(f"{self._engine} checkpoint {key!r} is not configured")
        with self._lock:
            if key not in self._loaded:
                path, calibration = self._paths[key], self._calibrations.get(key)
                loaded = self._load(path, self.device, self._precision.precision, calibration)
                load = checkpoint_load(key, path, self._precision, loaded.linears, loaded.lowered)
                plan = compiled.planned(self._compile, load.precision)
                self._loads[key] = load = compiled.with_outcome(load, plan)
                self._report(load)
                if plan.state == "compiling":
                    self._to_compile.append(key)
                self._loaded[key] = loaded
            return self._loaded[key]

    def compile_next(self) -> bool:
        """Compile one loaded checkpoint's pass that waits for it, swap it in if it passes
        its check, and report the load again; False when none waits (the core's compile
        thread calls this, never a request)."""
        with self._lock:
            if not self._to_compile:
                return False
            key = self._to_compile.pop(0)
            model, load = self._loaded[key], self._loads[key]
        root, device = self._compile_cache, self.device.type
        cache = None if root is None else compiled.cache_folder(root, load.path, device)
        outcome = compiled.compile_passes(model, cache, device)
        with self._lock:
            self._loads[key] = load = compiled.with_outcome(load, outcome)
        self._report(load)
        return True

    def refuse_cuts(self, cuts: Sequence[Cut], reads: str) -> None:
        """Under `long_states=refuse`, the 422 for the question whose state was cut most."""
        if cuts and self.long_states == "refuse":
            tightest = min(cuts, key=lambda cut: cut.read)
            raise state_too_long(tightest.total, tightest.question, tightest.read, reads)
