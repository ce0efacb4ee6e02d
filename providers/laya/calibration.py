"""Laya calibration files: the JSON payload laya 0.4.15's `Agent.save_calibration` writes.

Read with upstream's own rules (`laya.calibrate.apply_calibration_payload`): a malformed shape
is refused, naming the field, while a temperature that is not a number or lies outside [0.5, 5]
is clamped at load as the checkpoint's own are; a file fitted for another checkpoint warns and
still loads. Pure Python: the gateway checks files before listening.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decidealot.providers.json_files import read_json_object

VERSION = 2  # laya's `CALIBRATION_VERSION`; a file without one is 1 (no identity)
QTYPE_NAMES = ("choice", "score", "noul")
TEMPERATURE_MIN = 0.5
TEMPERATURE_MAX = 5.0
_IDENTITY_SKIP = ("temperature", "temperature_by_options")


class CalibrationError(ValueError):
    """A calibration file laya itself would refuse to load; the message names the field."""


def _number(value: object) -> float | None:
    """`value` as upstream reads a temperature: a float, or None for a bool or a non-number."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def clamp_temperature(value: object) -> float:
    """Upstream `clamp_temperature`: non-numbers (bools, NaN, inf) mean 1.0; else [0.5, 5]."""
    number = _number(value)
    if number is None or not math.isfinite(number):
        return 1.0
    return min(TEMPERATURE_MAX, max(TEMPERATURE_MIN, number))


