"""The Laya worker engine: jobs -> encoder rows -> shared padded forward passes -> answers.
Padding is masked, so a job's answers do not depend on what it shared passes with. The readout
is upstream `Agent._decode_answers`', unrounded (upstream rounds to 4 decimals)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import torch

from decidealot.contract import Answer, Cut, NoulAnswer, Question
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad, ignore_load
from decidealot.providers.laya import CHECKPOINTS
from decidealot.providers.laya.calibration import Temperatures
from decidealot.providers.laya.worker import render
from decidealot.providers.laya.worker.model import Checkpoint, load_checkpoint
from decidealot.providers.laya.worker.render import LayaRow, fill
from decidealot.providers.worker.modernbert import Checkpoints
from decidealot.providers.worker.readout import answer_from_probabilities, softmax

PASS_TOKEN_LIMIT = 262_144  # padded tokens (rows x longest row) above which a turn is cut
CPU_PASS_COST = 64
"""A pass's fixed cost on CPU in tokens' worth of compute (measured on the tiny test checkpoint;
less on larger models). A CPU pass costs the same per padded token at any batch size, so padding
is pure waste there: a turn is cut wherever that saves more padding than this."""


@dataclass(frozen=True, slots=True)
class LayaPreparedJob:
    """A job's rows: `windows` runs of one row per question, in question order."""

    group: Checkpoint
    key: str  # the checkpoint's key (`english`, ...), which names the answering model
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

    def compile_next(self) -> bool:
        """A loaded checkpoint's pass compiled (the core's compile thread); False: none waits."""
        return self._checkpoint.compile_next()

    def prepare(self, job: Job) -> LayaPreparedJob:
        """One row per question; under `windows`, one per question per window of a long state."""
        checkpoint = self._checkpoint(job.checkpoint)
        tokenizer, specials, budget = checkpoint.tokenizer, checkpoint.specials, checkpoint.budget

        def encode(texts: Sequence[str]) -> list[list[int]]:
            return tokenizer(list(texts), add_special_tokens=False)["input_ids"]

        heads = render.render_heads(job.questions, checkpoint.texts, specials, budget)
        state = render.state_ids(job.state, encode, specials)
        split = [state]
        if self._checkpoint.long_states == "windows" and heads:
            if min(head.room for head in heads) == 0:
                raise RequestInvalid.question(
                    None, "the questions' options fill the whole row, leaving no room for the state"
                )
            split = render.windows(state, heads, budget)
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
            qtype = render.question_type(question)
            per_window = []
            for w in range(prepared.windows):
                logits: list[float] = outputs[w * count + i]  # type: ignore[assignment]
                probs = softmax(logits, temperatures.get(qtype, len(logits)))
                # a noul's options are [false, true]
                per_window.append(
                    answer_from_probabilities(question, probs, entropy_confidence, true_index=1)
                )
            answers[name] = per_window[deciding_window(per_window, qtype, temperatures)]
        model = f"laya-{prepared.key}"
        return Decision(model, answers, prepared.input_tokens, prepared.cuts)


def entropy_confidence(probs: Sequence[float]) -> float:
    """Upstream `confidence_from_probs`: 1 - H(p)/ln k, clipped to [0, 1]; 1.0 below 2 options."""
    k = len(probs)
    if k < 2:
        return 1.0
    entropy = -sum(p * math.log(min(1.0, max(p, 1e-12))) for p in probs)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(k)))


def deciding_window(per_window: Sequence[Answer], qtype: str, temperatures: Temperatures) -> int:
    """Which window's answer upstream `Agent.predict_long` keeps: a noul's highest P(true), else
    the highest `answer_confidence`, compared as upstream reports them (4 decimals)."""

    def key(answer: Answer) -> float:
        if isinstance(answer, NoulAnswer):
            return round(answer.noul, 4)
        return temperatures.answer_confidence(qtype, list(answer.probabilities.values()))

    return max(range(len(per_window)), key=lambda w: key(per_window[w]))


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


create = LayaEngine  # the factory `EngineSpec.factory` names
