"""CLM's head in the test process: its engine behind the in-process runtime."""

from __future__ import annotations

from pathlib import Path

from decidealot import registry
from decidealot.jobs import EngineSpec
from decidealot.providers.engine.inprocess import InProcessRuntime


def clm_runtime(head: Path, *, width: int, device: str = "cpu") -> InProcessRuntime:
    """The CLM engine on `head` (vectors `width` wide), hosted in this process; jobs and
    answers still cross msgpack as a worker's frames do. Loaded on first use (`Deciding`)."""
    spec = EngineSpec(
        factory="decidealot.providers.clm.worker.engine:create",
        checkpoints={"clm-0.1-8b": str(head)},
        options={"width": width},
    )
    return InProcessRuntime("clm", spec, registry.settings(device=device))
