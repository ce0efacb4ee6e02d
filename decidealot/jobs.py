"""What a worker process hosts: one provider's model engine, behind a small protocol.

The gateway sends each request to the worker as a `Job`. The engine `prepare`s a job into rows
(tokenisation, on the worker's preparing thread); the worker's pass planner
(`decidealot.providers.worker.passes`) packs rows of concurrent jobs of one `group` into forward
passes within the token budget and calls `forward` once per pass; once every row of a job has
its output the engine's `finish` reads the job's answers out of them. Rows never see each other
(padding is masked), so a job's answers do not depend on which rows shared its passes. Engines
import torch; nothing in the gateway imports an engine module.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple, Protocol

import msgspec

from decidealot.contract import Answer, Cut, Json, Question, State


class EngineSpec(msgspec.Struct, frozen=True):
    """How to build an engine: sent to the worker in its first frame."""

    factory: str
    """`module:function` returning an `Engine`, e.g.
    `decidealot.providers.laya.worker.engine:create`."""

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
    once (layout in `decidealot.providers.clm.worker.engine`)."""
    vector_index: list[int] = []
    """CLM only: per question in order, the row of `vectors` holding its state, then one row
    per option in answer order; questions that share a text share its row."""


class Decision(msgspec.Struct):
    """An engine's answer to one job; `model` names the checkpoint that answered."""

    model: str
    answers: dict[str, Answer]
    input_tokens: int
    cuts: list[Cut] = []
    """The questions whose state the model read only in part, in question order."""


class Row(Protocol):
    """One sequence of a forward pass; the planner sorts, packs and pads rows by `tokens`."""

    @property
    def tokens(self) -> int:
        """Its unpadded length in tokens (for CLM, its vectors)."""


class PreparedJob(Protocol):
    """An engine's prepared form of a job; the worker reads only these three fields."""

    group: Hashable
    """Rows of equal group may share a forward pass (e.g. the same checkpoint)."""

    rows: Sequence[Row]
    """The job's rows in the job's own order; `finish` receives one output per row."""

    input_tokens: int
    """What `usage.input_tokens` will report; `DECIDEALOT_MAX_REQUEST_TOKENS` bounds it."""


class PassShape(NamedTuple):
    """How an engine wants the rows of one forward pass cut (within the token budget)."""

    max_tokens: int | None = None
    """Padded tokens (rows x longest row) per pass; None: only the worker's token budget."""

    max_waste: int | None = None
    """Padding tokens a pass may carry before it is cut in two; None: no such rule."""


class Engine(Protocol):
    shape: PassShape

    def prepare(self, job: Job) -> PreparedJob:
        """CPU-side work for one job. Raises `RequestInvalid` (its issues located within the
        request) for input that cannot fit."""

    def forward(self, group: Hashable, rows: Sequence[Row]) -> Sequence[object]:
        """One forward pass over rows of one group, shortest first; one output per row."""

    def finish(self, prepared: PreparedJob, outputs: Sequence[object]) -> Decision:
        """The job's decision from its rows' outputs (in `prepared.rows` order)."""
