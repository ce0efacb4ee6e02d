"""The Von engine a worker hosts: jobs -> packed rows (one per question, plus a no-state row per
zero-shot noul) -> padded forward passes -> answers, the same alone or batched."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from decidealot.contract import Answer, ChoiceQuestion, Cut, NoulQuestion, Question
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad, ignore_load
from decidealot.providers.von.worker import readout, render
from decidealot.providers.von.worker.model import CPU_PASS_TOKENS, WINDOW, VonModel, VonRow
from decidealot.providers.worker.modernbert import Checkpoints

DEFAULT_MAX_STATE_TOKENS = WINDOW
"""Upstream's `VON_MAX_STATE_TOKENS` default; `EngineSpec.options["max_state_tokens"]` lowers it."""


@dataclass(frozen=True)
class _Plan:
    """How to read one question's answer out of its job's rows."""

    name: str
    question: Question
    row: int | None
    """Index of the question's row in its job; None when there is nothing to score."""
    null_row: int | None
    """Index of the zero-shot noul's no-state row, when the debias pass runs."""
    state_tokens: int
    """Tokens of the fitted state, the temperature map's length feature (1 without a map)."""
    fitted: str = ""
    """The fitted state (what `state_tokens` counts)."""


@dataclass(frozen=True)
class VonPreparedJob:
    """A tokenised job, ready to share a forward pass with others of its checkpoint (`group`)."""

    group: str
    rows: list[VonRow]
    plans: list[_Plan]
    input_tokens: int
    cuts: list[Cut]
    """The questions whose state was cut in the middle."""


class VonEngine:
    """Serves the checkpoints of one `EngineSpec`; `prepare` and `forward` may run in several
    threads."""

    def __init__(self, spec: EngineSpec, report: ReportLoad = ignore_load):
        self.shape = PassShape(CPU_PASS_TOKENS if torch.device(spec.device).type == "cpu" else None)
        max_state_tokens = spec.options.get("max_state_tokens", DEFAULT_MAX_STATE_TOKENS)
        if not isinstance(max_state_tokens, int) or max_state_tokens < 1:
            raise ValueError("Von engine option max_state_tokens must be a positive integer")
        self._max_state_tokens = max_state_tokens
        # Upstream Von runs fp32 on a GPU too (von.md): so does `auto` there.
        self._model = Checkpoints(
            "Von", spec, report, VonModel, keys=list(spec.checkpoints), on_cuda="fp32"
        )

    def prepare(self, job: Job) -> VonPreparedJob:
        model = self._model(job.checkpoint)
        tokenizer, calibration = model.tokenizer, model.calibration
        split = calibration.digit_split
        state = render.format_state(job.state)
        state_ids = render.state_token_ids(tokenizer, state, digit_split=split)
        fitted_tokens: dict[str, int] = {}
        rows: list[VonRow] = []
        plans: list[_Plan] = []
        instruction_chars = 0
        cuts: list[Cut] = []
        for name, question in job.questions.items():
            instructions = render.instructions_text(question.instructions)
            instruction_chars += len(instructions)
            options = render.option_texts(question)
            if not options:
                plans.append(_Plan(name, question, None, None, 0))
                continue
            fixed = render.options_tokens(tokenizer, instructions, options, digit_split=split)
            if fixed > WINDOW:
                raise RequestInvalid.question(
                    name,
                    f"instructions and criteria take {fixed} tokens by themselves, before any "
                    f"state; Von's context window holds {WINDOW}",
                )
            limit = render.state_limit(
                fixed, window=WINDOW, max_state_tokens=self._max_state_tokens
            )
            if len(state_ids) > limit:
                cuts.append(Cut(name, limit, len(state_ids)))
            fitted = render.fit_state(tokenizer, state, state_ids, limit)
            row = len(rows)
            zero_shot = isinstance(question, NoulQuestion) and not render.noul_options(question)[1]
            # the question's row, then a zero-shot noul's state-free row (its debias pass)
            for text, shared in [(fitted, False), ("", True)][: 1 + zero_shot]:
                packed = render.pack(tokenizer, text, instructions, options, digit_split=split)
                ids: list[int] = tokenizer(packed)["input_ids"]
                markers = [t for t, token in enumerate(ids) if token == model.mask_id]
                if len(markers) != len(options):
                    raise RequestInvalid.question(
                        name, "criteria could not be packed as separate options"
                    )
                rows.append(VonRow(ids, markers, shared))
            null_row = row + 1 if zero_shot else None
            if calibration.calibration_map is not None and fitted not in fitted_tokens:
                fitted_ids = tokenizer(fitted, add_special_tokens=False)["input_ids"]
                fitted_tokens[fitted] = max(1, len(fitted_ids))
            state_tokens = fitted_tokens.get(fitted, 1)
            plans.append(_Plan(name, question, row, null_row, state_tokens, fitted))
        self._model.refuse_cuts(cuts, f"{job.checkpoint}'s {WINDOW}-token window")
        if rows:
            input_tokens = sum(len(row.ids) for row in rows)
        else:  # upstream's estimate when no pass ran
            input_tokens = max(1, len(state) // 4) + max(1, instruction_chars // 4)
        return VonPreparedJob(job.checkpoint, rows, plans, input_tokens, cuts)

    def forward(self, group: Hashable, rows: Sequence[VonRow]) -> list[torch.Tensor]:
        with torch.inference_mode():
            return self._model(str(group)).logits(rows)

    def finish(self, prepared: VonPreparedJob, outputs: Sequence[object]) -> Decision:
        model = self._model(prepared.group)
        answers: dict[str, Answer] = {}
        with torch.inference_mode():
            for plan in prepared.plans:
                if plan.row is None:
                    is_choice = isinstance(plan.question, ChoiceQuestion)
                    answers[plan.name] = readout.empty_answer(is_choice)
                    continue
                logits = self._logits(model, plan, outputs)
                probs = readout.probabilities(logits, plan.state_tokens, model.calibration)
                answers[plan.name] = readout.answer(plan.question, logits, probs)
        return Decision(prepared.group, answers, prepared.input_tokens, prepared.cuts)

    def tempered(
        self, prepared: VonPreparedJob, outputs: Sequence[object]
    ) -> dict[str, tuple[torch.Tensor, int]]:
        """Each scored question's logits as its temperature divides them (a zero-shot noul's
        debiased) and its state's tokens, even without a map: what `von calibrate` records."""
        model = self._model(prepared.group)
        found = {}
        for plan in prepared.plans:
            if plan.row is None:
                continue
            tokens = plan.state_tokens
            if model.calibration.calibration_map is None:
                ids = model.tokenizer(plan.fitted, add_special_tokens=False)["input_ids"]
                tokens = max(1, len(ids))
            found[plan.name] = (self._logits(model, plan, outputs), tokens)
        return found

    @staticmethod
    def _logits(model: VonModel, plan: _Plan, outputs: Sequence[object]) -> torch.Tensor:
        """The question's row's logits, a zero-shot noul's debiased by its state-free row's."""
        logits: torch.Tensor = outputs[plan.row]  # type: ignore[index,assignment]
        if plan.null_row is not None:
            null: torch.Tensor = outputs[plan.null_row]  # type: ignore[assignment]
            logits = readout.debias(logits, null, model.calibration)
        return logits


create = VonEngine
"""The factory `EngineSpec.factory` names."""
