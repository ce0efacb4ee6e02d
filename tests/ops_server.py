"""Test launcher for operations tests: the production server with real worker subprocesses.

`python -m tests.ops_server` serves like `tests.server`, except that Laya and Von are
`WorkerProvider`s: real `WorkerRuntime`s under real residency, whose workers host the torch-free
engine of tests/engines/arith.py, so loads, evictions, idle unloads, restarts and shutdown are
the real thing at a fraction of a model's cost. Jev stays the fake of tests/test_providers.py.

The arith engine answers every question with a noul, so requests for these providers ask noul
questions only. A state object `{"arith": {...}}` becomes the job's config, which steers the
engine (`{"sleep": s}`, `{"crash": "run"}`, ...; see tests/engines/arith.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from decidealot.providers.gateway.process_runtime import WorkerRuntime

from decidealot import logs
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest
from decidealot.http.server import run
from decidealot.jobs import EngineSpec, Job
from decidealot.protocols import PreparedRequest, Provider
from decidealot.service import Service, local_selectors
from tests.conftest import RunningServer, start_server
from tests.server import settings_from_env
from tests.test_providers import FakeProvider

ROOT = Path(__file__).resolve().parent.parent


class WorkerProvider:
    """A local provider whose worker runs the arith test engine."""

    local = True
    accepts_temperature = False
    prepares_in_lane = False

    def __init__(self, name: str, runtime: WorkerRuntime) -> None:
        self.name = name
        self.runtime = runtime

    @classmethod
    def from_settings(cls, name: str, settings: Settings) -> Self:
        spec = EngineSpec(factory="tests.engines.arith:create", checkpoints={})
        return cls(name, WorkerRuntime(name, spec, settings))

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self.runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(local_selectors(self.name))

    async def prepare(self, selector: str, request: SystemOneRequest) -> PreparedRequest:
        steer = request.state.get("arith", {}) if isinstance(request.state, dict) else {}
        return PreparedRequest(Job(selector, request.state, request.questions, config=steer))


def build(settings: Settings) -> list[Provider]:
    providers: list[Provider] = []
    for name in settings.providers:
        if name in ("laya", "von"):
            providers.append(WorkerProvider.from_settings(name, settings))
        else:
            providers.append(FakeProvider(name, local=name != "jev"))
    return providers


def start(folder: Path, **env: str) -> RunningServer:
    """Start `python -m tests.ops_server` on the CPU with DECIDEALOT_* overrides."""
    return start_server(
        folder, launcher="tests.ops_server", hosted=("jev-latest",), DECIDEALOT_DEVICE="cpu", **env
    )


def children(pid: int) -> set[int]:
    """Live child processes of `pid` (its workers), from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return {child for child in found if running(child)}


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
