"""Von calibration files: `marker_calibration.json` as von-sdk 1.3.7 ships and writes it.

Besides the temperature rule and the noul prior, it holds two flags that set how the forward
pass runs, so `VON_CALIBRATION` replaces the checkpoint's file whole. Maps and priors upstream
cannot use are dropped, as upstream drops them. Pure Python: the gateway checks files at start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decidealot.providers.json_files import read_json_object

MAP_FEATURES = ("bias", "entropy", "log_tokens", "n_options")  # in the order `von calibrate` fits
FLAGS = ("independent_options", "digit_split")
TEMPERATURE_SANITY_MAX = 50.0


class CalibrationError(ValueError):
    """A calibration file Von cannot run with; the message names the field."""


@dataclass(frozen=True)
class VonCalibration:
    temperature: float
    calibration_map: dict[str, float] | None
    noul_prior: tuple[float, float] | None
    independent_options: bool
    digit_split: bool


def _calibration_map(raw: object) -> dict[str, float] | None:
    """Upstream's validation: unusable maps are dropped and the scalar temperature applies."""
    try:
        values = {str(key): float(value) for key, value in raw.items()}  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):  # not an object, or not numbers
        return None
    if not any(key in values for key in MAP_FEATURES):
        return None
    values.setdefault("lo", 0.5)
    values.setdefault("hi", 12.0)
    return None if values["lo"] > values["hi"] else values


def _noul_prior(raw: object) -> tuple[float, float] | None:
    try:
        return float(raw["a"]), float(raw["b"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):  # not an object of two numbers
        return None


def parse(data: dict[str, Any]) -> VonCalibration:
    """A file's rule and flags; what upstream would reset (the wrong attention mode) is refused."""
    try:
        temperature = float(data.get("temperature", 1.0))
    except (TypeError, ValueError):
        raise CalibrationError("temperature must be a number") from None
    flags = {}
    for flag in FLAGS:
        value = data.get(flag, False)
        if not isinstance(value, bool):
            raise CalibrationError(f"{flag} must be a boolean")
        flags[flag] = value
    return VonCalibration(
        temperature=temperature,
        calibration_map=_calibration_map(data.get("calibration_map")),
        noul_prior=_noul_prior(data.get("noul_zero_shot_prior")),
        **flags,
    )


def check(path: Path) -> str | None:
    """What stops this file from loading (a `registry.FileCheck`), or None."""
    try:
        parse(read_json_object(path, CalibrationError))
    except CalibrationError as exc:
        return str(exc)
    return None


def warnings(path: Path, checkpoint: Path) -> list[str]:
    """What to warn of when `path` replaces `checkpoint`'s own file: that it may be for other
    weights (other flags change answers, not just confidence; `weights_id`/`model_id` name them)."""
    data = read_json_object(path, CalibrationError)
    shipped = read_json_object(checkpoint / "marker_calibration.json", CalibrationError)
    problems = [
        f"{flag}={data.get(flag, False)} where the checkpoint's own file has "
        f"{shipped.get(flag, False)}"
        for flag in FLAGS
        if bool(data.get(flag, False)) != bool(shipped.get(flag, False))
    ]
    theirs = data.get("weights_id", data.get("model_id"))
    ours = shipped.get("model_id")
    if theirs is not None and ours is not None and theirs != ours:
        problems.append(f"it was fitted for weights {theirs!r}, the checkpoint is {ours!r}")
    found = ["may be for another checkpoint: " + "; ".join(problems)] if problems else []
    rule = parse(data).calibration_map
    if rule is not None and (rule["lo"] <= 0 or rule["hi"] > TEMPERATURE_SANITY_MAX):
        found.append(  # upstream's own load warning
            f"calibration map bounds [{rule['lo']:g}, {rule['hi']:g}] are outside the sane "
            f"range (0, {TEMPERATURE_SANITY_MAX:g}]; confidences may be distorted."
        )
    return found
