"""No request breaks the execution path, over the real `decidealot serve` on tiny checkpoints.

One worker pass at a time (`DECIDEALOT_WORKER_PASSES=1`, as on the CUDA lane) and a short pass
timeout: a request of many passes finishes and never trips the watchdog; a small request that
arrives while a large one runs waits about one pass; abandoned requests stop costing anything;
the work bound answers 422 before any pass; every example request of the contract passes
under the default bound.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.servers import RunningServer, start_server, wait_until

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT.parent / "shared" / "seeds" / "003_84c1f9f9d3d5180b.txt"


def post(server: RunningServer, path: str, body: object, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=timeout)


@pytest.fixture(scope="module")
def checkpoints(tiny: TinyCheckpoints) -> dict[str, str]:
    laya = tiny.laya_all()
    return {
        "DECIDEALOT_VON_CHECKPOINT": str(tiny.von(independent_options=False)),
        **laya_settings(laya),
    }


def _serve(folder: Path, checkpoints: dict[str, str], **env: str) -> Iterator[RunningServer]:
    """`decidealot serve` on the tiny checkpoints, one pass at a time on one torch thread."""
    server = start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_WORKER_PASSES="1",
        **checkpoints,
        **env,
    )
    yield server
    assert server.stop(30) == 0


@pytest.fixture(scope="module")
def unbounded(tmp_path_factory: pytest.TempPathFactory, checkpoints) -> Iterator[RunningServer]:
    """One pass at a time of at most 1024 tokens, a 1 s pass timeout, no work bound (`0`
    turns it off), bodies up to 16 MiB."""
    laya_only = {k: v for k, v in checkpoints.items() if not k.startswith("DECIDEALOT_VON_")}
    yield from _serve(
        tmp_path_factory.mktemp("unbounded"),
        laya_only,
        DECIDEALOT_PROVIDER_TIMEOUT_SECONDS="1",
        DECIDEALOT_BATCH_TOKEN_BUDGET="1024",
        DECIDEALOT_MAX_REQUEST_TOKENS="0",
        DECIDEALOT_MAX_REQUEST_BYTES=str(16 * 1024 * 1024),
        DECIDEALOT_VON_ENABLED="false",
    )


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory, checkpoints) -> Iterator[RunningServer]:
    """Laya and Von with the default work bound and admission."""
    yield from _serve(tmp_path_factory.mktemp("defaults"), checkpoints)


def heavy(questions: int, options: int = 20, tag: str = "") -> dict[str, object]:
    """A Laya request of `questions` choice questions of `options` options each."""
    criteria = {f"option_{k}": f"Route it to team {k} {tag}" for k in range(options)}
    return {
        "model": "laya-english",
        "state": f"A customer wrote in about a duplicate charge {tag}.",
        "questions": {
            f"q{n}": {"type": "choice", "instructions": f"Case {n}?", "criteria": criteria}
            for n in range(questions)
        },
    }


SMALL = {
    "model": "laya-english",
    "state": "I was charged twice.",
    "questions": {"billing": {"type": "noul", "instructions": "Is this about billing?"}},
}


def test_a_request_of_many_passes_never_trips_the_pass_timeout(unbounded: RunningServer) -> None:
    assert post(unbounded, "/v1/systemone", SMALL).status_code == 200  # the worker is loaded
    # The request must outlast one pass timeout (1 s) to show that the timeout bounds each pass,
    # not the request. A quiet machine answered 600 questions in 0.95 s and 1024 (the most one
    # request may ask) in 1.5 s, so a batch of 1024-question requests doubles until it outlasts.
    for requests in (1, 2, 4, 8):
        passes_before = unbounded.metric("decidealot_forward_pass_seconds_count")
        started = time.monotonic()
        if requests == 1:
            response = post(unbounded, "/v1/systemone", heavy(1024))
            answered = [response.json()] if response.status_code == 200 else []
        else:
            batch = {"requests": [heavy(1024, tag=str(n)) for n in range(requests)]}
            response = post(unbounded, "/v1/systemone/batch", batch)
            answered = response.json()["results"] if response.status_code == 200 else []
        took = time.monotonic() - started
        assert response.status_code == 200, response.text
        assert [len(one["answers"]) for one in answered] == [1024] * requests
        passes = unbounded.metric("decidealot_forward_pass_seconds_count") - passes_before
        assert passes > 30 * requests  # cut into passes within the token budget, each reported
        if took > 1:  # longer in all than one pass may take
            break
    else:
        pytest.fail(f"{requests} requests of 1024 questions took only {took:.2f} s")
    assert unbounded.metric("decidealot_worker_failures_total") == 0
    assert unbounded.metric("decidealot_worker_restarts_total") == 0


def test_a_small_request_waits_about_one_pass_behind_a_large_one(unbounded: RunningServer) -> None:
    alone = post(unbounded, "/v1/systemone", SMALL).json()
    passes = "decidealot_forward_pass_seconds_count"
    before = unbounded.metric(passes)
    with ThreadPoolExecutor(2) as pool:
        large = pool.submit(post, unbounded, "/v1/systemone", heavy(600, tag="large"))
        wait_until(lambda: unbounded.metric(passes) - before >= 2, "the large request's passes")
        sent = unbounded.metric(passes)
        small = post(unbounded, "/v1/systemone", SMALL)
        small_took = unbounded.metric(passes) - sent  # in passes, whatever the machine's speed
        large_done = large.result()
        large_left = unbounded.metric(passes) - sent
    assert small.status_code == large_done.status_code == 200
    # the same answer as alone (fp32 rounding of a differently padded pass aside)
    got, expected = small.json()["answers"]["billing"], alone["answers"]["billing"]
    assert got["noul"] == pytest.approx(expected["noul"], abs=1e-5)
    assert small_took < 0.5 * large_left, (small_took, large_left)


def test_abandoned_requests_are_withdrawn_and_a_small_one_answers_soon(
    unbounded: RunningServer,
) -> None:
    started = time.monotonic()
    assert post(unbounded, "/v1/systemone", heavy(300, tag="alone")).status_code == 200
    # Each abandoned request takes at least as long as this one did alone; its client hangs up
    # at a third of that, on a fast machine as on a slow one (a fixed 1 s was shorter than
    # the first one's passes on a quiet machine).
    hang_up = (time.monotonic() - started) / 3
    cancelled_before = unbounded.metric("decidealot_requests_cancelled_total", provider="laya")
    withdrawn_before = unbounded.metric("decidealot_jobs_withdrawn_total", provider="laya")
    passes_before = unbounded.metric("decidealot_forward_pass_seconds_count")

    def abandon(n: int) -> None:
        with pytest.raises(httpx.TimeoutException):
            post(unbounded, "/v1/systemone", heavy(300, tag=f"abandoned {n}"), timeout=hang_up)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(abandon, range(8)))
    started = time.monotonic()
    response = post(unbounded, "/v1/systemone", SMALL)
    assert response.status_code == 200
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 10
    while unbounded.metric("decidealot_requests_cancelled_total", provider="laya") < (
        cancelled_before + 8
    ):
        assert time.monotonic() < deadline, "the server never noticed the clients had gone"
        time.sleep(0.1)
    withdrawn = unbounded.metric("decidealot_jobs_withdrawn_total", provider="laya")
    assert withdrawn - withdrawn_before >= 1
    # eight 300-question requests run to the end take far more passes than what ran
    ran = unbounded.metric("decidealot_forward_pass_seconds_count") - passes_before
    time.sleep(1)
    assert unbounded.metric("decidealot_forward_pass_seconds_count") - passes_before <= ran + 2


def test_a_request_over_the_work_bound_is_refused_before_any_pass(defaults: RunningServer) -> None:
    assert post(defaults, "/v1/systemone", SMALL).status_code == 200
    passes_before = defaults.metric("decidealot_forward_pass_seconds_count")
    response = post(defaults, "/v1/systemone", heavy(600))  # no pass ran for it: see the end
    assert response.status_code == 422
    (issue,) = response.json()["detail"]
    assert issue["loc"] == ["body", "questions"]
    cost = int(re.search(r"costs (\d+) model tokens", issue["msg"])[1])  # type: ignore[index]
    assert cost > 32768
    assert "DECIDEALOT_MAX_REQUEST_TOKENS" in issue["msg"] and "at most 32768" in issue["msg"]
    batch = post(defaults, "/v1/systemone/batch", {"requests": [SMALL, heavy(600)]})
    assert batch.status_code == 422
    assert batch.json()["detail"][0]["loc"] == ["body", "requests", 1, "questions"]
    assert defaults.metric("decidealot_forward_pass_seconds_count") - passes_before <= 1


_CURL = re.compile(r'^curl .*"\$base_url(/v1/systemone[^"]*)"')


def _contract_examples() -> list[tuple[str, object]]:
    """(path, body) of every request example in the contract that a local model answers: each
    `curl ... "$base_url/v1/systemone..."` with its `--data '...'` body."""
    examples: list[tuple[str, object]] = []
    path, body = None, None
    for line in CONTRACT.read_text().splitlines():
        if match := _CURL.match(line):
            path, body = match[1], None
        elif path is not None and body is None and "--data '" in line:
            body = line.split("--data '", 1)[1]
        elif body is not None:
            body += "\n" + line
        if path is not None and body is not None and body.rstrip().endswith("'"):
            payload = json.loads(body.rstrip()[:-1])
            items = payload.get("requests", [payload])
            if all(str(item["model"]).startswith(("laya", "von")) for item in items):
                examples.append((path, payload))
            path, body = None, None
    return examples


@pytest.mark.skipif(not CONTRACT.exists(), reason="the contract is in shared/, beside the repo")
def test_every_contract_example_passes_under_the_default_bound(defaults: RunningServer) -> None:
    examples = _contract_examples()
    assert len(examples) >= 4
    for path, body in examples:
        response = post(defaults, path, body)
        assert response.status_code == 200, (path, response.text)
