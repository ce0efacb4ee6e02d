"""Laya readout (laya.md §5): option logits -> tempered softmax -> contract answers, as
upstream `Agent._decode_answers`, unrounded (upstream rounds to 4 decimals). Pure Python."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from decidealot.contract import Answer, NoulAnswer, Question
from decidealot.providers.laya.calibration import Payload, clamp_temperature
from decidealot.providers.laya.worker.render import QTYPES, question_type
from decidealot.providers.worker import readout as shared_readout


def temperature_bucket(qtype: str, options: int) -> str:
    size = "2" if options <= 2 else "3-5" if options <= 5 else "6-10" if options <= 10 else "11+"
    return f"{qtype}:{size}"


class Temperatures:
    """A checkpoint's softmax temperatures, clamped once at load as upstream does: its own
    (`rl_agent_config.json`) or a calibration file's, which replaces them whole."""

    def __init__(
        self,
        by_type: Sequence[object],
        by_options: Mapping[str, object],
        binning: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        if not isinstance(by_type, list | tuple) or len(by_type) != 3:
            raise ValueError("rl_agent_config.json: temperature must be a list of 3 numbers")
        self.by_type = [clamp_temperature(t) for t in by_type]
        self.by_options = {key: clamp_temperature(t) for key, t in by_options.items()}
        self.binning = binning or {}

    @classmethod
    def of(cls, payload: Payload) -> Temperatures:
        """A calibration file's (`laya.Agent.load_calibration`), with its binning map."""
        return cls(payload.temperature, payload.temperature_by_options, payload.binning_map)

    def answer_confidence(self, qtype: str, probs: Sequence[float]) -> float:
        """Upstream's `answer_confidence` as it reports it (4 decimals): the top probability,
        through the binning map's entry for the question's bucket (`apply_binning_map`). The
        contract does not report it, but it picks a windowed state's deciding window."""
        top = max(probs)
        entry = self.binning.get(temperature_bucket(qtype, len(probs)))
        if entry:
            bins = int(entry["bins"])
            top = float(entry["values"][min(bins - 1, max(0, int(top * bins)))])
        return round(top, 4)

    def get(self, qtype: str, options: int) -> float:
        fallback = self.by_type[QTYPES[qtype]]
        return self.by_options.get(temperature_bucket(qtype, options), fallback)


def entropy_confidence(probs: Sequence[float]) -> float:
    """Upstream `confidence_from_probs`: 1 - H(p)/ln k, clipped to [0, 1]; 1.0 below 2 options."""
    k = len(probs)
    if k < 2:
        return 1.0
    entropy = -sum(p * math.log(min(1.0, max(p, 1e-12))) for p in probs)
    return min(1.0, max(0.0, 1.0 - entropy / math.log(k)))


def answer(question: Question, logits: Sequence[float], temperatures: Temperatures) -> Answer:
    """One question's answer from its option logits (slot order = option order); a noul's
    options are [false, true]."""
    probs = shared_readout.softmax(logits, temperatures.get(question_type(question), len(logits)))
    return shared_readout.answer_from_probabilities(
        question, probs, entropy_confidence, true_index=1
    )


def deciding_window(
    per_window: Sequence[Answer], question: Question, temperatures: Temperatures
) -> int:
    """Which window's answer upstream `Agent.predict_long` keeps: a noul's highest P(true), a
    choice's or score's highest `answer_confidence`, each compared as upstream reports them (4
    decimals); the first on a tie."""
    qtype = question_type(question)

    def key(answer: Answer) -> float:
        if isinstance(answer, NoulAnswer):
            return round(answer.noul, 4)
        return temperatures.answer_confidence(qtype, list(answer.probabilities.values()))

    return max(range(len(per_window)), key=lambda w: key(per_window[w]))
