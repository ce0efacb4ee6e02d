"""CLM's worker engine: the projection heads over the vectors the gateway sends, and the readout.

`Job.vectors` holds each distinct text's vector once, float32 in host byte order (gateway and
worker share a host). Rows are L2-normalised in numpy with upstream's exact float32 operations:
at scale 100 a last-bit difference in the norm shows in the probabilities.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import numpy as np
import torch
from torch import nn

from decidealot.contract import Answer, ScoreQuestion
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.clm.render import option_keys, score_legend
from decidealot.providers.engine.protocol import PassShape, ReportLoad, ignore_load
from decidealot.providers.worker.readout import answer_from_probabilities, first_max, softmax

FLOAT32_BYTES = 4
_NORM_EPS = 1e-12  # upstream's l2: v / (|v| + 1e-12)
MAX_SCALE = 100.0  # upstream caps exp(logit_scale) at 100

_ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU}


class HeadFileError(ValueError):
    """The head file cannot be used; the worker fails to start with this message."""


class HeadConfig(msgspec.Struct, frozen=True):
    """The `cfg` keys the architecture needs; training's extra keys are ignored."""

    width: int
    depth: Annotated[int, msgspec.Meta(ge=2)]
    projection_dim: int = 512
    activation: Literal["gelu", "relu", "silu"] = "gelu"
    layernorm: bool = False
    residual: bool = False
    hidden_size: int = 4096


class Head(nn.Module):
    """hidden -> width -> (depth - 2 blocks of Linear, LayerNorm?, act) -> projection, unit norm."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        blocks = cfg.depth - 2
        self.inp = nn.Linear(cfg.hidden_size, cfg.width)
        self.hidden = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(blocks))
        self.norms = nn.ModuleList(
            nn.LayerNorm(cfg.width) if cfg.layernorm else nn.Identity() for _ in range(blocks)
        )
        self.out = nn.Linear(cfg.width, cfg.projection_dim)
        self.act = _ACTIVATIONS[cfg.activation]()
        self.residual = cfg.residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.inp(x))
        for linear, norm in zip(self.hidden, self.norms, strict=True):
            t = self.act(norm(linear(h)))
            h = h + t if self.residual else t
        return nn.functional.normalize(self.out(h), dim=-1)


@dataclass(frozen=True)
class HeadPair:
    state: Head
    action: Head
    scale: float
    cfg: HeadConfig


def load_heads(path: Path, device: str) -> HeadPair:
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise HeadFileError(
            f"CLM head {path.name} was refused by weights-only loading (it holds objects "
            f"other than tensors and plain values): {exc}"
        ) from exc
    except (OSError, RuntimeError) as exc:
        raise HeadFileError(f"CLM head {path.name} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise HeadFileError(f"CLM head {path.name} is not a checkpoint dict")
    raw = data.get("cfg")
    if not isinstance(raw, dict):
        raise HeadFileError(f"CLM head {path.name} has no cfg dict")
    fields = dict(raw)
    if "projection_dim" in data:  # upstream: a top-level projection_dim wins over cfg's
        fields["projection_dim"] = data["projection_dim"]
    try:
        cfg = msgspec.convert(fields, HeadConfig)
    except msgspec.ValidationError as exc:
        raise HeadFileError(f"CLM head {path.name} has an unusable cfg: {exc}") from exc
    if "logit_scale" not in data:
        raise HeadFileError(f"CLM head {path.name} has no logit_scale")
    logit_scale = torch.as_tensor(data["logit_scale"]).float()
    return HeadPair(
        state=_tower(data, "state_head", cfg, path.name, device),
        action=_tower(data, "action_head", cfg, path.name, device),
        scale=float(logit_scale.exp().clamp(max=MAX_SCALE)),
        cfg=cfg,
    )


def _tower(data: dict[str, object], key: str, cfg: HeadConfig, name: str, device: str) -> Head:
    weights = data.get(key)
    if not isinstance(weights, dict):
        raise HeadFileError(f"CLM head {name} has no {key} state dict")
    tower = Head(cfg)
    try:
        tower.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise HeadFileError(f"CLM head {name}: {key} does not match its cfg: {exc}") from exc
    return tower.eval().to(device)


@dataclass(frozen=True)
class ClmPreparedJob:
    """One job's vectors, checked against its questions. A job is one row of a pass: the heads
    are tiny, and its answers then match upstream's, and its own alone, to the bit."""

    tokens: int  # the distinct vectors it adds to a pass
    group: str  # the checkpoint key
    job: Job
    vectors: torch.Tensor  # unit-length rows, each distinct vector once
    state_rows: torch.Tensor  # per question, its state's row in `vectors`
    option_rows: torch.Tensor  # every question's option rows, question after question
    option_counts: list[int]
    input_tokens = 0  # the head reads vectors; the gateway adds the encoder's prompt tokens

    @property
    def rows(self) -> list[ClmPreparedJob]:
        return [self]


