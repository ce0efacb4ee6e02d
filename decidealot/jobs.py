"""What the gateway's core and a worker exchange through a local runtime. The messages that
carry them are the seam's (`decidealot.providers.engine.protocol`); these live at the bottom
because the executor and `/v1/status` read them too.
"""

from __future__ import annotations

import msgspec

from decidealot.contract import Answer, Cut, Json, Question, State


class EngineSpec(msgspec.Struct, frozen=True):
    factory: str
    """`module:function` returning an engine, e.g.
    `decidealot.providers.laya.worker.engine:create`."""

    checkpoints: dict[str, str]
    """Key -> local path (file or directory) of every checkpoint it may serve."""

    preload: list[str] = []
    """Checkpoint keys to load before the worker reports healthy."""

    device: str = "cpu"
    """Resolved from `auto`."""

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


class CheckpointLoad(msgspec.Struct, frozen=True):
    """A checkpoint an engine loaded (at start when preloaded, else on its first job, before that
    job's answer): the precision it runs in, the `DECIDEALOT_PRECISION` value it came from
    (`requested`) and why (`reason`), and which linear layers run int8 (the rest, by role, kept
    fp32 by the int8 probe). `path` is its folder; nothing of its contents."""

    checkpoint: str
    path: str
    precision: str
    linear_layers: int
    int8_layers: int
    kept_fp32: list[str] = []
    requested: str = ""
    reason: str = ""
    probe_fallback: bool = False
    """bf16 was chosen, but the load probe moved probabilities too far: fp32 runs."""
    passes: str = "eager"
    """What its passes run through: `eager`, or `compiled` once a compiled pass was checked
    and swapped in (`DECIDEALOT_COMPILE`); the engine reports the load again when that
    happens."""
    compile_state: str = "off"
    """`off`, `eager_precision` (fp32, int8), `no_compiler`, `compiling`, `compiled`,
    `probe_failed` or `failed`; `compile_reason` says it in words."""
    compile_reason: str = ""
    compile_seconds: float = 0.0
    compiled_graphs: int = 0
    cached_graphs: int = 0
    """Of `compiled_graphs`, those inductor found in its on-disk cache."""

    @property
    def int8_share(self) -> float:
        return self.int8_layers / self.linear_layers if self.linear_layers else 0.0
