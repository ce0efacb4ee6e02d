"""`decidealot` as a newcomer runs it: settings errors, `serve` on granian, `models`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.cli import NO_LOCAL
from tests.support.cli import run_cli as cli
from tests.support.servers import free_port as _free_port
from tests.support.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("env", "variable", "accepts"),
    [
        ({"DECIDEALOT_PORT": "eighty"}, "DECIDEALOT_PORT", "integer"),
        ({"DECIDEALOT_PORT": "70000"}, "DECIDEALOT_PORT", "from 1 to 65535"),
        ({"DECIDEALOT_MAX_BATCH_REQUESTS": "0"}, "DECIDEALOT_MAX_BATCH_REQUESTS", "at least 1"),
        ({"DECIDEALOT_LAYA_ENABLED": "maybe"}, "DECIDEALOT_LAYA_ENABLED", "true or false"),
        ({"DECIDEALOT_API_KEY": "two words"}, "DECIDEALOT_API_KEY", "no whitespace"),
        ({"DECIDEALOT_LONG_STATES": "chop"}, "DECIDEALOT_LONG_STATES", "cut, refuse, windows"),
    ],
)
def test_a_bad_setting_exits_with_one_line(
    env: dict[str, str], variable: str, accepts: str
) -> None:
    result = cli("serve", **env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert variable in lines[0] and accepts in lines[0]
    assert "two words" not in result.stderr  # a key is never echoed


def test_bad_port_flag() -> None:
    result = cli("serve", "--port", "0", **NO_LOCAL)
    assert result.returncode == 2
    assert "--port" in result.stderr


def test_models_prints_the_local_catalog() -> None:
    result = cli("models", DECIDEALOT_LAYA_ENABLED="false")
    assert result.returncode == 0
    names = [json.loads(line)["name"] for line in result.stdout.splitlines()]
    assert names == ["von", "von-latest", "von-1.1", "von-1.1.0"]


@pytest.mark.smoke
def test_serve_runs_until_sigterm() -> None:
    port = _free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "decidealot", "serve", "--port", str(port)],
        cwd=ROOT,
        env=clean | NO_LOCAL | {"DECIDEALOT_PORT": "1"},  # the flag wins over the variable
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert wait_healthy(f"http://127.0.0.1:{port}", process)
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        assert health.json() == {"status": "ok", "providers": []}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json() == {"models": []}
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stdout is not None
    log = process.stdout.read().decode()
    assert "starting on http://127.0.0.1:" in log


def test_a_busy_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("serve", **NO_LOCAL, DECIDEALOT_PORT=str(port))
    assert result.returncode == 1
    assert f"decidealot: cannot listen on 127.0.0.1:{port}: " in result.stderr
    assert "Traceback" not in result.stderr


def test_a_busy_probe_port_is_one_line_and_stops_the_service() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("serve", **NO_LOCAL, DECIDEALOT_PORT=str(_free_port()),
                     DECIDEALOT_PROBE_PORT=str(port), RUST_BACKTRACE="1")  # fmt: skip
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("decidealot:")]
    where = f"127.0.0.1:{port} (DECIDEALOT_PROBE_PORT)"
    assert line.startswith(f"decidealot: cannot listen on {where}: Address already in use")
    assert "Traceback" not in result.stderr and "backtrace" not in result.stderr


def test_the_gateway_never_imports_torch() -> None:
    probe = (
        "import sys\n"
        "from decidealot import cli\n"
        "from decidealot import registry\n"
        "from decidealot.http.app import create_app\n"
        "from decidealot.service import Service\n"
        "settings = registry.settings(\n"
        "    clm_embeddings_url='http://127.0.0.1:9/v1', typesafe_api_key='k'\n"
        ")\n"
        "service = Service(settings)\n"
        "create_app(service)\n"
        "assert [p.name for p in service.providers] == ['laya', 'von', 'clm', 'jev']\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=clean, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "torch" not in result.stdout and "transformers" not in result.stdout


@pytest.mark.parametrize("command", ["checkpoints tiny {dir}", "models"])
def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path, command: str) -> None:
    """`decidealot checkpoints tiny DIR | head`: a pipe closed before the output is written
    ends the command quietly (status 1, nothing on stderr about it)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    line = f"{sys.executable} -m decidealot {command.format(dir=tmp_path / 'tiny')} | head -n 0"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {line}"],
        cwd=ROOT,
        env=clean | {"OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    for needle in ("Traceback", "BrokenPipe", "Exception ignored"):
        assert needle not in done.stderr, done.stderr
