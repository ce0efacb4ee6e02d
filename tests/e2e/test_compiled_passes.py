"""Compiled passes served by the real `decidealot serve` (`DECIDEALOT_COMPILE=auto`, the
default): a request while the worker compiles is answered by the eager pass; once compiled and
checked, `/v1/status`, `decidealot_passes_info` and one log line say so; a second start over the
same model directory finds inductor's cache (counted, not timed). Without a C++ compiler the
passes stay eager and the log says so once.

bf16 is requested explicitly on a CPU that reads as a Zen 4 to the gateway (its check of the
CPU's units); the worker runs what it is asked, emulated where this CPU has no bf16 units.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.checkpoints import TinyCheckpoints, laya_settings
from tests.support.on_cpu import ZEN4
from tests.support.servers import RunningServer, start_server
from tests.worker.test_bf16 import NARROW
from tests.worker.test_compiled import needs_cxx

DECISION = {
    "model": "laya-english",
    "state": "Ticket: charged twice.",
    "questions": {"refund": {"type": "noul"}},
}
COMPILE_WAIT = 600.0  # seconds a cold compile may take on two shared cores (a liveness bound)


def _serve(tiny: TinyCheckpoints, folder: Path, **env: str) -> RunningServer:
    return start_server(
        folder,
        launcher="tests.support.on_cpu",
        args=(ZEN4, "serve"),
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_TORCH_THREADS="1",
        DECIDEALOT_PRECISION="bf16",
        DECIDEALOT_VON_ENABLED="false",
        **laya_settings(tiny.laya_all(shape=NARROW)),
        **env,
    )


def _english(server: RunningServer) -> dict[str, Any]:
    status = httpx.get(server.url + "/v1/status", timeout=30).json()
    laya = next(p for p in status["providers"] if p["name"] == "laya")
    return next(c for c in laya["checkpoints"] if c["name"] == "english")


def _decide(server: RunningServer) -> None:
    response = httpx.post(server.url + "/v1/systemone", json=DECISION, timeout=120)
    assert response.status_code == 200, response.text


def _settled(server: RunningServer) -> dict[str, Any]:
    """The checkpoint once its compile has ended, one way or the other."""
    deadline = time.monotonic() + COMPILE_WAIT
    while (checkpoint := _english(server))["compile_state"] == "compiling":
        assert time.monotonic() < deadline, checkpoint
        time.sleep(1)
    return checkpoint


def _passes_info(server: RunningServer) -> dict[str, str]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "decidealot_passes_info"
    ]
    (sample,) = [s for s in family.samples if s.labels["checkpoint"] == "english"]
    return sample.labels


@needs_cxx
@pytest.mark.slow  # real servers and a cold compile: a minute or more on two cores
def test_eager_serves_while_the_pass_compiles_and_a_restart_finds_the_cache(
    tiny: TinyCheckpoints, tmp_path: Path
) -> None:
    server = _serve(tiny, tmp_path)
    try:
        _decide(server)  # loads the checkpoint: its compile begins once the worker is idle
        _decide(server)
        during = _english(server)
        assert (during["passes"], during["compile_state"]) == ("eager", "compiling"), during
        done = _settled(server)
        assert (done["passes"], done["compile_state"]) == ("compiled", "compiled"), done
        assert done["compiled_graphs"] == 2 and done["cached_graphs"] == 0, done
        _decide(server)
        assert _passes_info(server) == {
            "provider": "laya",
            "checkpoint": "english",
            "passes": "compiled",
            "state": "compiled",
        }
        said = [line for line in server.log_lines() if "passes run compiled" in line]
        assert len(said) == 1, said
    finally:
        assert server.stop() == 0
    assert list((tmp_path / "models" / "compiled").iterdir())  # under DECIDEALOT_MODEL_DIR
    again = _serve(tiny, tmp_path)
    try:
        _decide(again)
        found = _settled(again)
        assert found["compile_state"] == "compiled", found
        assert found["cached_graphs"] == found["compiled_graphs"] == 2, found
    finally:
        again.stop()


@pytest.mark.slow  # a real server
def test_without_a_cxx_compiler_passes_stay_eager_and_the_log_says_so_once(
    tiny: TinyCheckpoints, tmp_path: Path
) -> None:
    """PATH holds no compiler and CXX is unset: inductor finds none."""
    server = _serve(tiny, tmp_path, PATH=str(tmp_path), CXX="")
    try:
        _decide(server)
        checkpoint = _settled(server)
        _decide(server)
        assert (checkpoint["passes"], checkpoint["compile_state"]) == ("eager", "no_compiler")
        lines = server.log_lines()
        said = [line for line in lines if "no C++ compiler found" in line]  # the worker's
        assert len(said) == 1, said
        assert [line for line in lines if "passes run eager" in line]  # and the checkpoint's
        assert _passes_info(server)["state"] == "no_compiler"
    finally:
        server.stop()
