"""The worker process of one local provider: `python -m decidealot.providers.worker`.

Torch and checkpoints live only in this process, so unloading a provider is ending it. The
gateway sends a `Start` frame, then `Submit` frames on stdin; answers go back as frames on
stdout, which nothing else may write to (stray prints land on stderr, which the gateway
forwards to its log). On a model switch the gateway sends `Release` instead of closing stdin:
the engine's threads end, the engine is dropped and its memory returned to the system
(`release_memory`), the worker answers `Released` and builds the next `Start`'s engine, so a
switch costs no new interpreter and no second torch import. The engine's jobs run in its
`scheduler.Scheduler`; at the end of stdin (the gateway closed it or died) the process ends.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import signal
import sys
from typing import BinaryIO

from decidealot.frames import (
    Failed,
    FrameError,
    Ready,
    Released,
    Start,
    decode_to_worker,
    read_payload,
)
from decidealot.jobs import Engine, EngineSpec
from decidealot.providers.worker.frame_io import FrameWriter, take_frame_pipes
from decidealot.providers.worker.memory import release_freed, resident_bytes
from decidealot.providers.worker.scheduler import Scheduler

_PR_SET_PDEATHSIG = 1

log = logging.getLogger("decidealot.worker")


def build_engine(spec: EngineSpec) -> Engine:
    """Import `spec.factory` and call it with the spec, with torch's thread count applied
    (the one place that sets it: OpenMP's and MKL's before torch is imported, torch's after).

    What the imports made is frozen out of the garbage collector's reach (`gc.freeze`): it
    lives as long as the process, and a full collection over torch's objects would otherwise
    slow every model switch (docs/performance.md, "Model switches"; `release_memory` collects
    what the engine left)."""
    if spec.torch_threads > 0:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(spec.torch_threads)
    module_name, _, function_name = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    if spec.torch_threads > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(spec.torch_threads)
    gc.freeze()
    engine: Engine = factory(spec)
    return engine


def release_memory() -> int:
    """Give the memory of the dropped engine back to the system (`memory.release_freed`: a
    freed checkpoint's tensors otherwise stay in the process's arenas); the resident bytes
    after it."""
    release_freed()
    return resident_bytes()


def _die_with_parent() -> None:
    """Second guard after end-of-stdin: the kernel kills this process when the gateway dies.
    (Had it died already, stdin is at its end and the first read ends the process.)"""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def main() -> int:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the gateway's to handle
    frames_in, frames_out = take_frame_pipes()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    writer = FrameWriter(frames_out)
    while True:  # one engine per Start; a Release ends it and the next Start builds another
        try:
            payload = read_payload(frames_in)
            if payload is None:
                return 0
            start = decode_to_worker(payload)
        except FrameError:
            log.error("malformed start frame")
            return 2
        if not isinstance(start, Start):
            log.error("expected a start frame, got %s", type(start).__name__)
            return 2
        code = _serve(start, frames_in, writer)
        if code is not None:
            return code
        writer.write(Released(release_memory()))


def _serve(start: Start, frames_in: BinaryIO, writer: FrameWriter) -> int | None:
    """Build `start`'s engine and run its jobs until a `Release` (None) or a failed build (the
    exit status); the end of stdin ends the process meanwhile. Returns with nothing left that
    refers to the engine, so `release_memory` can return it."""
    try:
        engine = build_engine(start.spec)
    except Exception as exc:
        log.exception("engine %s failed to start", start.spec.factory)
        writer.write(Failed(type(exc).__name__))
        return 1
    scheduler = Scheduler(
        engine,
        writer.write,
        start.batch_token_budget,
        start.concurrent_passes,
        start.job_token_limit,
    )
    del engine
    writer.write(Ready(start.spec.device))
    scheduler.start()
    scheduler.read_jobs(frames_in)  # returns at a Release; ends the process at the end of stdin
    scheduler.close()
    return None
