"""A deterministic OpenAI-compatible `/v1/embeddings` server on a loopback port, for tests.

It is a real HTTP server on its own thread, so synchronous clients (upstream's `requests`
embedder) and the gateway's async client can both use it. Each text's vector is a Gaussian
seeded by the text's sha256; its token count is its whitespace word count plus one. `mode`
switches failure behaviour, `stop()`/`start()` take it down and back on the same port, and
`calls` records every request's inputs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Mode = Literal["ok", "slow", "wrong_width", "nan", "bad_base64", "error500"]


def fake_vector(text: str, width: int) -> list[float]:
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    return [rng.gauss(0.0, 1.0) for _ in range(width)]


def fake_tokens(text: str) -> int:
    return len(text.split()) + 1


class FakeEmbeddings:
    def __init__(self, width: int = 16, *, slow_seconds: float = 2.0):
        self.width = width
        self.mode: Mode = "ok"
        self.failures_left: int | None = None
        """With a failure mode: fail this many calls, then answer normally (None: always)."""
        self.force_encoding: Literal["float", "base64"] | None = None
        self.slow_seconds = slow_seconds
        self.calls: list[list[str]] = []
        self.auth_headers: list[str | None] = []
        self.traceparents: list[str | None] = []
        self.paths: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeEmbeddings:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def reset(self) -> None:
        self.mode, self.failures_left, self.force_encoding = "ok", None, None
        self.calls.clear()
        self.auth_headers.clear()
        self.traceparents.clear()
        self.paths.clear()

    def _failing(self) -> Mode:
        if self.mode == "ok":
            return "ok"
        if self.failures_left is None:
            return self.mode
        if self.failures_left > 0:
            self.failures_left -= 1
            return self.mode
        return "ok"

    def respond(self, body: dict[str, object]) -> tuple[int, bytes]:
        texts = body["input"]
        assert isinstance(texts, list)
        self.calls.append(list(texts))
        mode = self._failing()
        if mode == "error500":
            return 500, b'{"error": "boom"}'
        if mode == "slow":
            time.sleep(self.slow_seconds)
        encoding = self.force_encoding or body.get("encoding_format", "float")
        width = self.width + 1 if mode == "wrong_width" else self.width
        data = []
        for index, text in enumerate(texts):
            vector = fake_vector(text, width)
            if mode == "nan":
                vector[3] = float("nan")
            if encoding == "base64":
                embedding: object = base64.b64encode(struct.pack(f"<{width}f", *vector)).decode()
                if mode == "bad_base64":  # not in the base64 alphabet
                    embedding = f"!{embedding[1:]}"
            else:
                embedding = vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        data.reverse()  # clients must place rows by index
        usage = sum(fake_tokens(t) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": usage, "total_tokens": usage},
        }
        return 200, json.dumps(payload).encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                fake.paths.append(self.path)
                fake.auth_headers.append(self.headers.get("Authorization"))
                fake.traceparents.append(self.headers.get("traceparent"))
                status, payload = fake.respond(body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
