"""The Laya worker engine: jobs -> encoder rows -> shared padded forward passes -> answers.

`prepare` tokenises one job (its state once, one row per question) on the worker's preparing
thread; the worker's planner packs rows of concurrent jobs into passes cut by `shape`;
`forward` runs one padded pass; `finish` reads a job's answers out of its rows' logits. Rows
never see each other (padding is masked), so a job's answers do not depend on what it shared
passes with.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from decidealot.contract import Question
from decidealot.jobs import Decision, EngineSpec, Job, PassShape
from decidealot.providers.laya.worker import readout
from decidealot.providers.laya.worker.model import PASS_INPUTS, Checkpoint, load_checkpoint
from decidealot.providers.laya.worker.render import LayaRow, render_rows
from decidealot.providers.worker.precision import CheckpointLoad, LoadReports, engine_precision

CHECKPOINT_KEYS = ("english", "multilingual", "typed-decisions")
PASS_TOKEN_LIMIT = 262_144
"""Padded tokens (rows x longest row) above which a turn is cut into several passes."""
CPU_PASS_COST = 64
"""A pass's fixed cost on CPU in tokens' worth of compute (measured on the tiny test checkpoint;
less on larger models). A CPU pass costs the same per padded token at any batch size, so padding
is pure waste there: a turn is cut wherever that saves more padding than this."""


@dataclass(frozen=True, slots=True)
class LayaPreparedJob:
    """A job's rendered rows plus what readout needs; its checkpoint, looked up once in
    `prepare`, is its rows' group, so `forward` and `finish` have it at hand."""

    group: Checkpoint
    key: str
    """The checkpoint's key (`english`, ...), which names the answering model."""
    input_tokens: int
    questions: dict[str, Question]
    rows: list[LayaRow]


class LayaEngine:
    """Serves the three Laya checkpoints; each loads once, at create or on its first job.
    `prepare` and `forward` may be called from several threads at once."""

    def __init__(self, spec: EngineSpec):
        unknown = set(spec.checkpoints) - set(CHECKPOINT_KEYS)
        if unknown:
            raise ValueError(f"unknown Laya checkpoint keys: {sorted(unknown)}")
        self._paths = dict(spec.checkpoints)
        self._calibrations = calibrations(spec, CHECKPOINT_KEYS)
        self._device = torch.device(spec.device)
        self._precision = engine_precision(spec.options, spec.device)
        # On CUDA a pass is worth a large batch: cut only past the token limit.
        cpu = self._device.type == "cpu"
        self.shape = PassShape(PASS_TOKEN_LIMIT, CPU_PASS_COST if cpu else None)
        self._loaded: dict[str, Checkpoint] = {}
        self._load_lock = threading.Lock()
        self._reports = LoadReports()
        for key in spec.preload:
            self._checkpoint(key)

    @property
    def loaded(self) -> tuple[str, ...]:
        """Keys of the checkpoints in memory, in load order."""
        return tuple(self._loaded)

    def _checkpoint(self, key: str) -> Checkpoint:
        loaded = self._loaded.get(key)
        if loaded is not None:
            return loaded
        if key not in self._paths:
            raise ValueError(f"Laya checkpoint {key!r} is not configured")
        with self._load_lock:
            if key not in self._loaded:
                path = self._paths[key]
                loaded = load_checkpoint(
                    path, self._device, self._precision, self._calibrations.get(key)
                )
                self._reports.add(key, path, self._precision, loaded.linears)
                self._loaded[key] = loaded
            return self._loaded[key]

    def take_loaded(self) -> list[CheckpointLoad]:
        """The checkpoints loaded since the last call (`scheduler.ReportsLoads`)."""
        return self._reports.take()

    def prepare(self, job: Job) -> LayaPreparedJob:
        checkpoint = self._checkpoint(job.checkpoint)
        tokenizer = checkpoint.tokenizer

        def encode(texts: Sequence[str]) -> list[list[int]]:
            return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

        rows = render_rows(
            job.state,
            job.questions,
            encode,
            checkpoint.specials,
            checkpoint.budget,
            checkpoint.texts,
        )
        tokens = sum(len(row.ids) for row in rows)
        return LayaPreparedJob(checkpoint, job.checkpoint, tokens, job.questions, rows)

    def forward(self, group: Hashable, rows: Sequence[LayaRow]) -> list[list[float]]:
        return self._forward(cast(Checkpoint, group), rows)

    def finish(self, prepared: LayaPreparedJob, outputs: Sequence[object]) -> Decision:
        temperatures = prepared.group.temperatures
        answers = {
            name: readout.answer(question, outputs[i], temperatures)  # type: ignore[arg-type]
            for i, (name, question) in enumerate(prepared.questions.items())
        }
        return Decision(f"laya-{prepared.key}", answers, prepared.input_tokens)

    def _forward(self, checkpoint: Checkpoint, rows: Sequence[LayaRow]) -> list[list[float]]:
        """One padded pass; returns each row's logits trimmed to its own option count."""
        inputs = pass_inputs(rows, checkpoint.pad_id)
        out = checkpoint.forward({name: t.to(self._device) for name, t in inputs.items()})
        values = out.cpu().tolist()
        return [values[i][: len(row.markers)] for i, row in enumerate(rows)]


def pass_inputs(rows: Sequence[LayaRow], pad_id: int) -> dict[str, torch.Tensor]:
    """`rows` padded on the right into one pass's `PASS_INPUTS` tensors, on the CPU: each
    built from Python lists in one call (a tensor per row and a copy into the pass cost more
    than the lists)."""
    length = max(len(row.ids) for row in rows)
    width = max(len(row.markers) for row in rows)
    input_ids = torch.tensor([[*row.ids, *[pad_id] * (length - len(row.ids))] for row in rows])
    marker_pos = torch.tensor([[*row.markers, *[0] * (width - len(row.markers))] for row in rows])
    filled = torch.arange(length)[None, :] < torch.tensor([len(row.ids) for row in rows])[:, None]
    attention = filled.long()
    marker_mask = (
        torch.arange(width)[None, :] < torch.tensor([len(r.markers) for r in rows])[:, None]
    )
    qtype = torch.tensor([row.qtype for row in rows], dtype=torch.long)
    tensors = (input_ids, attention, marker_pos, marker_mask, qtype)
    return dict(zip(PASS_INPUTS, tensors, strict=True))


def calibrations(spec: EngineSpec, keys: Sequence[str]) -> dict[str, str]:
    """`spec.options["calibrations"]`: checkpoint key -> the calibration file that replaces
    its own temperatures (the descriptor's calibration settings)."""
    given = spec.options.get("calibrations", {})
    if not isinstance(given, dict) or not all(
        key in keys and isinstance(path, str) for key, path in given.items()
    ):
        raise ValueError(f"calibrations must map checkpoint keys {list(keys)} to file paths")
    return dict(given)


def create(spec: EngineSpec) -> LayaEngine:
    """The engine factory `EngineSpec.factory` names (`process.build_engine` has applied the
    torch threads)."""
    return LayaEngine(spec)
