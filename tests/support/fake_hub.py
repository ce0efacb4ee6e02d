"""A local Hugging Face hub that serves file resolution the way huggingface_hub 2.4 asks for it.

`HEAD|GET /{org}/{repo}/resolve/{revision}/{path}`:
- a regular (git) file answers 200 with `ETag: "<git blob sha1>"`, `X-Repo-Commit` and
  `Content-Length`;
- an LFS file answers 302 to a CDN address on another origin (`localhost` instead of the
  server's `127.0.0.1`, so huggingface_hub does not follow it on HEAD) with `X-Linked-Etag:
  "<sha256>"`, `X-Linked-Size` and `X-Repo-Commit`; `GET /cdn/{sha256}` serves the bytes;
- errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) as the hub
  does; `Range: bytes=N-` answers 206 with `Content-Range`.

Faults per file path make it misbehave on purpose: serve other bytes than it announces, cut a
transfer short, stall mid-transfer, or answer an HTTP error. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Fault = Literal["tamper", "truncate_once", "short", "stall", "error500", "missing"]


@dataclass
class HubFile:
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def git_sha1(self) -> str:
        header = b"blob %d\0" % len(self.content)
        return hashlib.sha1(header + self.content, usedforsecurity=False).hexdigest()


@dataclass
class HubRepo:
    commit: str
    files: dict[str, HubFile] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    """Repos, faults and a request log behind a threaded HTTP server on 127.0.0.1."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.faults: dict[str, Fault] = {}  # keyed by file path inside its repo
        self.token: str | None = None  # when set, requests must carry this bearer token
        self.any_revision = False  # a lying mirror: serves its commit for any revision asked
        self.requests: list[Request] = []
        self.stalled = threading.Event()  # set once a stalled transfer has sent its first half
        self.release = threading.Event()  # lets stalled transfers end (by closing)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def add_repo(self, repo_id: str, commit: str, files: dict[str, tuple[bytes, bool]]) -> None:
        """Publish `files` ({path: (content, is_lfs)}) as `repo_id` at `commit`."""
        self.repos[repo_id] = HubRepo(
            commit, {path: HubFile(content, lfs) for path, (content, lfs) in files.items()}
        )

    def record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def count(self, method: str | None = None, path_contains: str = "") -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (method is None or r.method == method) and path_contains in r.path
            )

    def find_blob(self, sha256: str) -> tuple[str, HubFile] | None:
        for repo in self.repos.values():
            for path, file in repo.files.items():
                if file.sha256 == sha256:
                    return path, file
        return None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def running_hub() -> Iterator[FakeHub]:
    hub = FakeHub()
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet test output
            return

        def do_HEAD(self) -> None:
            self.route(body=False)

        def do_GET(self) -> None:
            self.route(body=True)

        def route(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            hub.record(
                Request(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                )
            )
            if path.startswith("/cdn/"):
                found = hub.find_blob(path.removeprefix("/cdn/"))
                if found is None:
                    return self.error(404, None)
                return self.send_content(found[0], found[1], body=body, commit=None)
            parts = path.lstrip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                return self.error(404, "RepoNotFound")
            if hub.token is not None and self.headers.get("Authorization") != f"Bearer {hub.token}":
                return self.error(401, "RepoNotFound")
            repo = hub.repos.get(f"{parts[0]}/{parts[1]}")
            if repo is None:
                return self.error(404, "RepoNotFound")
            revision, file_path = parts[3], "/".join(parts[4:])
            if revision not in (repo.commit, "main") and not hub.any_revision:
                return self.error(404, "RevisionNotFound")
            file = repo.files.get(file_path)
            fault = hub.faults.get(file_path)
            if file is None or fault == "missing":
                return self.error(404, "EntryNotFound", commit=repo.commit)
            if fault == "error500":
                return self.error(500, None, commit=repo.commit)
            if file.lfs:
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{hub.port}/cdn/{file.sha256}")
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("X-Linked-Etag", f'"{file.sha256}"')
                self.send_header("X-Linked-Size", str(len(file.content)))
                self.send_header("ETag", f'"{file.git_sha1}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self.send_content(file_path, file, body=body, commit=repo.commit)

        def error(self, status: int, code: str | None, commit: str | None = None) -> None:
            self.send_response(status)
            if code is not None:
                self.send_header("X-Error-Code", code)
            if commit is not None:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def send_content(self, path: str, file: HubFile, *, body: bool, commit: str | None) -> None:
            fault = hub.faults.get(path)
            data = file.content
            if fault == "tamper":  # same size, other bytes
                data = bytes(b ^ 0xFF for b in data[:16]) + data[16:]
            elif fault == "short" and body:  # a consistent but short response
                data = data[: len(data) // 2]
            start = 0
            requested = self.headers.get("Range")
            if requested and requested.startswith("bytes=") and requested.endswith("-"):
                start = int(requested.removeprefix("bytes=").removesuffix("-"))
            chunk = data[start:]
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            if commit is not None:
                self.send_header("X-Repo-Commit", commit)
                self.send_header("ETag", f'"{file.git_sha1}"')
            self.send_header("Content-Length", str(len(chunk)))
            self.end_headers()
            if not body:
                return
            cut = fault in ("truncate_once", "stall") and start == 0
            if fault == "truncate_once" and start == 0:
                hub.faults.pop(path, None)  # the retry (with Range) succeeds
            if cut:
                self.wfile.write(chunk[: len(chunk) // 2])
                self.wfile.flush()
                if fault == "stall":
                    hub.stalled.set()
                    hub.release.wait(30)
                self.close_connection = True
                return
            self.wfile.write(chunk)

    return Handler
