"""The Laya worker engine: jobs -> encoder rows -> shared padded forward passes -> answers.

`prepare` tokenises one job (its state once, one row per question) on the worker's preparing
thread; `run` sorts the rows of every job in a batch by length, packs them into padded passes
(see `_passes`) and splits the answers back per job. Rows never see each other (padding is
masked), so a job's answers do not depend on what it was batched with.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decidealot.contract import Question
from providers.engine import Decision, EngineSpec, Job
from providers.laya import readout
from providers.laya.model import PASS_INPUTS, Checkpoint, load_checkpoint
from providers.laya.render import Row, render_rows
from providers.precision import engine_precision

CHECKPOINT_KEYS = ("english", "multilingual", "typed-decisions")
PASS_TOKEN_LIMIT = 262_144
"""Padded tokens (rows x longest row) above which a batch is split into several passes."""
CPU_PASS_COST = 64
"""A pass's fixed cost on CPU in tokens' worth of compute (measured on the tiny test checkpoint;
less on larger models). A CPU pass costs the same per padded token at any batch size, so padding
is pure waste there: a batch is split wherever that saves more padding than this."""


@dataclass(frozen=True, slots=True)
class PreparedJob:
    """A job's rendered rows plus what readout needs; `cost` is its padded token count."""

    group: str
    cost: int
    questions: dict[str, Question]
    rows: list[Row]


class LayaEngine:
    """Serves the three Laya checkpoints; each loads once, at create or on its first job.
    `prepare` and `run` may be called from several threads at once."""

    def __init__(self, spec: EngineSpec):
        unknown = set(spec.checkpoints) - set(CHECKPOINT_KEYS)
        if unknown:
            raise ValueError(f"unknown Laya checkpoint keys: {sorted(unknown)}")
        self._paths = dict(spec.checkpoints)
        self._device = torch.device(spec.device)
        self._precision = engine_precision(spec.options, spec.device)
        self._loaded: dict[str, Checkpoint] = {}
        self._load_lock = threading.Lock()
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
                self._loaded[key] = load_checkpoint(self._paths[key], self._device, self._precision)
            return self._loaded[key]

    def prepare(self, job: Job) -> PreparedJob:
        checkpoint = self._checkpoint(job.checkpoint)
        tokenizer = checkpoint.tokenizer

        def encode(texts: Sequence[str]) -> list[list[int]]:
            return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

        rows = render_rows(job.state, job.questions, encode, checkpoint.specials, checkpoint.budget)
        cost = len(rows) * max((len(row.ids) for row in rows), default=0)
        return PreparedJob(group=job.checkpoint, cost=cost, questions=job.questions, rows=rows)

    def run(self, batch: Sequence[PreparedJob]) -> list[Decision]:
        if not batch:
            return []
        groups = {job.group for job in batch}
        if len(groups) != 1:
            raise ValueError("a Laya batch must hold jobs of one checkpoint")
        key = groups.pop()
        checkpoint = self._checkpoint(key)
        rows = [row for job in batch for row in job.rows]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids))
        by_length = [rows[i] for i in order]
        # On CUDA a pass is worth a large batch: split only past the token limit.
        pass_cost = CPU_PASS_COST if self._device.type == "cpu" else PASS_TOKEN_LIMIT
        logits: list[list[float]] = [[] for _ in rows]
        for start, stop in _passes(by_length, pass_cost):
            computed = self._forward(checkpoint, by_length[start:stop])
            for i, values in zip(order[start:stop], computed, strict=True):
                logits[i] = values
        decisions: list[Decision] = []
        offset = 0
        for job in batch:
            answers = {
                name: readout.answer(question, logits[offset + i], checkpoint.temperatures)
                for i, (name, question) in enumerate(job.questions.items())
            }
            offset += len(job.rows)
            decisions.append(
                Decision(
                    model=f"laya-{key}",
                    answers=answers,
                    input_tokens=sum(len(row.ids) for row in job.rows),
                )
            )
        return decisions

    def _forward(self, checkpoint: Checkpoint, rows: Sequence[Row]) -> list[list[float]]:
        """One padded pass; returns each row's logits trimmed to its own option count."""
        length = max(len(row.ids) for row in rows)
        width = max(len(row.markers) for row in rows)
        input_ids = torch.full((len(rows), length), checkpoint.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        marker_pos = torch.zeros((len(rows), width), dtype=torch.long)
        marker_mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, row in enumerate(rows):
            input_ids[i, : len(row.ids)] = torch.tensor(row.ids)
            attention[i, : len(row.ids)] = 1
            marker_pos[i, : len(row.markers)] = torch.tensor(row.markers)
            marker_mask[i, : len(row.markers)] = True
        qtype = torch.tensor([row.qtype for row in rows], dtype=torch.long)
        tensors = (input_ids, attention, marker_pos, marker_mask, qtype)
        inputs = {name: t.to(self._device) for name, t in zip(PASS_INPUTS, tensors, strict=True)}
        out = checkpoint.forward(inputs)
        values = out.cpu().tolist()
        return [values[i][: len(row.markers)] for i, row in enumerate(rows)]


def _passes(rows: Sequence[Row], pass_cost: int) -> list[tuple[int, int]]:
    """Split rows sorted by length into consecutive passes: a pass ends before the row that
    would take its padding past `pass_cost` tokens or its padded size past `PASS_TOKEN_LIMIT`."""
    bounds: list[tuple[int, int]] = []
    start, real = 0, 0
    for i, row in enumerate(rows):
        padded = len(row.ids) * (i - start + 1)
        real += len(row.ids)
        if i > start and (padded - real > pass_cost or padded > PASS_TOKEN_LIMIT):
            bounds.append((start, i))
            start, real = i, len(row.ids)
    if start < len(rows):
        bounds.append((start, len(rows)))
    return bounds


def create(spec: EngineSpec) -> LayaEngine:
    """Engine factory named by `EngineSpec.factory` (`providers.laya.engine:create`)."""
    if spec.torch_threads > 0:
        torch.set_num_threads(spec.torch_threads)
    return LayaEngine(spec)
