"""`decidealot evaluate` as a user runs it: against a real `decidealot serve` (tiny random Laya
checkpoints, CPU; Jev through a fake TypeSafe) with `--url`, the key from DECIDEALOT_API_KEY or
`--key-file`, rows sent as batch requests; and in this process's own service (Laya and Von on
von's label format, CLM over a fake embeddings endpoint, Jev). The report's numbers are
laya-evals' on its own answer records; the gate exits 1 on a limit or a baseline it misses and
2 on a row the model refuses; `/metrics`' confidence histogram moves with the answers served.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.cli import run_cli
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.fake_typesafe import FakeTypeSafe, serve
from tests.support.labels import label_rows, write_labels
from tests.support.servers import RunningServer, start_server

evals = pytest.importorskip("laya.evals")

API_KEY, TYPESAFE_KEY = "evaluate-key-51c2", "typesafe-key-90aa"
TIMEOUT = 600
ROWS, BATCH = 12, 5


def laya_rows(count: int) -> list[dict[str, Any]]:
    """laya-evals rows: a choice, a noul and a score question on each, every one labelled."""
    out = []
    for i, row in enumerate(label_rows(11, count * 3, shorthand=False)[::3]):
        out.append(
            {
                "state": f"Ticket {i}: {row['state']}",
                "questions": {
                    "route": {
                        "type": "choice",
                        "instructions": "Where does it go?",
                        "criteria": {"billing": "Payments", "tech": "Software", "other": "Rest"},
                    },
                    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
                    "priority": {"type": "score", "criteria": ["low", "mid", "high"]},
                },
                "expected": {
                    "route": ("billing", "tech", "other")[i % 3],
                    "urgent": i % 2 == 0,
                    "priority": i % 3,
                },
                "tags": ["even" if i % 2 == 0 else "odd"],
            }
        )
    return out


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def typesafe() -> Iterator[FakeTypeSafe]:
    with serve(FakeTypeSafe(TYPESAFE_KEY)) as fake:
        yield fake


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, tiny: TinyCheckpoints, typesafe: FakeTypeSafe
) -> Iterator[RunningServer]:
    server = start_server(
        tmp_path_factory.mktemp("evaluate"),
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_VON_ENABLED="false",
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_API_KEY=API_KEY,
        DECIDEALOT_TYPESAFE_API_KEY=TYPESAFE_KEY,
        DECIDEALOT_TYPESAFE_BASE_URL=typesafe.url,
        **laya_settings(tiny.laya_all()),
    )
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rows(tmp_path_factory.mktemp("data") / "tickets.jsonl", laya_rows(ROWS))


def metric(server: RunningServer, name: str, **labels: str) -> float:
    """`RunningServer.metric`, scraped with the key this server asks for."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    text = httpx.get(server.url + "/metrics", headers=headers, timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def evaluate(*args: str, **env: str) -> Any:
    return run_cli("evaluate", *args, timeout=TIMEOUT, OMP_NUM_THREADS="1", **env)


def laya_evals_overall(report: dict[str, Any]) -> dict[str, float]:
    """laya-evals' `overall` for the answers the report's cases hold, as laya scores them."""
    rows: dict[str, dict[str, Any]] = {}
    for i, case in enumerate(report["cases"]):
        key = f"{case['model']}|{case['qid']}|{i}"  # one example per case: the same records
        rows[key] = {"case": case}
    examples = [
        evals.Example(
            state=key,
            questions={c["case"]["qid"]: {}},
            expected={c["case"]["qid"]: c["case"]["expected"]},
        )
        for key, c in rows.items()
    ]

    class Replay:
        def predict(self, state: str, questions: dict[str, Any]) -> dict[str, Any]:
            case = rows[state]["case"]
            return {"model": case["model"], "answers": {case["qid"]: case["answer"]}}

    found = evals.evaluate(Replay(), evals.Dataset(examples)).overall
    return {k: v for k, v in found.items() if not k.endswith("_ms")}


def without_timing(overall: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in overall.items() if not k.endswith("_ms")}


