"""Shared test setup: one torch thread, no hub access, markers by folder, the shared servers.

The suite is grouped by what a test needs: `unit/` (in-process, no model, no socket),
`worker/` (engines and worker hosts on tiny checkpoints), `parity/` (against the upstream
packages), `e2e/` (real servers and commands), `deploy/` (packaging and manifests). Each test
gets its folder's marker; `slow` marks e2e/, parity/ and deploy/ except the `smoke` tests, and
the tests in unit/ and worker/ that start a real command or a model's worker process, so
`pytest -m "not slow"` is the quick loop.
"""

import contextlib
import ctypes
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Workers start with -P (the installed package only); the test engines they load
# (tests.support.engines) and the test launchers import from the checkout.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_CHECKOUT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)


def _reuse_freed_memory() -> None:
    """Keep what the in-process tests free for their next allocation. A long Von row's masks
    are L x L tensors of 300 MB; glibc maps each one fresh and unmaps it on free, so every pass
    page-faults it in again, and the kernel's zeroing of those pages was half the CPU of the
    long-state parity tests. Served from the heap and never trimmed, they are reused. Allocator
    settings change no value a test compares, and worker processes keep glibc's defaults."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # a libc without glibc's mallopt
            libc = ctypes.CDLL(None)
            libc.mallopt(-4, 0)  # M_MMAP_MAX: no allocation gets its own mapping
            libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: the heap keeps its free top


_reuse_freed_memory()

from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.support.checkpoints import TinyCheckpoints  # noqa: E402
from tests.support.servers import GATEWAY, RunningServer, start_server  # noqa: E402

FOLDERS = ("unit", "worker", "parity", "e2e", "deploy")
SLOW_FOLDERS = ("parity", "e2e", "deploy")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).relative_to(_CHECKOUT).parts[1]
        if folder in FOLDERS:
            item.add_marker(folder)
        if folder in SLOW_FOLDERS and item.get_closest_marker("smoke") is None:
            item.add_marker("slow")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoints:
    """The session's tiny random checkpoints, each written once (tests/support/checkpoints.py)."""
    return TinyCheckpoints(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process's DECIDEALOT_* variables cleared, for a command to read its own."""
    for name in list(os.environ):
        if name.startswith("DECIDEALOT_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Laya, Von, CLM and Jev fakes; batches capped at 8 items, 2 concurrent calls."""
    server = start_server(tmp_path_factory.mktemp("gateway"), **GATEWAY)
    yield server
    assert server.stop() == 0


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Start extra servers with their own settings; each is stopped after the test."""
    started: list[RunningServer] = []

    def start(**env: str) -> RunningServer:
        server = start_server(tmp_path / f"server{len(started)}", **env)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
