"""`decidealot serve` answering under calibration files (issue 29), against the upstream packages
given the same checkpoint and the same file.

One server runs `laya-english` with a payload laya 0.4.15's `Agent.save_calibration` wrote
(`DECIDEALOT_LAYA_ENGLISH_CALIBRATION`; temperatures far from 1, per-bucket entries, a binning
map) and Von with a `marker_calibration.json` von-sdk 1.3.7's `von calibrate` writer wrote
(`DECIDEALOT_VON_CALIBRATION`; a map far from the checkpoint's own); another runs the same
checkpoints without them. Over HTTP, the first answers as `laya.load(..., calibration=file)` and
as the von-sdk backend under `VON_CALIBRATION=file` do, within 1e-4; the second answers
otherwise, so a file the server ignored fails the test; `GET /v1/status` names each checkpoint's
file. Both servers run fp32, as parity does (`auto` may run bf16).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from decidealot.contract import Answer
from decidealot.jobs import Decision
from decidealot.validation.requests import question_issues
from tests.parity import test_calibration_parity as calibration_parity
from tests.parity import test_laya_parity as laya_parity
from tests.parity import test_von_parity as von_parity
from tests.parity.test_laya_parity import unrounded_upstream  # noqa: F401  (autouse: laya unrounded)
from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.questions import TICKET_QUESTIONS as QUESTIONS
from tests.support.servers import RunningServer, start_server
from tests.support.von_answers import assert_same

laya = pytest.importorskip("laya")
von_upstream_calibrate = pytest.importorskip("von.calibrate")

STATE = {"ticket": "The customer was charged twice for order 84213.", "tier": "gold"}
RANDOM_REQUESTS = 10
VON_MAP = {"bias": 7.5, "entropy": 0.0, "log_tokens": 0.0, "n_options": 0.0, "lo": 0.5, "hi": 12.0}
"""T = 7.5 on every row, where the checkpoint's own map (`DEFAULT_CALIBRATION_MAP` of
`decidealot.providers.von.tiny`) gives 1.2 to 2."""


@pytest.fixture(scope="module")
def laya_paths(tiny: TinyCheckpoints) -> dict[str, Path]:
    return tiny.laya_all()


@pytest.fixture(scope="module")
def von_path(tiny: TinyCheckpoints) -> Path:
    return tiny.von(**von_parity.VARIANTS["independent"])


@pytest.fixture(scope="module")
def files(
    laya_paths: dict[str, Path], von_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The two calibration files, each written by its upstream package."""
    folder = tmp_path_factory.mktemp("calibrations")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp warning
        writer = laya.load(str(laya_paths["english"]), device="cpu")
    laya_file = calibration_parity._upstream_laya_file(writer, folder / "laya-english.json")
    von_file = folder / "marker_calibration.json"
    fitted = {"calibration_map": VON_MAP, "report": {"n": 40, "folds": 2, "winner": "map"}}
    von_upstream_calibrate.write_calibration(
        str(von_file), str(von_path), fitted, str(folder / "labels.jsonl")
    )
    return {"laya": laya_file, "von": von_file}


def _serve(folder: Path, laya_paths: dict[str, Path], von_path: Path, **env: str) -> RunningServer:
    """`decidealot serve` on the tiny checkpoints, Laya and Von resident together."""
    settings = {
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_TORCH_THREADS": "1",
        "DECIDEALOT_PRECISION": "fp32",
        "DECIDEALOT_MAX_RESIDENT_PROVIDERS": "2",
        "DECIDEALOT_VON_CHECKPOINT": str(von_path),
        **laya_settings(laya_paths),
    }
    return start_server(folder, launcher="decidealot", args=("serve",), **(settings | env))


@pytest.fixture(scope="module")
def calibrated(
    tmp_path_factory: pytest.TempPathFactory,
    laya_paths: dict[str, Path],
    von_path: Path,
    files: dict[str, Path],
) -> Iterator[RunningServer]:
    server = _serve(
        tmp_path_factory.mktemp("calibrated"),
        laya_paths,
        von_path,
        DECIDEALOT_LAYA_ENGLISH_CALIBRATION=str(files["laya"]),
        DECIDEALOT_VON_CALIBRATION=str(files["von"]),
    )
    yield server
    assert server.stop(30) == 0


@pytest.fixture(scope="module")
def plain(
    tmp_path_factory: pytest.TempPathFactory, laya_paths: dict[str, Path], von_path: Path
) -> Iterator[RunningServer]:
    server = _serve(tmp_path_factory.mktemp("plain"), laya_paths, von_path)
    yield server
    assert server.stop(30) == 0


