"""The CLM engine in the test process; jobs and decisions framed as a worker frames them."""

from __future__ import annotations

from pathlib import Path

import msgspec
from decidealot.providers.clm.worker.engine import create

from decidealot.jobs import Decision, EngineSpec, Job


class InProcessClmRunner:
    """A `LocalRuntime` that runs the CLM engine in this process, round-tripping jobs and
    decisions through msgpack as the worker's frames would."""

    name = "clm"
    device = "cpu"
    loaded = True

    def __init__(self, head: Path, *, width: int):
        spec = EngineSpec(
            factory="decidealot.providers.clm.worker.engine:create",
            checkpoints={"clm-0.1-8b": str(head)},
            options={"width": width},
        )
        self.engine = create(spec)
        self.jobs = 0

    async def load(self) -> None:
        pass

    async def unload(self) -> None:
        pass

    async def submit(self, job: Job) -> Decision:
        self.jobs += 1
        wire_job = msgspec.msgpack.decode(msgspec.msgpack.encode(job), type=Job)
        decision = self.engine.run([self.engine.prepare(wire_job)])[0]
        return msgspec.msgpack.decode(msgspec.msgpack.encode(decision), type=Decision)
