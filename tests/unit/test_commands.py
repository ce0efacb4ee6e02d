"""The `decidealot` command and its startup checks, called in-process (the quick loop's share of
what tests/e2e/test_cli.py and test_preflight.py run as real processes): settings refused with
one line and exit 2, the local catalog, checkpoints checked before anything starts."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from decidealot import cli, device, preflight, registry
from decidealot.checkpoints.paths import enabled_bundles
from tests.support.cli import NO_LOCAL


def test_a_bad_setting_is_one_line_and_exit_2(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("DECIDEALOT_PORT", "eighty")
    assert cli.main(["models"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == "decidealot: DECIDEALOT_PORT: expected an integer, got 'eighty'"


def test_models_prints_the_enabled_local_selectors(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ.setenv("DECIDEALOT_LAYA_ENABLED", "false")
    assert cli.main(["models"]) == 0
    names = [json.loads(line)["name"] for line in capsys.readouterr().out.splitlines()]
    assert names == [info.name for info in registry.descriptor("von").selectors]


def test_the_module_runs_the_command(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in NO_LOCAL.items():
        environ.setenv(name, value)
    environ.setattr(sys, "argv", ["decidealot", "models"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("decidealot", run_name="__main__", alter_sys=True)
    assert done.value.code == 0 and capsys.readouterr().out == ""


def test_a_checkpoint_missing_a_file_stops_prepare_naming_the_setting_and_the_file(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    own = tmp_path / "von"
    own.mkdir()
    (own / "config.json").write_text("{}")
    for name, value in {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_DEVICE": "cpu"}.items():
        environ.setenv(name, value)
    environ.setenv("DECIDEALOT_VON_CHECKPOINT", str(own))
    assert cli.main(["prepare"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"decidealot: checkpoints cannot be served:\n  DECIDEALOT_VON_CHECKPOINT={own}"
    )
    for missing in ("tokenizer.json", "option_marker.pt", "marker_calibration.json"):
        assert f"{missing} is missing (the Von engine reads it)" in err


def test_a_file_its_engine_cannot_parse_stops_prepare_naming_the_setting_and_the_file(
    environ: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    own = tmp_path / "von"
    own.mkdir()
    for name in registry.descriptor("von").bundles[0].files:
        (own / name).write_text("{}")
    (own / "marker_calibration.json").write_text("{temperature: 2.2}")
    (own / "tokenizer.json").write_text('"a string"')
    for name, value in {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_DEVICE": "cpu"}.items():
        environ.setenv(name, value)
    environ.setenv("DECIDEALOT_VON_CHECKPOINT", str(own))
    assert cli.main(["prepare"]) == 1
    err = capsys.readouterr().err
    where = f"DECIDEALOT_VON_CHECKPOINT={own}"
    assert f"{where}: marker_calibration.json is not valid JSON (" in err
    assert f"{where}: tokenizer.json is not a JSON object (the Von engine reads it)" in err
    assert err.count("(the Von engine reads it)") == 2  # the sound ones pass


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "has no safetensors header"),
        ((2**40).to_bytes(8, "little") + b"{}", "has no safetensors header"),
        ((4).to_bytes(8, "little") + b"{x}!", "has a safetensors header that does not parse"),
        ((2).to_bytes(8, "little") + b"[]", "has a safetensors header that is not a JSON object"),
        ((12).to_bytes(8, "little") + b'{"w":{"a":1}}'[:12], "does not parse"),
        (b"\x10" + b"\0" * 7 + b'{"w": {"x": 1}} ', "lacking its data offsets"),
        (
            b"\x35"
            + b"\0" * 7
            + b'{"w":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}'
            + b"x" * 8,
            "is cut short",
        ),
        (
            b"\x35"
            + b"\0" * 7
            + b'{"w":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}'
            + b"x" * 9,
            None,
        ),
    ],
)
def test_a_safetensors_header_is_read_without_the_package(
    tmp_path: Path, content: bytes, problem: str | None
) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(content)
    found = registry.safetensors_header(weights)
    assert found == problem if problem is None else problem in str(found)


def test_checkpoint_problems_follow_the_descriptors(tmp_path: Path) -> None:
    settings = registry.settings(
        model_dir=tmp_path, clm_embeddings_url="http://127.0.0.1:9/v1", device="cpu"
    )
    placed = {p.name: p for p in enabled_bundles(settings)}
    assert list(placed) == [
        "laya-english",
        "laya-multilingual",
        "laya-typed-decisions",
        "von-1.1",
        "clm-0.1-8b",
    ]
    problems = preflight.checkpoint_problems(settings)
    assert f"bundle von-1.1 (installed at {tmp_path / 'von-1.1'}): the directory is missing" in (
        problems
    )
    head = next(p for p in enabled_bundles(settings) if p.name == "clm-0.1-8b").path(settings)
    assert head == tmp_path / "clm-0.1-8b" / "CLM_v0.1-8B.pt"
    assert f"bundle clm-0.1-8b (installed at {head}): the head file is missing" in problems
    assert preflight.checkpoint_problems(settings, overrides_only=True) == []


def test_cuda_without_a_gpu_is_a_setting_error(environ: pytest.MonkeyPatch) -> None:
    settings = registry.settings(device="cuda", laya_enabled=False)
    environ.setattr(device, "_probe_cuda", lambda python: "cpu")
    with pytest.raises(preflight.ConfigError, match="DECIDEALOT_DEVICE=cuda"):
        preflight.check_device(settings)