def confidence(probs: Sequence[float]) -> float:
    """Top probability minus the mean of the others, clamped to [0, 1]; 1 for one option."""
    if len(probs) < 2:
        return 1.0
    best = first_max(probs)
    rest = [p for i, p in enumerate(probs) if i != best]
    return max(0.0, min(1.0, probs[best] - sum(rest) / len(rest)))


class ClmEngine:
    shape = PassShape()

    def __init__(self, heads: dict[str, HeadPair], device: str):
        self._heads = heads
        self._device = device

    def prepare(self, job: Job) -> ClmPreparedJob:
        heads = self._heads.get(job.checkpoint)
        if heads is None:
            raise ValueError(f"unknown CLM checkpoint {job.checkpoint!r}")
        counts = [len(option_keys(q)) for q in job.questions.values()]
        width = heads.cfg.hidden_size
        rows, odd = divmod(len(job.vectors), width * FLOAT32_BYTES)
        if odd:
            raise ValueError(
                f"CLM job carries {len(job.vectors)} vector bytes, not whole rows of {width} "
                "float32"
            )
        index = np.asarray(job.vector_index, dtype=np.int64)
        if len(index) != len(counts) + sum(counts) or not ((index >= 0) & (index < rows)).all():
            raise ValueError(
                f"CLM job's vector index has {len(index)} entries for {rows} rows; its "
                f"questions need {len(counts) + sum(counts)} entries within those rows"
            )
        is_state = np.zeros(len(index), dtype=bool)
        is_state[np.cumsum([0, *(count + 1 for count in counts[:-1])])] = True
        raw = np.frombuffer(job.vectors, dtype=np.float32).reshape(rows, width)
        unit = raw / (np.linalg.norm(raw, axis=-1, keepdims=True) + _NORM_EPS)
        return ClmPreparedJob(
            rows,
            job.checkpoint,
            job,
            torch.from_numpy(unit),
            torch.from_numpy(index[is_state]),
            torch.from_numpy(index[~is_state]),
            counts,
        )

    @torch.inference_mode()
    def forward(self, group: Hashable, rows: Sequence[ClmPreparedJob]) -> list[Decision]:
        heads = self._heads[str(group)]
        return [self._decide(heads, prepared) for prepared in rows]

    def finish(self, prepared: ClmPreparedJob, outputs: Sequence[object]) -> Decision:
        (decision,) = outputs
        assert isinstance(decision, Decision)
        return decision

    def _decide(self, heads: HeadPair, prepared: ClmPreparedJob) -> Decision:
        unit = prepared.vectors.to(self._device)
        # each distinct row through its tower once; questions then gather their projections
        state_ids, state_of = torch.unique(prepared.state_rows, return_inverse=True)
        option_ids, option_of = torch.unique(prepared.option_rows, return_inverse=True)
        states = heads.state(unit[state_ids.to(self._device)])
        options = heads.action(unit[option_ids.to(self._device)])
        option_of = option_of.to(self._device)
        temperature = float(prepared.job.config.get("temperature", 1.0))
        answers: dict[str, Answer] = {}
        option_at = 0
        for state_at, ((name, question), count) in enumerate(
            zip(prepared.job.questions.items(), prepared.option_counts, strict=True)
        ):
            cos = options[option_of[option_at : option_at + count]] @ states[state_of[state_at]]
            # float32 like upstream, then a float64 softmax; nothing is rounded. A noul's options
            # are `NOUL_KEYS`, [false, true].
            probs = softmax((heads.scale * cos / temperature).tolist())
            legend = score_legend(question) if isinstance(question, ScoreQuestion) else None
            answers[name] = answer_from_probabilities(
                question, probs, confidence, true_index=1, legend=legend
            )
            option_at += count
        return Decision(model=prepared.group, answers=answers, input_tokens=0)


def create(spec: EngineSpec, report: ReportLoad = ignore_load) -> ClmEngine:
    """Every head, weights-only; one whose input is not the encoder's `options["width"]` fails
    here. A head has no precision to report: it reports no load."""
    width = int(spec.options["width"])
    heads: dict[str, HeadPair] = {}
    for key, path in spec.checkpoints.items():
        pair = load_heads(Path(path), spec.device)
        if pair.cfg.hidden_size != width:
            raise HeadFileError(
                f"CLM head {Path(path).name} expects {pair.cfg.hidden_size}-wide vectors; "
                f"the encoder gives {width}"
            )
        heads[key] = pair
    return ClmEngine(heads, spec.device)
