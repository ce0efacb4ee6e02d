"""The Laya worker engine: jobs -> encoder rows -> shared padded forward passes -> answers.
Padding is masked, so a job's answers do not depend on what it shared passes with."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from decidealot.contract import Cut, Question
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad, ignore_load
from decidealot.providers.laya import CHECKPOINTS
from decidealot.providers.laya.worker import readout
from decidealot.providers.laya.worker.model import Checkpoint, load_checkpoint
from decidealot.providers.laya.worker.render import LayaRow, fill, render_heads, state_ids, windows
from decidealot.providers.worker.modernbert import Checkpoints

PASS_TOKEN_LIMIT = 262_144
"""Padded tokens (rows x longest row) above which a turn is cut into several passes."""
CPU_PASS_COST = 64
"""A pass's fixed cost on CPU in tokens' worth of compute (measured on the tiny test checkpoint;
less on larger models). A CPU pass costs the same per padded token at any batch size, so padding
is pure waste there: a turn is cut wherever that saves more padding than this."""


@dataclass(frozen=True, slots=True)
class LayaPreparedJob:
    """A job's rendered rows plus what readout needs; its checkpoint is its rows' group. The rows
    are `windows` runs of one row per question, in question order."""

    group: Checkpoint
    key: str
    """The checkpoint's key (`english`, ...), which names the answering model."""
    input_tokens: int
    questions: dict[str, Question]
    rows: list[LayaRow]
    windows: int
    cuts: list[Cut]


class LayaEngine:
    """Serves the three Laya checkpoints; `prepare` and `forward` may run in several threads."""

    def __init__(self, spec: EngineSpec, report: ReportLoad = ignore_load):
        unknown = set(spec.checkpoints) - set(CHECKPOINTS)
        if unknown:
            raise ValueError(f"unknown Laya checkpoint keys: {sorted(unknown)}")
        # On CUDA a pass is worth a large batch: cut only past the token limit.
        cpu = torch.device(spec.device).type == "cpu"
        self.shape = PassShape(PASS_TOKEN_LIMIT, CPU_PASS_COST if cpu else None)
        # On a GPU upstream Laya autocasts to bf16 (its shipped `amp_dtype`): `auto` does too.
        self._checkpoint = Checkpoints(
            "Laya", spec, report, load_checkpoint, keys=CHECKPOINTS, on_cuda="bf16"
        )

    def prepare(self, job: Job) -> LayaPreparedJob:
        """One row per question, or under `windows` one per question per window of a state
        longer than the questions leave room for; refused (`refuse`) or reported (`cuts`)
        when a row holds only part of the state."""
        checkpoint = self._checkpoint(job.checkpoint)
        tokenizer, specials, budget = checkpoint.tokenizer, checkpoint.specials, checkpoint.budget

        def encode(texts: Sequence[str]) -> list[list[int]]:
            return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

        heads = render_heads(job.questions, checkpoint.texts, specials, budget)
        state = state_ids(job.state, encode, specials)
        split = [state]
        if self._checkpoint.long_states == "windows" and heads:
            if min(head.room for head in heads) == 0:
                raise RequestInvalid.question(
                    None, "the questions' options fill the whole row, leaving no room for the state"
                )
            split = windows(state, heads, budget)
        if len(split) == 1:
            rows = [
                fill(head, state, isinstance(job.state, list), specials, budget) for head in heads
            ]
        else:  # each window's text is read as upstream reads it: decoded, a string state
            texts = [tokenizer.decode(part).replace(specials.mask_text, " ") for part in split]
            rows = [
                fill(head, ids, False, specials, budget) for ids in encode(texts) for head in heads
            ]
        cuts = _cuts(list(job.questions), rows, len(split), len(state))
        self._checkpoint.refuse_cuts(cuts, f"laya-{job.checkpoint}'s {budget.max_len}-token rows")
        tokens = sum(len(row.ids) for row in rows)
        return LayaPreparedJob(
            checkpoint, job.checkpoint, tokens, job.questions, rows, len(split), cuts
        )

    def forward(self, group: Hashable, rows: Sequence[LayaRow]) -> list[list[float]]:
        return cast(Checkpoint, group).forward(rows)

    def finish(self, prepared: LayaPreparedJob, outputs: Sequence[object]) -> Decision:
        """Each question's answer; over windows, upstream `predict_long`'s deciding window's."""
        temperatures = prepared.group.temperatures
        count = len(prepared.questions)
        answers = {}
        for i, (name, question) in enumerate(prepared.questions.items()):
            per_window = [
                readout.answer(question, outputs[w * count + i], temperatures)  # type: ignore[arg-type]
                for w in range(prepared.windows)
            ]
            deciding = readout.deciding_window(per_window, question, temperatures)
            answers[name] = per_window[deciding]
        model = f"laya-{prepared.key}"
        return Decision(model, answers, prepared.input_tokens, prepared.cuts)


def _cuts(names: list[str], rows: list[LayaRow], windows: int, total: int) -> list[Cut]:
    """The questions whose rows hold only part of the state (`total` tokens): what they read,
    less what any of their windows lost (a window's text can tokenise longer than its room)."""
    cuts = []
    for i, name in enumerate(names):
        own = rows[i :: len(names)] if names else []
        lost = sum(row.state_total - row.state_read for row in own)
        if lost:
            read = own[0].state_read if windows == 1 else max(0, total - lost)
            cuts.append(Cut(name, read, total))
    return cuts


create = LayaEngine
"""The factory `EngineSpec.factory` names."""