def decide(server: RunningServer, model: str, state: Any, questions: dict[str, Any]) -> Decision:
    """The server's answer, as the engine's `Decision` the parity helpers compare."""
    body = {"model": model, "state": state, "questions": questions}
    response = httpx.post(server.url + "/v1/systemone", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answered = response.json()
    return Decision(
        model=answered["model"],
        answers=msgspec.convert(answered["answers"], dict[str, Answer]),
        input_tokens=answered["usage"]["input_tokens"],
    )


def served(questions: dict[str, Any]) -> bool:
    """Whether the HTTP API takes these questions: the parity generators also make criteria
    that are numbers, which engines answer and the contract refuses (422)."""
    return not any(question_issues(question)[1] for question in questions.values())


def laya_requests() -> list[tuple[Any, dict[str, Any]]]:
    """The fixed request (a choice, a score, a noul) and random ones of the Laya parity tests
    that the API takes, as laya takes them (a missing instruction is the question's name)."""
    rng = random.Random("laya-calibrated-serve")
    requests: list[tuple[Any, dict[str, Any]]] = [(STATE, QUESTIONS)]
    while len(requests) <= RANDOM_REQUESTS:
        request = laya_parity._request(rng)
        questions = laya_parity._upstream_questions(request)
        if served(questions):
            requests.append((request.state, questions))
    return requests


def von_requests() -> list[tuple[Any, dict[str, Any]]]:
    """The fixed request and random ones of the Von parity tests that the API takes."""
    rng = random.Random("von-calibrated-serve")
    requests: list[tuple[Any, dict[str, Any]]] = [(STATE, QUESTIONS)]
    while len(requests) <= RANDOM_REQUESTS:
        state, questions = von_parity._request(rng)
        if served(questions):
            requests.append((state, questions))
    return requests


def test_laya_answers_as_laya_with_the_same_file(
    calibrated: RunningServer,
    plain: RunningServer,
    laya_paths: dict[str, Path],
    files: dict[str, Path],
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # laya warns of the temperatures it clamps
        agent = laya.load(str(laya_paths["english"]), device="cpu", calibration=str(files["laya"]))
    compared = moved = 0
    for state, questions in laya_requests():
        try:
            theirs = agent.system_one(state, questions)
        except ValueError as exc:  # more options than markers fit: a 422 here, as in parity
            assert "option markers fit" in str(exc)
            continue
        ours = decide(calibrated, "laya-english", state, questions)
        assert ours.model == "laya-english"
        laya_parity._assert_parity(ours, theirs)
        compared += 1
        moved += ours.answers != decide(plain, "laya-english", state, questions).answers
    assert compared >= 8
    assert moved == compared  # the file moved every answer: the server did not ignore it


def test_von_answers_as_von_sdk_with_the_same_file(
    calibrated: RunningServer,
    plain: RunningServer,
    von_path: Path,
    files: dict[str, Path],
    tmp_path: Path,
) -> None:
    from von.backends.option_marker_backend import OptionMarkerBackend

    with pytest.MonkeyPatch.context() as env:
        settings = {
            **von_parity._UPSTREAM_ENV,
            "VON_DEVICE": "cpu",
            "XDG_CACHE_HOME": str(tmp_path),
            "VON_CALIBRATION": str(files["von"]),
        }
        for name, value in settings.items():
            env.setenv(name, value)
        env.delenv("VON_MAX_STATE_TOKENS")  # von-sdk's default 8192, the server's window
        upstream = OptionMarkerBackend(checkpoint_dir=str(von_path), device="cpu")
        upstream._get_model()  # reads VON_CALIBRATION as it loads
    assert upstream._calib_map is not None and upstream._calib_map["bias"] == VON_MAP["bias"]
    moved = 0
    for state, questions in von_requests():
        ours = decide(calibrated, "von", state, questions)
        assert_same(ours.answers, ours.answers, upstream.evaluate(state, questions))
        moved += ours.answers != decide(plain, "von", state, questions).answers
    assert moved == RANDOM_REQUESTS + 1


def test_status_names_each_checkpoints_file(
    calibrated: RunningServer, plain: RunningServer, files: dict[str, Path]
) -> None:
    """Per checkpoint: a multilingual request on the calibrated server loads a checkpoint that
    has no file, and answers as the plain server's."""
    expected = {"english": str(files["laya"]), "multilingual": None, "von-1.1": str(files["von"])}
    for server in (calibrated, plain):
        for model in ("laya-english", "laya-multilingual", "von"):
            decide(server, model, STATE, QUESTIONS)
    multilingual = [
        decide(server, "laya-multilingual", STATE, QUESTIONS).answers
        for server in (calibrated, plain)
    ]
    assert multilingual[0] == multilingual[1]
    for server, files_of in ((calibrated, expected), (plain, dict.fromkeys(expected))):
        status = httpx.get(server.url + "/v1/status").json()
        named = {
            checkpoint["name"]: checkpoint["calibration"]
            for provider in status["providers"]
            for checkpoint in provider["checkpoints"]
        }
        assert named == files_of
