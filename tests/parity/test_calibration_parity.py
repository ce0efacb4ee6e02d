"""Calibration files against the upstream packages, both directions, and fits against theirs.

Laya (laya 0.4.15): a payload written by `Agent.save_calibration` (temperatures inside and outside
laya's clamp, per-bucket entries, a binning map) loads here and every answer equals the agent's
with `calibration=` that file; a file `decidealot calibrate` fits loads in laya without a
warning and answers the same there; our fit equals `Agent.fit_temperatures` on
`records_from_labeled` of the same rows, bucket temperatures included (their floor lowered on
both sides so a small label set reaches it).

Von (von-sdk 1.3.7): the rows `von calibrate` records equal ours, its cross-validated map equals
ours, and the file it writes (`VON_CALIBRATION`) and the one we write each answer the same in
the backend and in our engine. Label states are strings (`von calibrate` replays other states
as JSON text; see providers/von/calibrate.py).
"""

from __future__ import annotations

import json
import math
import os
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decidealot.contract import Labelled, Question
from decidealot.jobs import EngineSpec, Job
from decidealot.providers import calibrate
from decidealot.providers.engine.planner import run_together
from decidealot.providers.laya import calibrate as laya_calibrate
from decidealot.providers.laya.tiny import VARIANTS
from decidealot.providers.laya.worker.engine import LayaEngine
from decidealot.providers.laya.worker.engine import create as create_laya
from decidealot.providers.von import calibrate as von_calibrate
from decidealot.providers.von.worker.engine import VonEngine
from decidealot.providers.von.worker.engine import create as create_von
from decidealot.providers.worker.readout import softmax
from decidealot.validation.labels import row as label_row
from tests.parity import test_laya_parity as laya_parity
from tests.parity import test_von_parity as von_parity
from tests.support.checkpoints import TinyCheckpoints
from tests.support.labels import label_rows
from tests.support.von_answers import assert_same

laya = pytest.importorskip("laya")
laya_agent = pytest.importorskip("laya.agent")
laya_upstream_calibrate = pytest.importorskip("laya.calibrate")
von_upstream_calibrate = pytest.importorskip("von.calibrate")

TOLERANCE = 1e-4
REQUESTS = 25


@pytest.fixture(autouse=True)
def unrounded_upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """laya rounds answers to 4 decimals with the builtin `round`; compare full precision."""
    monkeypatch.setattr(laya_agent, "round", lambda value, digits=None: value, raising=False)


def _labels(rows: list[dict[str, Any]]) -> list[Labelled]:
    return [label_row(raw, line) for line, raw in enumerate(rows, 1)]


def _setup(checkpoint: Path, key: str, labels: list[Labelled], **kw: Any) -> calibrate.Setup:
    return calibrate.Setup(
        checkpoint=checkpoint,
        key=key,
        current=None,
        labels=labels,
        labels_path=Path("labels.jsonl"),
        device="cpu",
        precision="fp32",
        torch_threads=0,
        **kw,
    )


# -- Laya ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def laya_checkpoints(tiny: TinyCheckpoints) -> dict[str, Path]:
    return tiny.laya_all(seeds={v: i for i, v in enumerate(VARIANTS)})


def _laya_engine(key: str, path: Path, calibration: Path | None) -> LayaEngine:
    return create_laya(
        EngineSpec(
            factory="decidealot.providers.laya.worker.engine:create",
            checkpoints={key: str(path)},
            # parity is fp32's; auto, the default, may run bf16
            options={"precision": "fp32"}
            | ({"calibrations": {key: str(calibration)}} if calibration else {}),
        )
    )


def _assert_laya_parity(engine: LayaEngine, agent: Any, key: str, seed: str) -> int:
    """Random requests answered alike; returns how many compared."""
    rng = random.Random(seed)
    compared = 0
    for _ in range(REQUESTS):
        request = laya_parity._request(rng)
        try:
            theirs = agent.system_one(request.state, laya_parity._upstream_questions(request))
        except ValueError:
            continue  # the marker overflow, compared in test_laya_parity
        laya_parity._assert_parity(laya_parity._decide(engine, key, request), theirs)
        compared += 1
    return compared


