"""What a worker process hosts: one provider's model engine, behind a small protocol.

The gateway sends each request to the worker as a `Job`; the worker `prepare`s jobs
(tokenisation, on its own thread) while the previous batch runs, then packs prepared jobs of
the same `group` into `run` calls bounded by a token budget (continuous batching). Engines
import torch; nothing in the gateway imports an engine module.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import msgspec

from decidealot.contract import Answer, Json, Question, State


class EngineSpec(msgspec.Struct, frozen=True):
    """How to build an engine: sent to the worker in its first frame."""

    factory: str
    """`module:function` returning an `Engine`, e.g. `providers.laya.engine:create`."""

    checkpoints: dict[str, str]
    """Checkpoint key -> local path (file or directory) for every checkpoint it may serve."""

    preload: list[str] = []
    """Checkpoint keys to load before the worker reports healthy."""

    device: str = "cpu"
    """`cpu` or `cuda` (already resolved from `auto`)."""

    torch_threads: int = 0
    """0 keeps torch's default."""

    options: dict[str, Json] = {}
    """Provider-specific settings (e.g. CLM's text-byte bound)."""


class Job(msgspec.Struct, frozen=True):
    """One validated request's questions for one checkpoint."""

    checkpoint: str
    state: State
    questions: dict[str, Question]
    config: dict[str, Json] = {}
    vectors: bytes = b""
    """CLM only: float32 embeddings the gateway obtained from the encoder, each distinct one
    once (layout in `providers.clm.engine`)."""
    vector_index: list[int] = []
    """CLM only: per question in order, the row of `vectors` holding its state, then one row
    per option in answer order; questions that share a text share its row."""


class Decision(msgspec.Struct):
    """An engine's answer to one job; `model` names the checkpoint that answered."""

    model: str
    answers: dict[str, Answer]
    input_tokens: int


class Prepared(Protocol):
    """An engine's prepared form of a job; the worker reads only these two fields."""

    cost: int
    """Padded token cost of this job's rows in a pass, for the batch token budget."""

    group: Hashable
    """Jobs of equal group may share a forward pass (e.g. the same checkpoint)."""


class Engine(Protocol):
    def prepare(self, job: Job) -> Prepared:
        """CPU-side work for one job. Raises `DecisionInputError` for input that cannot fit."""

    def run(self, batch: Sequence[Prepared]) -> list[Decision]:
        """One or more forward passes over jobs of one group; results in batch order."""
