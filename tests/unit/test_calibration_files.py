"""Calibration files and label files before any model runs: the label format (von calibrate's,
shorthand too, a bad row naming its line), the startup check that stops `serve` on a file its
engine would refuse (naming the variable and the file), and the startup log that says which
calibration each checkpoint runs with and warns of a file fitted for another checkpoint."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from decidealot import cli, preflight, registry
from decidealot.contract import ChoiceQuestion, NoulQuestion, ScoreQuestion
from decidealot.providers.laya import calibration as laya_file
from decidealot.validation.labels import LabelError, read_labels


def _write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_label_rows_in_every_form(tmp_path: Path) -> None:
    labels = read_labels(
        _write(
            tmp_path / "labels.jsonl",
            [
                {
                    "state": "s",
                    "question": {
                        "type": "choice",
                        "instructions": "i",
                        "criteria": {"a": "one", "b": "two"},
                    },
                    "gold": "b",
                },
                {
                    "state": {"k": 1},
                    "question": {"type": "score", "criteria": ["x", "y", "z"]},
                    "gold": "2",
                },
                "",
                {"state": ["t"], "question": {"type": "noul", "instructions": "i"}, "gold": "Yes"},
                {"state": "s", "question": {"type": "noul"}, "gold": False},
                {"state": "s", "instructions": "i", "choices": ["p", "q"], "gold": "q"},
                {"state": "s", "choices": {"p": "the p", "q": "the q"}, "gold": "p"},
            ],
        )
    )
    assert [label.line for label in labels] == [1, 2, 4, 5, 6, 7]
    assert [label.gold for label in labels] == [1, 2, 1, 0, 1, 0]
    assert isinstance(labels[0].question, ChoiceQuestion)
    assert isinstance(labels[1].question, ScoreQuestion)
    assert isinstance(labels[2].question, NoulQuestion)
    assert labels[4].question == ChoiceQuestion(criteria={"p": "p", "q": "q"}, instructions="i")
    assert labels[5].question == ChoiceQuestion(
        criteria={"p": "the p", "q": "the q"}, instructions=""
    )


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "not valid JSON"),
        ({"state": "s", "question": {"type": "noul"}}, "needs 'state' and 'gold'"),
        ({"state": "s", "gold": "a"}, "needs 'question' or the shorthand 'choices'"),
        ({"state": 5, "choices": ["a"], "gold": "a"}, "state must be a string"),
        (
            {"state": "s", "question": {"type": "choice", "criteria": {}}, "gold": "a"},
            "question.choice.criteria",
        ),
        ({"state": "s", "question": {"type": "box"}, "gold": 1}, "question.type"),
        ({"state": "s", "choices": ["a", "b"], "gold": "c"}, "gold 'c' is not one of"),
        (
            {"state": "s", "question": {"type": "score", "criteria": ["x", "y"]}, "gold": 2},
            "score gold 2 is outside 0..1",
        ),
        (
            {"state": "s", "question": {"type": "score", "criteria": ["x", "y"]}, "gold": True},
            "score gold must be a level index",
        ),
        ({"state": "s", "question": {"type": "noul"}, "gold": "maybe"}, "noul gold must be"),
    ],
)
def test_a_bad_row_is_an_error_naming_its_line(tmp_path: Path, row: Any, message: str) -> None:
    good = {"state": "s", "question": {"type": "noul"}, "gold": "yes"}
    path = _write(tmp_path / "labels.jsonl", [good, good, row])
    with pytest.raises(LabelError) as caught:
        read_labels(path)
    assert str(caught.value).startswith(f"{path}:3: ")
    assert message in str(caught.value)


def test_an_empty_label_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(LabelError, match="no rows"):
        read_labels(_write(tmp_path / "labels.jsonl", ["", "  "]))


# -- the startup checks ------------------------------------------------------------------------

LAYA_CONFIG = {"encoder": "e", "head_layers": 2, "temperature": [1.5, 1.5, 1.5]}
GOOD_LAYA = laya_file.payload(
    [1.2, 0.3, 2.0], {"choice:2": 1.1}, model_id_or_path="x", config=LAYA_CONFIG
)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("{", "calibration.json is not valid JSON (Expecting property name"),
        ([1, 2], "calibration.json is not a JSON object but an array"),
        ({**GOOD_LAYA, "temperature": [1, 2]}, "temperature must be a list of 3 numbers"),
        ({**GOOD_LAYA, "temperature": "abc"}, "temperature must be a list of 3 numbers"),
        ({**GOOD_LAYA, "temperature_by_options": [1]}, "temperature_by_options must be an object"),
        ({**GOOD_LAYA, "version": 1.5}, "version must be an integer"),
        ({**GOOD_LAYA, "binning_map": {"choice:2": {"bins": 2, "values": [0.5]}}}, "length 2"),
        ({**GOOD_LAYA, "binning_map": {"choice:2": {"bins": 1, "values": [1.5]}}}, "in [0, 1]"),
        (
            {**GOOD_LAYA, "binning_map": {"choice:2": {"bins": True, "values": [0.5]}}},
            '"bins" >= 1',
        ),
    ],
)
def test_a_laya_file_laya_would_refuse_is_named(body: Any, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    settings = registry.settings(laya_english_calibration=path, von_enabled=False)
    (line,) = preflight.calibration_problems(settings)
    assert line.startswith(f"DECIDEALOT_LAYA_ENGLISH_CALIBRATION={path}: ")
    assert problem in line


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("nope", "marker_calibration.json is not valid JSON (Expecting value"),
        ({"temperature": "warm"}, "temperature must be a number"),
        (
            {"temperature": 1.0, "independent_options": "yes"},
            "independent_options must be a boolean",
        ),
    ],
)
def test_a_von_file_von_cannot_run_is_named(body: Any, problem: str, tmp_path: Path) -> None:
    path = tmp_path / "marker_calibration.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    settings = registry.settings(von_calibration=path, laya_enabled=False)
    (line,) = preflight.calibration_problems(settings)
    assert line.startswith(f"DECIDEALOT_VON_CALIBRATION={path}: ") and problem in line


def test_serve_stops_before_listening_on_a_bad_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("DECIDEALOT_"):
            monkeypatch.delenv(name)
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({**GOOD_LAYA, "temperature": 2.0}))
    monkeypatch.setenv("DECIDEALOT_LAYA_TYPED_DECISIONS_CALIBRATION", str(path))
    monkeypatch.setenv("DECIDEALOT_VON_ENABLED", "false")
    monkeypatch.setenv("DECIDEALOT_DEVICE", "cpu")
    monkeypatch.setattr("decidealot.http.server.run", lambda *a: pytest.fail("it listened"))
    assert cli.main(["serve"]) == 1
    err = capsys.readouterr().err
    assert f"DECIDEALOT_LAYA_TYPED_DECISIONS_CALIBRATION={path}: temperature must be" in err


def test_a_calibration_setting_is_refused_while_its_provider_is_off(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{}")
    with pytest.raises(Exception, match="DECIDEALOT_VON_CALIBRATION is set but"):
        registry.from_env(
            {"DECIDEALOT_VON_ENABLED": "false", "DECIDEALOT_VON_CALIBRATION": str(path)}
        )


def test_startup_says_which_calibration_each_checkpoint_runs_with(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = {}
    for key in ("english", "multilingual", "typed-decisions"):
        folder = tmp_path / key
        folder.mkdir()
        (folder / "rl_agent_config.json").write_text(
            json.dumps({**LAYA_CONFIG, "max_len": len(key)})
        )
        checkpoints[f"laya_{key.replace('-', '_')}_checkpoint"] = folder
    von = tmp_path / "von"
    von.mkdir()
    (von / "marker_calibration.json").write_text(
        json.dumps({"independent_options": True, "model_id": "von-1.2.0"})
    )
    # fitted for english, set for multilingual (configs differ); english's own file; none for typed
    fitted = {**GOOD_LAYA, "config": laya_file.config_identity({**LAYA_CONFIG, "max_len": 7})}
    (tmp_path / "english.json").write_text(json.dumps(fitted))
    (tmp_path / "von.json").write_text(
        json.dumps({"independent_options": False, "weights_id": "von-1.2.0"})
    )
    settings = registry.settings(
        **checkpoints,
        von_checkpoint=von,
        laya_english_calibration=tmp_path / "english.json",
        laya_multilingual_calibration=tmp_path / "english.json",
        von_calibration=tmp_path / "von.json",
    )
    with caplog.at_level(logging.INFO, logger="decidealot.preflight"):
        preflight.report_calibrations(settings)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    english = f"DECIDEALOT_LAYA_ENGLISH_CALIBRATION={tmp_path / 'english.json'}"
    multilingual = f"DECIDEALOT_LAYA_MULTILINGUAL_CALIBRATION={tmp_path / 'english.json'}"
    assert ("INFO", f"laya-english runs with calibration {english}") in lines
    assert ("INFO", "laya-typed-decisions runs with its checkpoint's own calibration") in lines
    warned = [message for level, message in lines if level == "WARNING"]
    assert not any(m.startswith(english) and "fitted for" in m for m in warned)
    assert any(m.startswith(multilingual) and "config differs" in m for m in warned)
    assert any(
        m.startswith(english) and "outside [0.5, 5]" in m and "0.3 -> 0.5" in m for m in warned
    )
    assert any(
        m.startswith("DECIDEALOT_VON_CALIBRATION") and "independent_options=False" in m
        for m in warned
    )


@pytest.fixture
def environ(environ: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The shared one (no DECIDEALOT_* variables), on CPU."""
    environ.setenv("DECIDEALOT_DEVICE", "cpu")
    return environ