def config_identity(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A checkpoint's `rl_agent_config.json` without the temperatures a payload carries."""
    if config is None:
        return None
    return {str(k): config[k] for k in config if k not in _IDENTITY_SKIP}


def temperature_bucket(qtype: str, options: int) -> str:
    size = "2" if options <= 2 else "3-5" if options <= 5 else "6-10" if options <= 10 else "11+"
    return f"{qtype}:{size}"


class Temperatures:
    """A checkpoint's temperatures (its own, or a calibration file's instead), clamped at load."""

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
        """Upstream's `answer_confidence` (4 decimals): the top probability through its bucket's
        binning map (`apply_binning_map`); never reported, it picks a windowed state's window."""
        top = max(probs)
        entry = self.binning.get(temperature_bucket(qtype, len(probs)))
        if entry:
            bins = int(entry["bins"])
            top = float(entry["values"][min(bins - 1, max(0, int(top * bins)))])
        return round(top, 4)

    def get(self, qtype: str, options: int) -> float:
        fallback = self.by_type[QTYPE_NAMES.index(qtype)]
        return self.by_options.get(temperature_bucket(qtype, options), fallback)


@dataclass(frozen=True)
class Payload:
    """A parsed calibration file: its temperatures as written (clamped where they are used)."""

    version: int
    temperature: list[Any]
    temperature_by_options: dict[str, Any]
    binning_map: dict[str, dict[str, Any]] | None  # recalibrates `answer_confidence` only
    model_id_or_path: Any = None
    subfolder: Any = None
    config: Any = None

    def rejected(self) -> list[str]:
        """Entries the clamp changed (upstream's `temperature_rejected`), named as it warns."""
        applied = Temperatures.of(self)
        by_type, by_options = applied.by_type, applied.by_options
        entries = [(f"temperature[{i}]", raw, by_type[i]) for i, raw in enumerate(self.temperature)]
        entries += [(k, self.temperature_by_options[k], by_options[k]) for k in by_options]
        return [
            f"{name}={raw!r} -> {applied:g}"
            for name, raw, applied in entries
            if _number(raw) != applied
        ]


def _version(payload: Mapping[str, Any]) -> int:
    version = 1 if payload.get("version") is None else payload["version"]
    whole = isinstance(version, int | str) or (isinstance(version, float) and version.is_integer())
    if whole and not isinstance(version, bool):
        with contextlib.suppress(ValueError):  # a string that is no integer
            return int(version)
    raise CalibrationError(f"version must be an integer, got {version!r}")


def _binning_map(binning: object) -> dict[str, dict[str, Any]] | None:
    if binning is None:
        return None
    if not isinstance(binning, dict):
        raise CalibrationError(
            f"binning_map must be an object of bucket -> {{bins, values}}, "
            f"got {type(binning).__name__}"
        )
    for name, entry in binning.items():
        if not isinstance(entry, dict):
            raise CalibrationError(
                f'binning_map[{name!r}] must be an object with "bins" and "values", '
                f"got {type(entry).__name__}"
            )
        bins, values = entry.get("bins"), entry.get("values")
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise CalibrationError(f'binning_map[{name!r}] must have an integer "bins" >= 1')
        if not isinstance(values, list) or len(values) != bins:
            raise CalibrationError(f'binning_map[{name!r}] must have "values" of length {bins}')
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise CalibrationError(f"binning_map[{name!r}] values must be numbers")
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise CalibrationError(f"binning_map[{name!r}] values must be in [0, 1]")
    return binning


def parse(payload: object) -> Payload:
    """A payload's fields, checked as `apply_calibration_payload` checks them."""
    if not isinstance(payload, dict):
        raise CalibrationError(f"not a JSON object but {type(payload).__name__}")
    version = _version(payload)
    temperature = payload.get("temperature")
    if not isinstance(temperature, list) or len(temperature) != len(QTYPE_NAMES):
        raise CalibrationError("temperature must be a list of 3 numbers")
    by_options = payload.get("temperature_by_options")
    by_options = {} if by_options is None else by_options
    if not isinstance(by_options, dict):
        raise CalibrationError(
            "temperature_by_options must be an object of bucket -> number, "
            f"got {type(by_options).__name__}"
        )
    return Payload(
        version=version,
        temperature=list(temperature),
        temperature_by_options={str(k): v for k, v in by_options.items()},
        binning_map=_binning_map(payload.get("binning_map")),
        model_id_or_path=payload.get("model_id_or_path"),
        subfolder=payload.get("subfolder"),
        config=payload.get("config"),
    )


def read_calibration(path: Path) -> Payload:
    """The file at `path`, parsed as laya reads it (NaN literals load, then are clamped)."""
    return parse(read_json_object(path, CalibrationError))


def check(path: Path) -> str | None:
    """What stops this file from loading (a `registry.FileCheck`), or None."""
    try:
        read_calibration(path)
    except CalibrationError as exc:
        return str(exc)
    return None


def warnings(path: Path, checkpoint: Path) -> list[str]:
    """What laya warns of when it loads the file at `path` onto `checkpoint` (a directory); here
    the config tells checkpoints apart (upstream's `model_id_or_path` and `subfolder` cannot)."""
    loaded = read_calibration(path)
    found = []
    config = read_json_object(checkpoint / "rl_agent_config.json", CalibrationError)
    if loaded.version >= VERSION and loaded.config != config_identity(config):
        found.append(
            f"calibration was fitted for model_id_or_path={loaded.model_id_or_path!r} "
            f"subfolder={loaded.subfolder!r}, whose config differs from this checkpoint's "
            "rl_agent_config.json; loading the temperatures anyway"
        )
    clamped = loaded.rejected()
    if clamped:
        found.append(
            f"calibration temperatures are invalid or outside [{TEMPERATURE_MIN:g}, "
            f"{TEMPERATURE_MAX:g}]; using {', '.join(clamped)}. Treat confidence from the "
            "affected entries as uncalibrated."
        )
    return found


def payload(
    temperature: Sequence[float],
    temperature_by_options: Mapping[str, float],
    *,
    model_id_or_path: str | None,
    config: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """What a fresh agent's `Agent.save_calibration` writes (`calibration_payload`)."""
    return {
        "version": VERSION,
        "temperature": [float(t) for t in temperature],
        "temperature_by_options": {str(k): float(v) for k, v in temperature_by_options.items()},
        "model_id_or_path": model_id_or_path,
        "subfolder": None,
        "config": config_identity(config),
    }
