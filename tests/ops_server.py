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

from decidealot import logs
from decidealot.catalog import LOCAL_MODELS
from decidealot.config import Settings
from decidealot.contract import ModelInfo, SystemOneRequest, SystemOneResponse, Usage
from decidealot.http.server import run
from decidealot.residency import Residency
from decidealot.service import Service
from providers.base import Provider
from providers.engine import EngineSpec, Job
from providers.local import ResidentRunner, WorkerRuntime
from tests.conftest import RunningServer, start_server
from tests.server import settings_from_env
from tests.test_providers import FakeProvider

ROOT = Path(__file__).resolve().parent.parent


class WorkerProvider:
    """A local provider whose worker runs the arith test engine."""

    local = True

    def __init__(self, name: str, runtime: WorkerRuntime, runner: ResidentRunner) -> None:
        self.name = name
        self._runtime = runtime
        self._runner = runner

    @classmethod
    def from_settings(cls, name: str, settings: Settings, residency: Residency) -> Self:
        spec = EngineSpec(factory="tests.engines.arith:create", checkpoints={})
        runtime = WorkerRuntime(name, spec, settings)
        residency.register(runtime)
        return cls(name, runtime, ResidentRunner(runtime, residency))

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        await self._runtime.unload()

    async def models(self) -> list[ModelInfo]:
        return list(LOCAL_MODELS[self.name])

    async def decide(self, selector: str, request: SystemOneRequest) -> SystemOneResponse:
        steer = request.state.get("arith", {}) if isinstance(request.state, dict) else {}
        job = Job(selector, request.state, request.questions, config=steer)
        decision = await self._runner.run(job)
        return SystemOneResponse(
            decision.model, decision.answers, Usage(input_tokens=decision.input_tokens)
        )


def build(settings: Settings, residency: Residency) -> list[Provider]:
    providers: list[Provider] = []
    for name in settings.providers:
        if name in ("laya", "von"):
            providers.append(WorkerProvider.from_settings(name, settings, residency))
        else:
            providers.append(FakeProvider(name, None if name == "jev" else residency))
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
    residency = Residency(settings)
    run(Service(settings, build(settings, residency), residency))


if __name__ == "__main__":
    main()