def test_calibrate_names_a_bad_row_before_loading_anything(
    environ: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {"state": "s", "choices": ["a", "b"], "gold": "a"}
    path = _write(tmp_path / "labels.jsonl", [good, {**good, "gold": "c"}])
    assert cli.main(["calibrate", str(path), "--model", "laya-english"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"decidealot: {path}:2: gold 'c' is not one of the criteria's labels ['a', 'b']"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("laya", "routes each request to one of several checkpoints"),
        ("clm-0.1-8b", "not an enabled local checkpoint that takes a calibration file"),
    ],
)
def test_calibrate_takes_a_selector_naming_one_checkpoint(
    environ: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    model: str,
    message: str,
) -> None:
    path = _write(tmp_path / "labels.jsonl", [{"state": "s", "choices": ["a"], "gold": "a"}])
    assert cli.main(["calibrate", str(path), "--model", model]) == 2
    err = capsys.readouterr().err
    assert message in err and "laya-english" in err


def test_the_settings_reach_the_engines(tmp_path: Path) -> None:
    """Each calibration setting is handed to its worker's engine for its own checkpoint."""
    laya_path, von_path = tmp_path / "laya.json", tmp_path / "von.json"
    settings = registry.settings(
        laya_multilingual_calibration=laya_path, von_calibration=von_path, device="cpu"
    )
    specs = {}
    for name in ("laya", "von"):
        descriptor = registry.descriptor(name)
        provider = descriptor.build(settings, descriptor.of(settings))
        specs[name] = provider.runtime.spec  # type: ignore[attr-defined]
    assert specs["laya"].options["calibrations"] == {"multilingual": str(laya_path)}
    assert specs["von"].options["calibrations"] == {"von-1.1": str(von_path)}
    plain = registry.descriptor("von").build(
        registry.settings(), registry.settings().sections["von"]
    )
    assert "calibrations" not in plain.runtime.spec.options  # type: ignore[attr-defined]