def _upstream_laya_file(agent: Any, path: Path) -> Path:
    """A payload as `save_calibration` writes it, with entries laya clamps and a binning map."""
    agent.temperature = [2.5, 0.2, 7.0]  # the last two outside [0.5, 5]: clamped on load
    agent.temperature_by_options = {"choice:3-5": 0.7, "noul:2": 3.1, "score:3-5": float("nan")}
    agent.binning_map = {"choice:2": {"bins": 4, "values": [0.1, 0.4, 0.6, 0.95]}}
    agent.save_calibration(str(path))
    return path


def test_laya_loads_upstream_files_as_upstream(
    laya_checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    key = "english"
    path = laya_checkpoints[key]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp
        writer = laya.load(str(path), device="cpu")
    file = _upstream_laya_file(writer, tmp_path / "calibration.json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent = laya.load(str(path), device="cpu", calibration=str(file))
    assert any("outside" in str(w.message) for w in caught)  # laya warned of the clamp
    ours = _laya_engine(key, path, file)
    assert _assert_laya_parity(ours, agent, key, "laya-calibrated") >= 15
    # the file changed the answers (the test can fail): ours without it differ from laya's
    plain = _laya_engine(key, path, None)
    request = laya_parity._request(random.Random("laya-calibrated"))
    with_file = laya_parity._decide(ours, key, request).answers
    without = laya_parity._decide(plain, key, request).answers
    assert with_file != without


def _laya_fit_rows() -> list[dict[str, Any]]:
    return label_rows(3, 45)


def _nll(records: list[laya_calibrate.Record], temperatures: dict[str, float]) -> float:
    """Mean NLL of `records` under per-bucket temperatures (the ones the fit chose)."""
    total = 0.0
    for r in records:
        probs = softmax(r.logits, temperatures[r.bucket])
        total -= math.log(probs[r.gold])
    return total / len(records)


def test_laya_fit_equals_upstream_fit(
    laya_checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our records and temperatures against laya's `records_from_labeled` and
    `fit_temperature_map` on the same rows, with the bucket floor lowered on both sides so
    buckets are fitted too.

    Given laya's own records our fit is laya's, bit for bit. From our engine's logits (within
    1e-5 of laya's) the temperatures agree within 1% and the NLL they reach within 1e-5: laya's
    LBFGS (lr 0.1, 100 iterations) stops wherever its tolerance is met, and on a flat NLL (a
    random model, T near 4) a logit moved by 1e-6 moves that stop by up to ~0.3%.
    """
    monkeypatch.setattr(laya_upstream_calibrate, "MIN_BUCKET_N", 8)
    monkeypatch.setattr(laya_calibrate, "MIN_BUCKET_N", 8)
    key = "typed-decisions"
    path = laya_checkpoints[key]
    labels = _labels(_laya_fit_rows())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        agent = laya.load(str(path), device="cpu")
    pairs = []
    for label in labels:
        question = msgspec.to_builtins(label.question)
        k = 2 if question["type"] == "noul" else len(question["criteria"])
        target = [0.0] * k
        target[label.gold] = 1.0
        pairs.append((label.state, {"q": question}, {"q": target}))
    theirs = laya_upstream_calibrate.records_from_labeled(agent, pairs)
    upstream = laya_upstream_calibrate.fit_temperature_map(theirs)

    engine = _laya_engine(key, path, None)
    rows, skipped = calibrate.collect(engine, laya_calibrate._read, _setup(path, key, labels))
    assert not skipped and len(rows) == len(theirs)
    ours = [laya_calibrate.Record(*r.record, r.label.gold) for r in rows]
    for record, (qtype, logits, target, k) in zip(ours, theirs, strict=True):
        assert (record.qtype, len(record.logits), record.gold) == (qtype, k, target.argmax())
        assert record.logits == pytest.approx(logits.tolist(), abs=1e-5)

    given_theirs = laya_calibrate.fit_temperatures(
        [laya_calibrate.Record(q, z.tolist(), int(t.argmax())) for q, z, t, _ in theirs]
    )
    assert given_theirs.temperature == upstream["temperature"]
    assert given_theirs.temperature_by_options == upstream["temperature_by_options"]
    assert len(upstream["temperature_by_options"]) >= 3  # buckets were fitted

    outcome = laya_calibrate.fit(_setup(path, key, labels))
    assert outcome.rows == len(labels) and not outcome.skipped
    body = outcome.body
    assert body["temperature"] == pytest.approx(upstream["temperature"], rel=0.01)
    assert body["temperature_by_options"].keys() == upstream["temperature_by_options"].keys()
    for bucket, value in upstream["temperature_by_options"].items():
        assert body["temperature_by_options"][bucket] == pytest.approx(value, rel=0.01)
    for fitted in (body, upstream):
        by_bucket = {
            r.bucket: fitted["temperature_by_options"].get(r.bucket, fitted["temperature"][r.qtype])
            for r in ours
        }
        fitted["nll"] = _nll(ours, by_bucket)
    assert body["nll"] == pytest.approx(upstream["nll"], abs=1e-5)


def test_laya_file_we_fit_loads_in_laya(laya_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    key = "english"
    path = laya_checkpoints[key]
    outcome = laya_calibrate.fit(_setup(path, key, _labels(_laya_fit_rows())))
    file = tmp_path / "ours.json"
    calibrate.write_fitted(file, outcome.body)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent = laya.load(str(path), device="cpu", calibration=str(file))
    assert not [w for w in caught if "fitted for" in str(w.message)]  # this checkpoint's file
    assert agent.temperature == pytest.approx(outcome.body["temperature"])
    assert agent.temperature_by_options == {}
    assert _assert_laya_parity(_laya_engine(key, path, file), agent, key, "laya-ours") >= 15


# -- Von -------------------------------------------------------------------------------------

VON_FOLDS = 2


@pytest.fixture(scope="module")
def von_checkpoint(tiny: TinyCheckpoints) -> Path:
    return tiny.von(**von_parity.VARIANTS["independent"])


@pytest.fixture
def von_env(tmp_path: Path) -> Iterator[None]:
    """The environment upstream runs under in the Von parity tests (and `von calibrate` sets
    two of these itself), restored afterwards."""
    env = {**von_parity._UPSTREAM_ENV, "VON_DEVICE": "cpu", "XDG_CACHE_HOME": str(tmp_path)}
    saved = {key: os.environ.get(key) for key in [*env, "VON_CALIBRATION"]}
    os.environ.update(env)
    os.environ.pop("VON_CALIBRATION", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _von_engine(path: Path, calibration: Path | None) -> VonEngine:
    return create_von(
        EngineSpec(
            factory="decidealot.providers.von.worker.engine:create",
            checkpoints={"von-1.1": str(path)},
            options={
                "max_state_tokens": von_parity.MAX_STATE_TOKENS,
                "precision": "fp32",  # parity is fp32's; auto, the default, may run bf16
                **({"calibrations": {"von-1.1": str(calibration)}} if calibration else {}),
            },
        )
    )


def _assert_von_parity(path: Path, file: Path, seed: str) -> None:
    """Upstream with `VON_CALIBRATION=file` and our engine with the file answer alike."""
    from von.backends.option_marker_backend import OptionMarkerBackend

    os.environ["VON_CALIBRATION"] = str(file)
    upstream = OptionMarkerBackend(checkpoint_dir=str(path), device="cpu")
    upstream._get_model()
    assert upstream._calib_map is not None or upstream._default_temp != 1.0  # the file loaded
    ours = _von_engine(path, file)
    rng = random.Random(seed)
    for _ in range(REQUESTS):
        state, questions = von_parity._request(rng)
        job = Job(
            checkpoint="von-1.1",
            state=state,
            questions=msgspec.convert(questions, dict[str, Question]),
        )
        (decision,) = run_together(ours, [ours.prepare(job)])
        assert_same(decision.answers, decision.answers, upstream.evaluate(state, questions))


@pytest.fixture(scope="module")
def von_rows() -> list[dict[str, Any]]:
    return label_rows(5, 24)


def test_von_records_and_fit_equal_von_calibrate(
    von_checkpoint: Path, von_rows: list[dict[str, Any]], von_env: None, tmp_path: Path
) -> None:
    labels_path = tmp_path / "labels.jsonl"
    labels_path.write_text("".join(json.dumps(r) + "\n" for r in von_rows))
    rows = von_upstream_calibrate.load_rows(str(labels_path))
    theirs = von_upstream_calibrate.collect(rows, str(von_checkpoint), "cpu", log=lambda m: None)
    labels = _labels(von_rows)
    engine = _von_engine(von_checkpoint, None)
    setup = _setup(von_checkpoint, "von-1.1", labels, folds=VON_FOLDS)
    collected, skipped = calibrate.collect(
        engine, lambda p, o: von_calibrate._read(engine, p, o), setup
    )
    assert not skipped and len(collected) == len(theirs)
    records = []
    for row, record in zip(collected, theirs, strict=True):
        logits, feats = row.record
        gold = von_calibrate._von_order(row)[0]
        assert gold == record["gold"]
        assert logits == pytest.approx(record["logits"], abs=TOLERANCE)
        assert feats == pytest.approx(record["feats"], abs=1e-5)  # entropy: of the logits
        records.append(von_calibrate.Record(logits, feats, gold))
    upstream_fit = von_upstream_calibrate.fit_map(
        theirs, folds=VON_FOLDS, seed=0, log=lambda m: None
    )
    our_fit = von_calibrate.fit_map(records, VON_FOLDS, 0, None)
    assert our_fit["report"]["winner"] == upstream_fit["report"]["winner"]
    for kind, value in upstream_fit["report"]["cv_nll"].items():
        assert our_fit["report"]["cv_nll"][kind] == pytest.approx(value, abs=2e-4)
    for name, value in upstream_fit["calibration_map"].items():
        assert our_fit["calibration_map"][name] == pytest.approx(value, abs=1e-3), name
    # their file, here
    file = tmp_path / "marker_calibration.json"
    von_upstream_calibrate.write_calibration(
        str(file), str(von_checkpoint), upstream_fit, str(labels_path)
    )
    _assert_von_parity(von_checkpoint, file, "von-theirs")


def test_von_file_we_fit_loads_in_von(
    von_checkpoint: Path, von_rows: list[dict[str, Any]], von_env: None, tmp_path: Path
) -> None:
    outcome = von_calibrate.fit(
        _setup(von_checkpoint, "von-1.1", _labels(von_rows), folds=VON_FOLDS)
    )
    shipped = json.loads((von_checkpoint / "marker_calibration.json").read_text())
    body = outcome.body
    assert body["independent_options"] == shipped["independent_options"]  # carried over
    assert body["calibration_map"] != shipped["calibration_map"]
    file = tmp_path / "ours.json"
    calibrate.write_fitted(file, body)
    _assert_von_parity(von_checkpoint, file, "von-ours")


PAYLOADS: list[Any] = [
    {"temperature": [1, 2, 3]},
    {"version": 2, "temperature": [1.0, "x", None], "temperature_by_options": None},
    {"version": "2", "temperature": [True, 0.1, 9], "temperature_by_options": {"noul:2": "7"}},
    {"version": 2.0, "temperature": [1, 1, 1], "binning_map": {}},
    {"version": 2, "temperature": [1, 1, 1], "binning_map": {"a": {"bins": 1, "values": [1]}}},
    [1, 2, 3],
    {"temperature": [1, 2]},
    {"temperature": {"a": 1, "b": 2, "c": 3}},
    {"temperature": "abc"},
    {"version": 1.9, "temperature": [1, 1, 1]},
    {"version": "two", "temperature": [1, 1, 1]},
    {"version": True, "temperature": [1, 1, 1]},
    {"version": [2], "temperature": [1, 1, 1]},
    {"temperature": [1, 1, 1], "temperature_by_options": [["choice:2", 1]]},
    {"temperature": [1, 1, 1], "binning_map": []},
    {"temperature": [1, 1, 1], "binning_map": {"a": [0.5]}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 0, "values": []}}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 2.0, "values": [0, 1]}}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 2, "values": [0, "1"]}}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 2, "values": [0, True]}}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 2, "values": [0, 1.5]}}},
    {"temperature": [1, 1, 1], "binning_map": {"a": {"bins": 1, "values": [float("nan")]}}},
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_laya_files_are_refused_and_clamped_as_laya_does(payload: Any) -> None:
    """`apply_calibration_payload` refuses exactly the payloads our startup check refuses, and
    installs the temperatures ours apply."""
    from types import SimpleNamespace

    from decidealot.providers.laya.calibration import CalibrationError, Temperatures, parse

    agent = SimpleNamespace(model_id_or_path=None, subfolder=None, cfg=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            laya_upstream_calibrate.apply_calibration_payload(agent, payload)
        except ValueError:
            with pytest.raises(CalibrationError):
                parse(payload)
            return
    applied = Temperatures.of(parse(payload))
    assert applied.by_type == agent.temperature
    assert applied.by_options == agent.temperature_by_options
