"""Test launcher for operations tests: the production server with real worker subprocesses.

`python -m tests.support.ops_launcher` serves like `tests.support.launcher`, except that Laya and
Von are `WorkerProvider`s: real `ProcessRuntime`s under real residency, whose workers host the
torch-free engine of tests/support/engines/arith.py, so loads, evictions, idle unloads, restarts and
shutdown are the real thing at a fraction of a model's cost. Jev stays the fake of
tests/support/fakes.py.

The arith engine answers every question with a noul, so requests for these providers ask noul
questions only. A state object `{"arith": {...}}` becomes the job's config, which steers the
engine (`{"sleep": s}`, `{"crash": "run"}`, ...; see tests/support/engines/arith.py). The
workers log their passes beside the fakes' events (`passes`), so a test can wait for a pass to
begin. `DECIDEALOT_TEST_ARITH_OPTIONS` (JSON) adds engine options, e.g. `{"start_delay": 5}`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Self

from decidealot import logs, registry
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.http.server import run
from decidealot.jobs import EngineSpec, Job
from decidealot.protocols import Provider
from decidealot.providers.engine.client import ProcessRuntime
from decidealot.service import Service
from tests.support.fakes import FakeProvider
from tests.support.launcher import settings_from_env
from tests.support.servers import RunningServer, start_server

ROOT = Path(__file__).resolve().parents[2]
PASSES = "passes.jsonl"


class WorkerProvider:
    """A local provider whose worker runs the arith test engine."""

    local = True
    accepts_temperature = False

    def __init__(self, name: str, runtime: ProcessRuntime) -> None:
        self.name = name
        self.runtime = runtime

    @classmethod
    def from_settings(cls, name: str, settings: Settings) -> Self:
        events = os.environ.get("DECIDEALOT_TEST_EVENTS")
        options = {"log": str(Path(events).with_name(PASSES))} if events else {}
        options |= json.loads(os.environ.get("DECIDEALOT_TEST_ARITH_OPTIONS", "{}"))
        spec = EngineSpec(
            factory="tests.support.engines.arith:create", checkpoints={}, options=options
        )
        return cls(name, ProcessRuntime(name, spec, settings))

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(registry.descriptor(self.name).selectors)

    async def accept(self, selector: str, request: SystemOneRequest) -> Job:
        steer = request.state.get("arith", {}) if isinstance(request.state, dict) else {}
        return Job(selector, request.state, request.questions, config=steer)


def build(settings: Settings) -> list[Provider]:
    providers: list[Provider] = []
    for descriptor in registry.enabled(settings):
        if descriptor.name in ("laya", "von"):
            providers.append(WorkerProvider.from_settings(descriptor.name, settings))
        else:
            providers.append(FakeProvider(descriptor.name, local=descriptor.local))
    return providers


def start(folder: Path, **env: str) -> RunningServer:
    """Start `python -m tests.support.ops_launcher` on the CPU with DECIDEALOT_* overrides."""
    return start_server(
        folder,
        launcher="tests.support.ops_launcher",
        hosted=("jev-latest",),
        DECIDEALOT_DEVICE="cpu",
        **env,
    )


def passes(server: RunningServer) -> list[dict[str, Any]]:
    """The passes the server's workers began so far, in order: each one's job count, rows and
    states (tests/support/engines/arith.py's log)."""
    log = server.events_file.with_name(PASSES)
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if "size" in r]


def children(pid: int) -> set[int]:
    """Live child processes of `pid` (its workers), from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return {child for child in found if running(child)}


def started_worker(before: set[int]) -> int:
    """The one worker of this process started since its live children were `before`."""
    (pid,) = children(os.getpid()) - before
    return pid


def running(pid: int) -> bool:
    """False once the process is gone or a zombie nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def main() -> None:
    settings = settings_from_env()
    logs.configure(settings.log_level, settings.log_format)
    run(Service(settings, build(settings)))


if __name__ == "__main__":
    main()
