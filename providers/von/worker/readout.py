"""Von's readout (von.md §4): temperature, noul debias and the three answer types.

Arithmetic follows von-sdk 1.3.7 step by step (float32 softmax, then Python sums), unrounded
like every provider's (upstream rounds what it reports), so probabilities keep summing to 1.
Confidence (choice and score) is upstream's margin confidence `(K·p_max − 1)/(K − 1)` in
[0, 1]; `noul` is the calibrated P(true) (upstream's `noul_raw`), not its banded decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from decidealot.contract import Answer, ChoiceAnswer, Question, ScoreAnswer
from decidealot.providers.von.calibration import VonCalibration
from decidealot.providers.worker import readout as shared_readout

_DEFAULT_DEBIAS = 0.7


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


def debias(
    logits: torch.Tensor, null_logits: torch.Tensor, calibration: VonCalibration
) -> torch.Tensor:
    """Subtract the no-state preference for "yes" from the yes logit (zero-shot noul only)."""
    bias = null_logits[0] - null_logits[1]
    if calibration.noul_prior is None:
        correction = _DEFAULT_DEBIAS * bias
    else:
        a, b = calibration.noul_prior
        correction = a * bias + b
    return torch.stack([logits[0] - correction, logits[1]])


def probabilities(
    logits: torch.Tensor, state_tokens: int, calibration: VonCalibration
) -> list[float]:
    scale = max(temperature(logits, state_tokens, calibration), 1e-4)
    return torch.softmax(logits / scale, dim=-1).cpu().tolist()


def margin_confidence(probs: Sequence[float]) -> float:
    n = len(probs)
    if n <= 1:
        return 1.0
    return max(0.0, min(1.0, (n * max(probs) - 1) / (n - 1)))


def answer(question: Question, logits: torch.Tensor, probs: list[float]) -> Answer:
    """The choice is the argmax of the raw logits (temperature never moves it); the legend
    echoes the caller's levels; options are packed as [yes, no], so P(true) comes first."""
    best = int(torch.argmax(logits).item())
    return shared_readout.answer_from_probabilities(
        question, probs, margin_confidence, true_index=0, best=best
    )


def empty_answer(is_choice: bool) -> ChoiceAnswer | ScoreAnswer:
    """Upstream's answer to a question with no criteria: nothing is run."""
    if is_choice:
        return ChoiceAnswer(choice="", confidence=0.0, probabilities={})
    return ScoreAnswer(score=0.0, confidence=0.0, legend={}, probabilities={})
