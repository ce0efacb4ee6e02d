"""Real servers for end-to-end tests: one launcher, one free-port helper, one health wait.

`start_server` runs `python -m <launcher>` (by default `tests.support.launcher`: the production
server over the fake providers; `decidealot` with `("serve",)` for the real one) on a free
loopback port and waits for `/health`.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import fakes

ROOT = Path(__file__).resolve().parent.parent.parent
_SCRAPES = httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))
"""The client `RunningServer.metric` scrapes with, often in a wait loop: each scrape on a
connection of its own, as `httpx.get`'s, without building an SSL context (50 ms of CPU) each."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    """A `python -m <launcher>` subprocess on a loopback port."""

    url: str
    process: subprocess.Popen[bytes]
    events_file: Path
    jev_catalog: Path
    log_file: Path

    def events(self) -> list[dict[str, Any]]:
        """The fakes' calls so far (`fakes.read_events`)."""
        return fakes.read_events(self.events_file)

    def begun(self) -> list[Any]:
        """The tags of the fakes' calls begun so far (`fakes.read_begun`): a fake steered to
        sleep holds its residency slot from then until it answers."""
        return fakes.read_begun(self.events_file)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels`, scraped from /metrics now."""
        text = _SCRAPES.get(self.url + "/metrics").text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def log_lines(self) -> list[str]:
        return self.log_file.read_text().splitlines()

    def stop(self, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def _copy_terminal(terminal: int, log: Path) -> None:
    """What the server writes to its terminal, appended to `log` until the terminal closes."""
    with log.open("ab") as out:
        while True:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                chunk = b""
            if not chunk:
                break
            out.write(chunk)
            out.flush()
    os.close(terminal)


def start_server(
    folder: Path,
    *,
    launcher: str = "tests.support.launcher",
    args: tuple[str, ...] = (),
    hosted: tuple[str, ...] = ("jev-latest", "jev-1.13.0", "von"),
    terminal: bool = False,
    **env: str,
) -> RunningServer:
    """Start `python -m <launcher> <args>` (the production server over test providers; or
    `decidealot`, `("serve",)` for the real one) with DECIDEALOT_* overrides in `env` and the
    fake TypeSafe catalog `hosted`; waits for /health. Its log lines are JSON (the default
    format off a terminal); with `terminal`, its stdout and stderr are a pseudo-terminal (as
    when a person runs it), copied to the log file."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    events, catalog, log = folder / "events.jsonl", folder / "jev.json", folder / "server.log"
    catalog.write_text(json.dumps(list(hosted)))
    fakes = {"DECIDEALOT_TEST_EVENTS": str(events), "DECIDEALOT_TEST_JEV_CATALOG": str(catalog)}
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")} | {
        "DECIDEALOT_HOST": "127.0.0.1",
        "DECIDEALOT_PORT": str(port),
        **(fakes if launcher.startswith("tests.") else {}),  # `decidealot` refuses them
        "DECIDEALOT_MODEL_DIR": str(folder / "models"),
        **env,
    }
    command = [sys.executable, "-m", launcher, *args]
    if terminal:
        log.touch()
        screen, tty = pty.openpty()
        process = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=tty, stderr=tty)
        os.close(tty)
        threading.Thread(target=_copy_terminal, args=(screen, log), daemon=True).start()
    else:
        with log.open("wb") as log_out:
            process = subprocess.Popen(
                command, cwd=ROOT, env=full_env, stdout=log_out, stderr=subprocess.STDOUT
            )
    server = RunningServer(f"http://127.0.0.1:{port}", process, events, catalog, log)
    if wait_healthy(server.url, process):
        return server
    if process.poll() is not None:
        raise RuntimeError(f"{launcher} exited: {log.read_text()[-2000:]}")
    process.kill()
    process.wait()
    raise RuntimeError(f"{launcher} did not start")


def wait_healthy(url: str, process: subprocess.Popen[Any], seconds: float = 30) -> bool:
    """Poll `url`/health every 50 ms until it answers (True), `process` exits or `seconds` pass.
    One client for every poll: a new one (`httpx.get`) builds an SSL context each time, 50 ms
    of CPU, so polling that way took as much CPU as the server it waited for."""
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                client.get(url + "/health")
                return True
            except httpx.TransportError:
                time.sleep(0.05)
    return False


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    """Poll `condition` every 20 ms until it holds. `seconds` only guards against a hang (the
    test fails naming `what`); it is never the thing a test asserts."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never {what} in {seconds} s")
        time.sleep(0.02)


def health_once_signalled(client: httpx.Client) -> httpx.Response:
    """The first `/health` answer other than 200 on `client`, polled until the server has
    handled the signal it was sent. Polled on one client: its kept-alive connection still
    reaches a server that has stopped accepting new ones."""
    answers: list[httpx.Response] = []

    def answered() -> bool:
        answers.append(client.get("/health"))
        return answers[-1].status_code != 200

    wait_until(answered, "a /health answer other than 200")
    return answers[-1]


@dataclass
class Timed:
    """A request sent on another thread, with how `/health` answered while it ran."""

    response: httpx.Response
    seconds: float
    slowest_health: float
    health_polls: int


def while_health_polls(url: str, path: str, body: bytes, timeout: float = 300) -> Timed:
    """POST `body` to `path` on another thread and poll `/health` every 50 ms until it
    answers: a slow /health shows work that held the gateway's event loop."""
    answers: list[httpx.Response] = []

    def send() -> None:
        headers = {"Content-Type": "application/json"}
        answers.append(httpx.post(url + path, content=body, headers=headers, timeout=timeout))

    sender = threading.Thread(target=send)
    started = time.monotonic()
    sender.start()
    slowest, polls = 0.0, 0
    with httpx.Client(timeout=60) as client:  # one client: see `wait_healthy`
        while sender.is_alive():
            before = time.monotonic()
            assert client.get(url + "/health").status_code == 200
            slowest = max(slowest, time.monotonic() - before)
            polls += 1
            time.sleep(0.05)
    sender.join()
    return Timed(answers[0], time.monotonic() - started, slowest, polls)


ALL_FAKES = {
    "DECIDEALOT_CLM_EMBEDDINGS_URL": "http://127.0.0.1:9/v1",
    "DECIDEALOT_TYPESAFE_API_KEY": "upstream-key",
}

GATEWAY = {
    **ALL_FAKES,
    "DECIDEALOT_MAX_BATCH_REQUESTS": "8",
    "DECIDEALOT_MAX_BATCH_CONCURRENCY": "2",
    "DECIDEALOT_MAX_RESIDENT_PROVIDERS": "3",
}
"""The shared gateway's settings (conftest's `gateway` server, tests/support/app.py's in-process
app): Laya, Von, CLM and Jev fakes; batches capped at 8 items, 2 concurrent calls, 3 resident
providers."""
