"""`decidealot calibrate` as a user runs it, on tiny checkpoints: no server, the report, the file in
the upstream format (that it loads upstream is tests/parity/test_calibration_parity.py), the
plot, progress, skipped rows with their reason, and the file it writes accepted by `serve`'s
startup checks."""

from __future__ import annotations

import json
from pathlib import Path

from decidealot.providers.laya import calibration as laya_file
from decidealot.providers.von import calibration as von_file
from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.cli import run_cli
from tests.support.labels import label_rows, write_labels

TIMEOUT = 600


def _checkpoints(tiny: TinyCheckpoints) -> dict[str, str]:
    laya = tiny.laya_all()
    return {
        **laya_settings(laya),
        "DECIDEALOT_VON_CHECKPOINT": str(tiny.von(independent_options=True)),
        "DECIDEALOT_DEVICE": "cpu",
        "OMP_NUM_THREADS": "1",
    }


def test_laya(tiny: TinyCheckpoints, tmp_path: Path) -> None:
    crowded = {
        "state": "x",
        "question": {
            "type": "choice",
            "instructions": "Pick one.",
            "criteria": {f"label{i}": f"a long description number {i}" for i in range(40)},
        },
        "gold": "label3",
    }
    labels = write_labels(tmp_path / "labels.jsonl", [*label_rows(7, 70), crowded])
    out, png = tmp_path / "english.json", tmp_path / "english.png"
    env = _checkpoints(tiny)
    result = run_cli(
        "calibrate",
        str(labels),
        "--model=laya-english",
        f"--out={out}",
        f"--plot={png}",
        timeout=TIMEOUT,
        **env,
    )
    assert result.returncode == 0, result.stderr
    report = result.stdout.splitlines()
    assert "rows used: 70" in report and "rows skipped: 1" in report
    assert any(line.startswith("  line 71: ") and "option" in line for line in report)
    assert any(line.startswith("  choice: temperature ") for line in report)
    for metric in ("log-loss", "Brier", "ECE"):
        (line,) = [line for line in report if line.strip().startswith(metric)]
        before, after = (float(value) for value in line.split()[1:])
        assert before > 0 and after > 0
    assert "decidealot calibrate: 64/71 rows" in result.stderr  # progress
    assert f"export DECIDEALOT_LAYA_ENGLISH_CALIBRATION={out}" in report[-1]
    payload = laya_file.read_calibration(out)
    assert (
        payload.version == 2
        and payload.model_id_or_path == env["DECIDEALOT_LAYA_ENGLISH_CHECKPOINT"]
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the file it wrote passes the startup checks `serve` runs (no warning: this checkpoint's)
    checked = run_cli(
        "prepare", DECIDEALOT_LAYA_ENGLISH_CALIBRATION=str(out), timeout=TIMEOUT, **env
    )
    assert checked.returncode == 0, checked.stderr
    assert "runs with calibration DECIDEALOT_LAYA_ENGLISH_CALIBRATION" in checked.stderr
    assert "fitted for" not in checked.stderr


def test_von(tiny: TinyCheckpoints, tmp_path: Path) -> None:
    labels = write_labels(tmp_path / "labels.jsonl", label_rows(8, 20))
    out = tmp_path / "marker_calibration.json"
    env = _checkpoints(tiny)
    result = run_cli(
        "calibrate", str(labels), "--model=von", f"--out={out}", "--folds=2", timeout=TIMEOUT, **env
    )
    assert result.returncode == 0, result.stderr
    assert "rows used: 20" in result.stdout and "2-fold CV NLL" in result.stdout
    written = json.loads(out.read_text())
    shipped = json.loads(
        Path(env["DECIDEALOT_VON_CHECKPOINT"], "marker_calibration.json").read_text()
    )
    assert written["independent_options"] == shipped["independent_options"]
    assert set(written["calibration_map"]) == {
        "bias",
        "entropy",
        "log_tokens",
        "n_options",
        "lo",
        "hi",
    }
    assert written["calibration_report"]["n"] == 20
    assert von_file.check(out) is None