def test_laya_over_url(served: RunningServer, data: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "report.json", tmp_path / "risk.png"
    batches = metric(served, "decidealot_http_requests_total", route="/v1/systemone/batch")
    singles = metric(served, "decidealot_http_requests_total", route="/v1/systemone")
    answered_before = metric(served, "decidealot_answer_confidence_count", model="laya-english")
    result = evaluate(
        str(data),
        "--model=laya-english",
        f"--url={served.url}",
        f"--batch-size={BATCH}",
        f"--json={out}",
        f"--plot={png}",
        "--max-error=0.5",
        DECIDEALOT_API_KEY=API_KEY,
    )
    assert result.returncode == 0, result.stderr
    assert f"decidealot evaluate: {BATCH}/{ROWS} rows" in result.stderr  # progress
    report = json.loads(out.read_text())
    config = report["config"]
    assert config["selector"] == "laya-english" and config["answered"] == ["laya-english"]
    assert config["url"] == served.url and config["schema"] == "decidealot-evaluate-report/1"
    (checkpoint,) = config["checkpoints"]
    assert checkpoint["name"] == "english" and checkpoint["precision"] == "fp32"
    assert checkpoint["calibration"] is None and checkpoint["verified"] is None  # a local folder
    assert config["dataset_sha256"] == evals.file_fingerprint(str(data))
    assert config["questions_sha256"] == evals.questions_fingerprint(
        evals.Dataset.from_jsonl(str(data))
    )
    # the answers came as batches, not one call per row
    batched = metric(served, "decidealot_http_requests_total", route="/v1/systemone/batch")
    assert batched - batches == math.ceil(ROWS / BATCH)
    assert metric(served, "decidealot_http_requests_total", route="/v1/systemone") == singles
    # laya-evals' numbers on the same answer records
    assert len(report["cases"]) == ROWS * 3
    overall = without_timing(report["overall"])
    assert {"choice_accuracy", "noul_accuracy", "score_mae", "ece", "brier", "aurc"} <= set(overall)
    assert overall == pytest.approx(laya_evals_overall(report), rel=1e-12, abs=1e-12)
    assert set(report["slices"]["tag"]) == {"even", "odd"}
    # a table per question, and for the choice the threshold that keeps the error at 0.5
    assert set(report["thresholds"]) == {"route", "urgent", "priority"}
    route = report["thresholds"]["route"]
    assert route["answers"] == ROWS and route["table"][0]["coverage"] == 1.0
    if route["pick"] is not None:
        assert route["pick"]["error"] <= 0.5
    assert "route (choice, 12 judged answers):" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every answer served was observed by the drift histogram, at its reported probability
    answered = metric(served, "decidealot_answer_confidence_count", model="laya-english")
    assert answered - answered_before == ROWS * 3


def test_the_gate(served: RunningServer, data: Path, tmp_path: Path) -> None:
    first = tmp_path / "first.json"
    common = (str(data), "--model=laya-english", f"--url={served.url}", f"--batch-size={BATCH}")
    ran = evaluate(*common, f"--json={first}", DECIDEALOT_API_KEY=API_KEY)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(first.read_text())
    accuracy = report["overall"]["choice_accuracy"]

    # the same model again: which rows share a pass moves the padding, so the last bits of a
    # probability may move; every metric gets a tolerance far below what a reader sees
    noise = [f"--tolerance={m}=1e-6" for m in report["overall"] if not m.endswith("_ms")]
    second = tmp_path / "second.json"
    holds = evaluate(*common, f"--min-accuracy={accuracy}", f"--baseline={first}", *noise,
                     f"--json={second}",
                     DECIDEALOT_API_KEY=API_KEY)  # fmt: skip
    again = json.loads(second.read_text())["overall"]
    drift = {m: abs(again[m] - v) for m, v in report["overall"].items() if not m.endswith("_ms")}
    assert holds.returncode == 0, (holds.stdout, drift)
    assert "choice_accuracy" in holds.stdout and "diff=+0.0000" in holds.stdout

    missed = evaluate(*common, f"--min-accuracy={accuracy + 0.01}", DECIDEALOT_API_KEY=API_KEY)
    assert missed.returncode == 1
    assert f"FAIL: choice_accuracy={accuracy:.4f} is below the minimum" in missed.stderr

    better = tmp_path / "better.json"
    shifted = dict(report, overall=report["overall"] | {"choice_accuracy": accuracy + 0.25})
    better.write_text(json.dumps(shifted))
    regressed = evaluate(*common, f"--baseline={better}", "--tolerance=choice_accuracy=0.2",
                         DECIDEALOT_API_KEY=API_KEY)  # fmt: skip
    assert regressed.returncode == 1
    assert "FAIL: baseline comparison failed" in regressed.stderr
    within = evaluate(*common, f"--baseline={better}", *noise, "--tolerance=choice_accuracy=0.3",
                      DECIDEALOT_API_KEY=API_KEY)  # fmt: skip
    assert within.returncode == 0, within.stderr

    other = tmp_path / "other.json"
    config = report["config"] | {"dataset_sha256": "0" * 64}
    other.write_text(json.dumps(dict(report, config=config)))
    unlike = evaluate(*common, f"--baseline={other}", DECIDEALOT_API_KEY=API_KEY)
    assert unlike.returncode == 1
    assert "FAIL: baseline is not comparable: dataset_sha256" in unlike.stderr


def test_a_row_the_model_refuses_exits_2_naming_it(
    served: RunningServer, data: Path, tmp_path: Path
) -> None:
    rows = laya_rows(3)
    crowded = {f"label{i}": f"a long description number {i}" for i in range(40)}
    rows[2]["questions"]["route"]["criteria"] = crowded  # more options than Laya reads
    rows[2]["expected"]["route"] = "label3"
    bad = write_rows(tmp_path / "bad.jsonl", rows)
    result = evaluate(str(bad), "--model=laya-english", f"--url={served.url}",
                      DECIDEALOT_API_KEY=API_KEY)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert (
        f"decidealot evaluate: {bad}:3: laya-english refused it: questions.route" in result.stderr
    )


def test_jev_over_url_with_a_key_file(
    served: RunningServer, typesafe: FakeTypeSafe, data: Path, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(f"\n{API_KEY}\n")
    out = tmp_path / "jev.json"
    calls = len(typesafe.calls("/v1/systemone"))
    result = evaluate(str(data), "--model=jev-latest", f"--url={served.url}",
                      f"--key-file={key_file}", f"--json={out}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(typesafe.calls("/v1/systemone")) - calls == ROWS  # TypeSafe has no batch route
    report = json.loads(out.read_text())
    assert report["config"]["checkpoints"] == []  # hosted: no checkpoint of ours answered
    assert report["config"]["answered"] and len(report["cases"]) == ROWS * 3
    overall = without_timing(report["overall"])
    assert overall == pytest.approx(laya_evals_overall(report), rel=1e-12, abs=1e-12)

    refused = evaluate(str(data), "--model=jev-latest", f"--url={served.url}")
    assert refused.returncode == 2
    assert "refused the key" in refused.stderr
    unknown = evaluate(str(data), "--model=jev-nope", f"--url={served.url}",
                       DECIDEALOT_API_KEY=API_KEY)  # fmt: skip
    assert unknown.returncode == 2 and "--model jev-nope: not a model" in unknown.stderr


@pytest.mark.parametrize("selector", ["laya-english", "von"])
def test_in_this_process_on_von_labels(
    tiny: TinyCheckpoints, tmp_path: Path, selector: str
) -> None:
    labels = write_labels(tmp_path / "labels.jsonl", label_rows(5, 18))
    out = tmp_path / "report.json"
    checkpoints = (
        {**laya_settings(tiny.laya_all()), "DECIDEALOT_VON_ENABLED": "false"}
        if selector.startswith("laya")
        else {
            "DECIDEALOT_VON_CHECKPOINT": str(tiny.von(independent_options=True)),
            "DECIDEALOT_LAYA_ENABLED": "false",
        }
    )
    result = evaluate(
        str(labels),
        f"--model={selector}",
        f"--json={out}",
        "--batch-size=8",
        "--score-within=0.5",
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_MODEL_DIR=str(tmp_path / "models"),
        **checkpoints,
    )
    assert result.returncode == 0, result.stderr
    assert "decidealot evaluate: 8/18 rows" in result.stderr
    report = json.loads(out.read_text())
    assert report["config"]["url"] is None
    (checkpoint,) = report["config"]["checkpoints"]
    assert checkpoint["name"] == ("english" if selector.startswith("laya") else "von-1.1")
    assert set(report["thresholds"]) == {"choice", "score", "noul"}  # von rows: by type
    assert "score_within_0.5" in report["overall"]
    overall = without_timing(report["overall"])
    upstream = laya_evals_overall(report)
    assert {k: v for k, v in overall.items() if k != "score_within_0.5"} == pytest.approx(
        upstream, rel=1e-12, abs=1e-12
    )


def test_clm_in_this_process(tiny: TinyCheckpoints, data: Path, tmp_path: Path) -> None:
    embeddings = FakeEmbeddings(4096).start()
    try:
        out = tmp_path / "clm.json"
        result = evaluate(
            str(data),
            "--model=clm",
            f"--json={out}",
            DECIDEALOT_LAYA_ENABLED="false",
            DECIDEALOT_VON_ENABLED="false",
            DECIDEALOT_CLM_EMBEDDINGS_URL=embeddings.url,
            DECIDEALOT_CLM_HEAD=str(tiny.clm(hidden=4096, width=24, proj=8, seed=3)),
            DECIDEALOT_DEVICE="cpu",
            DECIDEALOT_TORCH_THREADS="1",
        )
    finally:
        embeddings.stop()
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["config"]["answered"] == ["clm-0.1-8b"]
    assert report["config"]["checkpoints"] == []  # a CLM head reports no load to /v1/status
    overall = without_timing(report["overall"])
    assert overall == pytest.approx(laya_evals_overall(report), rel=1e-12, abs=1e-12)


def test_jev_in_this_process(typesafe: FakeTypeSafe, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "jev.json"
    calls = len(typesafe.calls("/v1/systemone"))
    result = evaluate(
        str(data),
        "--model=jev-latest",
        f"--json={out}",
        DECIDEALOT_LAYA_ENABLED="false",
        DECIDEALOT_VON_ENABLED="false",
        DECIDEALOT_TYPESAFE_API_KEY=TYPESAFE_KEY,
        DECIDEALOT_TYPESAFE_BASE_URL=typesafe.url,
    )
    assert result.returncode == 0, result.stderr
    assert len(typesafe.calls("/v1/systemone")) - calls == ROWS
    report = json.loads(out.read_text())
    assert report["config"]["checkpoints"] == [] and len(report["cases"]) == ROWS * 3


def test_the_confidence_histogram_moves_with_requests(gateway: RunningServer) -> None:
    """The fakes answer uniformly: a choice of 4 labels at 0.25, of 2 at 0.5, a noul at 0.5."""

    def histogram(**labels: str) -> dict[str, float]:
        return {
            "count": gateway.metric("decidealot_answer_confidence_count", **labels),
            "sum": gateway.metric("decidealot_answer_confidence_sum", **labels),
            "le_0.3": gateway.metric("decidealot_answer_confidence_bucket", le="0.3", **labels),
            "le_0.5": gateway.metric("decidealot_answer_confidence_bucket", le="0.5", **labels),
        }

    def decide(labels: int, times: int) -> None:
        criteria = {f"l{i}": f"label {i}" for i in range(labels)}
        body = {
            "model": "laya",
            "state": "drift",
            "questions": {"q": {"type": "choice", "criteria": criteria}, "n": {"type": "noul"}},
        }
        for _ in range(times):
            response = httpx.post(gateway.url + "/v1/systemone", json=body, timeout=30)
            assert response.status_code == 200, response.text

    choice = {"provider": "laya", "model": "laya", "type": "choice"}
    before = histogram(**choice)
    noul_before = histogram(provider="laya", model="laya", type="noul")["count"]
    decide(labels=4, times=3)
    after = histogram(**choice)
    assert after["count"] - before["count"] == 3
    assert after["sum"] - before["sum"] == pytest.approx(0.75)
    assert after["le_0.3"] - before["le_0.3"] == 3
    assert histogram(provider="laya", model="laya", type="noul")["count"] - noul_before == 3
    decide(labels=2, times=2)  # the inputs change: the distribution moves up
    moved = histogram(**choice)
    assert moved["le_0.3"] == after["le_0.3"]
    assert moved["le_0.5"] - after["le_0.5"] == 2
    assert moved["sum"] - after["sum"] == pytest.approx(1.0)
