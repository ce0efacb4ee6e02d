"""CLM's work and memory bounds over a real `decidealot serve` (CLM only, its head in a real
worker process, 4096-wide vectors from the loopback fake embeddings endpoint).

- `DECIDEALOT_MAX_REQUEST_TOKENS`: a request whose estimated encoder tokens plus head rows
  pass the bound is a 422 at `body.questions` before any encoder call; so is one that needs
  more distinct vectors than half a worker frame holds, whatever the bound.
- Memory: 400 choice questions over the same 255 labels carry 256 distinct vectors from the
  encoder client through the frame to the head, so neither the gateway nor the worker grows by
  more than a few tens of MB (each question's own copy would be 1.7 GB of vectors, past the
  1 GiB frame limit), and every answer equals the one question's answer alone.
- The event loop: rendering, de-duplicating and assembling such a request run off it, so
  `/health` answers at once meanwhile.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from decidealot.providers.clm.gateway.provider import MAX_VECTORS, estimated_tokens
from decidealot.providers.clm.tiny import build_clm_head
from tests.support import ops_launcher as ops_server
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.servers import RunningServer, start_server, while_health_polls

TOKEN_LIMIT = 20_000
LABELS = {f"label-{i}": None for i in range(255)}
QUESTIONS = 400
MEMORY_GROWTH_BYTES = 300 * 1024 * 1024
"""Far below the 1.7 GB of vectors a per-question layout would carry."""
STALL_SECONDS = 1.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads peak RSS from /proc")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings(4096).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served(
    fake: FakeEmbeddings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("clm-serve")
    head = build_clm_head(folder / "head.pt", hidden=4096, width=24, proj=8, seed=9)
    server = start_server(
        folder,
        launcher="decidealot",
        args=("serve",),
        DECIDEALOT_LAYA_ENABLED="false",
        DECIDEALOT_VON_ENABLED="false",
        DECIDEALOT_CLM_EMBEDDINGS_URL=fake.url,
        DECIDEALOT_CLM_HEAD=str(head),
        DECIDEALOT_CLM_ENCODER_RETRY_SECONDS="0",
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_MAX_REQUEST_TOKENS=str(TOKEN_LIMIT),
        DECIDEALOT_PROVIDER_TIMEOUT_SECONDS="120",
    )
    yield server
    assert server.stop() == 0


def _post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def _choice(instructions: str) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, "criteria": LABELS}


def peak_rss(pid: int) -> int:
    """The process's peak resident set so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_over_the_token_bound_is_a_422_before_any_encoder_call(
    served: RunningServer, fake: FakeEmbeddings
) -> None:
    state = "The customer wrote a long message about a charge. " * 140  # 7 KB
    questions = {
        f"q{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(10)
    }
    texts = [f"{state.strip()}\n\nIs point {i} raised?" for i in range(10)]
    options = [f"{side}{text}" for i in range(10) for side, text in (
        ("false: No. This is false: ", f"Is point {i} raised?"),
        ("true: Yes. This is true: ", f"Is point {i} raised?"),
    )]  # fmt: skip
    cost = sum(map(estimated_tokens, texts + options)) + len(texts) + len(options)
    assert cost > TOKEN_LIMIT
    fake.reset()

    single = _post(
        served, "/v1/systemone", {"model": "clm", "state": state, "questions": questions}
    )
    assert single.status_code == 422, single.text
    [issue] = single.json()["detail"]
    assert issue["loc"] == ["body", "questions"]
    assert f"costs {cost} model tokens" in issue["msg"]
    assert "DECIDEALOT_MAX_REQUEST_TOKENS" in issue["msg"] and str(TOKEN_LIMIT) in issue["msg"]
    assert fake.calls == []  # refused before any encoder call

    small = {"model": "clm", "state": "Charged twice.", "questions": {"urgent": questions["q0"]}}
    heavy = {"model": "clm", "state": state, "questions": questions}
    batch = _post(served, "/v1/systemone/batch", {"requests": [small, heavy]})
    assert batch.status_code == 422, batch.text
    assert [i["loc"] for i in batch.json()["detail"]] == [["body", "requests", 1, "questions"]]
    assert not any(state.strip() in text for call in fake.calls for text in call)

    assert _post(served, "/v1/systemone", small).status_code == 200


def test_more_distinct_vectors_than_half_a_frame_is_a_422(
    served: RunningServer, fake: FakeEmbeddings
) -> None:
    count = MAX_VECTORS // 255 + 1
    questions = {
        f"q{i}": {"type": "choice", "criteria": {f"{i}-{j}": None for j in range(255)}}
        for i in range(count)
    }
    fake.reset()
    response = _post(
        served, "/v1/systemone", {"model": "clm", "state": "s", "questions": questions}
    )
    assert response.status_code == 422, response.text[:300]
    [issue] = response.json()["detail"]
    assert issue["loc"] == ["body", "questions"]
    assert f"needs {count * 255 + 1} distinct encoder vectors" in issue["msg"]
    assert f"at most {MAX_VECTORS}" in issue["msg"]
    assert fake.calls == []


def test_repeated_labels_cost_their_distinct_vectors_only(
    served: RunningServer, fake: FakeEmbeddings
) -> None:
    state = {"customer": "Ana", "message": "I was charged twice"}
    one = {"model": "clm", "state": state, "questions": {"only": _choice("Route it.")}}
    alone = _post(served, "/v1/systemone", one)
    assert alone.status_code == 200, alone.text  # the worker is up; its baseline is in
    worker = next(iter(ops_server.children(served.process.pid)))
    gateway_before, worker_before = peak_rss(served.process.pid), peak_rss(worker)
    fake.reset()

    questions = {f"q{i}": _choice("Route it.") for i in range(QUESTIONS)}
    body = msgspec.json.encode({"model": "clm", "state": state, "questions": questions})
    timed = while_health_polls(served.url, "/v1/systemone", body)
    many = timed.response
    assert many.status_code == 200, many.text[:500]
    assert timed.slowest_health < STALL_SECONDS, f"/health took {timed.slowest_health:.2f} s"

    assert sum(map(len, fake.calls)) == 1  # the state; the labels came from the cache
    gateway_growth = peak_rss(served.process.pid) - gateway_before
    worker_growth = peak_rss(worker) - worker_before
    assert gateway_growth < MEMORY_GROWTH_BYTES, f"gateway grew {gateway_growth / 2**20:.0f} MiB"
    assert worker_growth < MEMORY_GROWTH_BYTES, f"worker grew {worker_growth / 2**20:.0f} MiB"
    expected = alone.json()["answers"]["only"]
    answers = many.json()["answers"]
    assert len(answers) == QUESTIONS
    assert all(answer == expected for answer in answers.values())
    assert math.isclose(sum(expected["probabilities"].values()), 1.0, rel_tol=1e-9)
