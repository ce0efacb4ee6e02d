"""The Von engine a worker hosts: jobs -> packed rows (one per question, plus a no-state row per
zero-shot noul) -> padded forward passes -> answers, the same alone or batched.

The readout's arithmetic follows von-sdk 1.3.7 step by step (float32 softmax, then Python sums),
unrounded, so probabilities keep summing to 1; what it answers: docs/models.md, "Von".
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from decidealot.contract import (
    Answer,
    ChoiceAnswer,
    ChoiceQuestion,
    Cut,
    NoulQuestion,
    Question,
    ScoreAnswer,
)
from decidealot.errors import RequestInvalid
from decidealot.jobs import Decision, EngineSpec, Job
from decidealot.providers.engine.protocol import PassShape, ReportLoad, ignore_load
from decidealot.providers.von.calibration import VonCalibration
from decidealot.providers.von.worker import render
from decidealot.providers.von.worker.model import CPU_PASS_TOKENS, WINDOW, VonModel, VonRow
from decidealot.providers.worker.modernbert import Checkpoints
from decidealot.providers.worker.readout import answer_from_probabilities

DEFAULT_MAX_STATE_TOKENS = WINDOW  # upstream's `VON_MAX_STATE_TOKENS`; the engine option lowers it
DEFAULT_DEBIAS = 0.7


@dataclass(frozen=True)
class _Plan:
    """How to read one question's answer out of its job's rows."""

    name: str
    question: Question
    row: int | None  # in its job's rows; None: nothing to score
    null_row: int | None  # a zero-shot noul's state-free row, for the debias
    state_tokens: int  # the fitted state's, the map's length feature (1 without a map)
    fitted: str = ""  # the state as the row holds it


@dataclass(frozen=True)
class VonPreparedJob:
    """A tokenised job, ready to share a forward pass with others of its checkpoint (`group`)."""

    group: str
    rows: list[VonRow]
    plans: list[_Plan]
    input_tokens: int
    cuts: list[Cut]  # the questions whose state was cut in the middle


class VonEngine:
    """Serves Von's checkpoints; `prepare` and `forward` may run in several threads."""

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

    def compile_next(self) -> bool:
        """A loaded checkpoint's pass compiled (the core's compile thread); False: none waits."""
        return self._model.compile_next()

    def prepare(self, job: Job) -> VonPreparedJob:
        model = self._model(job.checkpoint)
        tokenizer, calibration = model.tokenizer, model.calibration
        split = calibration.digit_split
        state = render.format_state(job.state)
        counted = render.split_digits(state) if split else state  # as the cut counts it
        state_ids = tokenizer(counted, add_special_tokens=False)["input_ids"]
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
            packed = render.pack(tokenizer, "", instructions, options, digit_split=split)
            fixed = len(tokenizer(packed)["input_ids"])  # the tokens no state cut reaches
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
                if plan.row is None:  # upstream's answer where no criteria left nothing to run
                    if isinstance(plan.question, ChoiceQuestion):
                        answers[plan.name] = ChoiceAnswer("", 0.0, {})
                    else:
                        answers[plan.name] = ScoreAnswer(0.0, 0.0, {}, {})
                    continue
                logits = self._logits(model, plan, outputs)
                scale = max(temperature(logits, plan.state_tokens, model.calibration), 1e-4)
                probs = torch.softmax(logits / scale, dim=-1).cpu().tolist()
                # the choice is the raw logits' argmax, which a temperature never moves; options
                # are packed as [yes, no], so P(true) comes first
                best = int(torch.argmax(logits).item())
                answers[plan.name] = answer_from_probabilities(
                    plan.question, probs, margin_confidence, true_index=0, best=best
                )
        return Decision(prepared.group, answers, prepared.input_tokens, prepared.cuts)

    def tempered(
        self, prepared: VonPreparedJob, outputs: Sequence[object]
    ) -> tuple[torch.Tensor, int]:
        """A one-question job's logits as its temperature divides them (a zero-shot noul's
        debiased) and its state's tokens, even without a map: what `von calibrate` records."""
        model = self._model(prepared.group)
        (plan,) = prepared.plans
        tokens = plan.state_tokens
        if model.calibration.calibration_map is None:
            ids = model.tokenizer(plan.fitted, add_special_tokens=False)["input_ids"]
            tokens = max(1, len(ids))
        return self._logits(model, plan, outputs), tokens

    @staticmethod
    def _logits(model: VonModel, plan: _Plan, outputs: Sequence[object]) -> torch.Tensor:
        """The question's row's logits; a zero-shot noul's yes logit less the preference for
        yes its state-free row shows (upstream's debias)."""
        logits: torch.Tensor = outputs[plan.row]  # type: ignore[index,assignment]
        if plan.null_row is None:
            return logits
        null: torch.Tensor = outputs[plan.null_row]  # type: ignore[assignment]
        bias, prior = null[0] - null[1], model.calibration.noul_prior
        correction = DEFAULT_DEBIAS * bias if prior is None else prior[0] * bias + prior[1]
        return torch.stack([logits[0] - correction, logits[1]])


def entropy_ratio(logits: torch.Tensor) -> float:
    """Entropy of softmax(logits) over ln K: the map's difficulty feature."""
    probs = torch.softmax(logits.float(), dim=-1)
    n = max(probs.numel(), 1)
    if n <= 1:
        return 0.0
    return -(probs * torch.log(probs.clamp_min(1e-12))).sum().item() / math.log(n)


def features(logits: torch.Tensor, state_tokens: int) -> dict[str, float]:
    """The map's inputs for one question (upstream `_calib_features`)."""
    return {
        "bias": 1.0,
        "entropy": entropy_ratio(logits),
        "log_tokens": math.log10(state_tokens) / 4.0,
        "n_options": logits.numel() / 8.0,
    }


def temperature(logits: torch.Tensor, state_tokens: int, calibration: VonCalibration) -> float:
    """The scalar temperature, or the map's input-conditioned one clamped to [lo, hi]."""
    params = calibration.calibration_map
    if params is None:
        return calibration.temperature
    raw = sum(
        params.get(name, 0.0) * value for name, value in features(logits, state_tokens).items()
    )
    return min(params["hi"], max(params["lo"], raw))


def margin_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n <= 1:
        return 1.0
    return max(0.0, min(1.0, (n * max(probs) - 1) / (n - 1)))


create = VonEngine  # the factory `EngineSpec.factory` names
