"""A fake TypeSafe: the hosted API's published contract over real HTTP, for tests.

`FakeTypeSafe` is a plain ASGI app implementing `GET /v1/models` and `POST /v1/systemone` as
typesafe-sdk 0.7.5 describes them (bearer auth, zstd request bodies, FastAPI-style 422s,
`x-typesafe-request-id` on every response). Answers are computed from the request: hashed
logits per label, softmax, TypeSafe's reported confidence formulas; so they are deterministic
but differ with every state, question and label. Tests switch failure modes by queueing
`Fault`s (one per request) or setting a persistent one per route, and read what arrived in
`received`. `serve(fake)` runs it with uvicorn on a loopback port in a background thread.

The fake is stricter than TypeSafe in one way: question objects with unknown keys are refused,
so a request that drifts from the SDK's shape fails loudly in tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
import zstandard

MODELS_PATH = "/v1/models"
SYSTEM_ONE_PATH = "/v1/systemone"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

DEFAULT_MODELS: tuple[dict[str, str], ...] = (
    {
        "name": "jev-latest",
        "description": "General-purpose system one model.",
        "release_date": "2026-09-15",
    },
    {
        "name": "jev-1.13.0",
        "description": "Jev 1.13.0 system one model.",
        "release_date": "2026-09-15",
    },
    {
        "name": "jev-preview",
        "description": "Preview of the next Jev release.",
        "release_date": "2026-10-01",
    },
)
DEFAULT_ALIASES = {"jev-latest": "jev-1.13.0"}
_QUESTION_KEYS = {"type", "instructions", "criteria"}


@dataclass(frozen=True)
class Fault:
    """How the fake treats one request: wait `delay` seconds, then answer normally when
    `status` is None, else with `status`, `headers` and the raw `body`."""

    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"detail": "Injected failure."}'
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    """One request as it arrived: lower-cased headers, body after content decoding."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FakeTypeSafe:
    """The fake's state; every field may be changed by a test between requests."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.url = ""
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.models: list[dict[str, str]] = [dict(m) for m in DEFAULT_MODELS]
        self.aliases: dict[str, str] = dict(DEFAULT_ALIASES)
        self.faults: dict[str, deque[Fault]] = {MODELS_PATH: deque(), SYSTEM_ONE_PATH: deque()}
        self.persistent: dict[str, Fault | None] = {MODELS_PATH: None, SYSTEM_ONE_PATH: None}
        self.corrupt: Callable[[dict[str, Any]], Any] | None = None
        self.received: list[Received] = []

    def fail_next(self, path: str, *faults: Fault) -> None:
        self.faults[path].extend(faults)

    def calls(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.path == path]

    # -- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            request_id = f"req_{len(self.received) + 1:06d}"
        status, extra, payload = await self._handle(scope["method"], scope["path"], headers, raw)
        response_headers = [
            (b"content-type", b"application/json"),
            (b"x-typesafe-request-id", request_id.encode()),
            *((k.encode(), v.encode()) for k, v in extra.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})

    async def _handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        encoding = headers.get("content-encoding", "identity")
        if encoding == "zstd":
            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        elif encoding != "identity":
            return 415, {}, _detail(f"Unsupported Content-Encoding {encoding!r}.")
        with self._lock:
            self.received.append(Received(method, path, headers, raw))
        routes = {("GET", MODELS_PATH), ("POST", SYSTEM_ONE_PATH)}
        if (method, path) not in routes:
            return 404, {}, _detail("Not Found")
        # The worst an upstream could do: echo the credential it refused.
        presented = headers.get("authorization", "")
        if presented != f"Bearer {self.api_key}":
            return 401, {}, _detail(f"Invalid API key {presented!r}.")
        queued = self.faults[path]
        fault = queued.popleft() if queued else self.persistent[path]
        if fault is not None:
            await asyncio.sleep(fault.delay)
            if fault.status is not None:
                return fault.status, fault.headers, fault.body
        if path == MODELS_PATH:
            return 200, {}, json.dumps({"models": self.models}).encode()
        return self._system_one(raw)

    def _system_one(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        try:
            body = json.loads(raw)
        except ValueError:
            return 422, {}, _issues([(["body"], "JSON decode error", "json_invalid")])
        issues = _request_issues(body, {m["name"] for m in self.models})
        if issues:
            return 422, {}, _issues(issues)
        answer: Any = answer_request(body, self.aliases.get(body["model"], body["model"]))
        if self.corrupt is not None:
            answer = self.corrupt(answer)
        return 200, {}, json.dumps(answer).encode()


# -- request checks (TypeSafe's published schema) --------------------------------------------

_Issue = tuple[list[str | int], str, str]


def _is_content(value: Any) -> bool:
    return isinstance(value, str | dict | list)


def _request_issues(body: Any, models: set[str]) -> list[_Issue]:
    if not isinstance(body, dict):
        return [(["body"], "Input should be a valid dictionary", "dict_type")]
    issues: list[_Issue] = []
    for name in ("state", "model", "questions"):
        if name not in body:
            issues.append((["body", name], "Field required", "missing"))
    if "state" in body and not _is_content(body["state"]):
        issues.append((["body", "state"], "Input should be a string, object or array", "type"))
    model = body.get("model")
    if "model" in body and (not isinstance(model, str) or model not in models):
        issues.append((["body", "model"], f"Unknown model {model!r}", "value_error"))
    questions = body.get("questions")
    if "questions" in body:
        if not isinstance(questions, dict) or not questions:
            issues.append((["body", "questions"], "Should have at least 1 item", "too_short"))
        else:
            for name, question in questions.items():
                issues += _question_issues(["body", "questions", name], question)
    return issues


def _question_issues(loc: list[str | int], question: Any) -> list[_Issue]:
    if not isinstance(question, dict) or question.get("type") not in ("noul", "choice", "score"):
        return [([*loc, "type"], "Input tag should be 'noul', 'choice' or 'score'", "union_tag")]
    kind = question["type"]
    loc = [*loc, kind]
    issues: list[_Issue] = []
    for key in question.keys() - _QUESTION_KEYS:
        issues.append(([*loc, key], "Extra inputs are not permitted", "extra_forbidden"))
    instructions = question.get("instructions")
    if instructions is not None and not _is_content(instructions):
        issues.append(([*loc, "instructions"], "Input should be content", "type"))
    criteria = question.get("criteria")
    if kind == "choice":
        if not isinstance(criteria, dict) or not criteria:
            issues.append(([*loc, "criteria"], "Should be a nonempty object", "dict_type"))
        elif not all(v is None or _is_content(v) for v in criteria.values()):
            issues.append(([*loc, "criteria"], "Values should be content or null", "type"))
    elif kind == "score":
        if not isinstance(criteria, list) or not criteria:
            issues.append(([*loc, "criteria"], "Should have at least 1 item", "too_short"))
        elif not all(_is_content(v) for v in criteria):
            issues.append(([*loc, "criteria"], "Levels should be content", "type"))
    elif criteria is not None and (
        not isinstance(criteria, dict) or not criteria.keys() <= {"true", "false"}
    ):
        issues.append(([*loc, "criteria"], "Keys should be true and false", "extra_forbidden"))
    return issues


def _detail(message: str) -> bytes:
    return json.dumps({"detail": message}).encode()


def _issues(issues: list[_Issue]) -> bytes:
    detail = [{"loc": loc, "msg": msg, "type": kind} for loc, msg, kind in issues]
    return json.dumps({"detail": detail}).encode()


# -- answers ---------------------------------------------------------------------------------


def answer_request(body: dict[str, Any], model: str) -> dict[str, Any]:
    """TypeSafe's answer shape for `body`, computed from its content; `model` as reported."""
    state = body["state"]
    answers = {name: _answer(state, name, question) for name, question in body["questions"].items()}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    usage = {"input_tokens": len(canonical) // 4, "output_tokens": len(answers)}
    return {"model": model, "answers": answers, "usage": usage}


def _answer(state: Any, name: str, question: dict[str, Any]) -> dict[str, Any]:
    context = [state, name, question.get("instructions")]
    if question["type"] == "noul":
        return {"type": "noul", "noul": round(_sigmoid(_logit(*context, question)), 6)}
    criteria = question["criteria"]
    labels = list(criteria) if question["type"] == "choice" else list(range(len(criteria)))
    logits = [_logit(*context, label, criteria[label]) for label in labels]
    probabilities = _softmax(logits)
    best = max(range(len(labels)), key=probabilities.__getitem__)
    if question["type"] == "choice":
        n = len(labels)
        confidence = 1.0 if n == 1 else (probabilities[best] - 1 / n) / (1 - 1 / n)
        return {
            "type": "choice",
            "choice": labels[best],
            "confidence": round(confidence, 6),
            "probabilities": {
                str(k): round(p, 6) for k, p in zip(labels, probabilities, strict=True)
            },
        }
    spread = sum(p * abs(i - best) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - best) for i in labels) / len(labels)
    return {
        "type": "score",
        "score": round(sum(i * p for i, p in enumerate(probabilities)), 6),
        "confidence": round(max(0.0, 1 - spread / uniform) if uniform else 1.0, 6),
        "legend": {str(i): level for i, level in enumerate(criteria)},
        "probabilities": {str(i): round(p, 6) for i, p in enumerate(probabilities)},
    }


def _logit(*parts: Any) -> float:
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 6.0 - 3.0


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


# -- serving ---------------------------------------------------------------------------------


@contextmanager
def serve(fake: FakeTypeSafe) -> Iterator[FakeTypeSafe]:
    """Run `fake` on a free loopback port in a background thread; `fake.url` is its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        fake,
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the fake TypeSafe server did not start")
        time.sleep(0.01)
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(timeout=10.0)
        sock.close()
