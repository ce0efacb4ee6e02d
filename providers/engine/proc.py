"""The worker process of one local provider (`python -m decidealot.providers.engine`): the loop
around an `EngineCore`, its pipes and its exit.

Torch and checkpoints live only in this process, so unloading a provider is ending it. Frames
arrive on stdin and leave on stdout, which nothing else may write to (stray prints land on
stderr, which the gateway forwards to its log). Each `Start` builds an engine and runs its jobs
in a core until a `Release`: then the engine is dropped, its memory returned to the system and
`Released` answered, and the next `Start` builds the next engine in the same process, so a
model switch costs no new interpreter and no second torch import. At the end of stdin (the
gateway closed it or died) the process ends at once, whatever runs.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from decidealot.jobs import EngineSpec
from decidealot.providers.engine.core import EngineCore
from decidealot.providers.engine.protocol import (
    Cancel,
    Engine,
    Failed,
    FrameError,
    FromWorker,
    Heartbeat,
    Loaded,
    Ready,
    Release,
    Released,
    ReportLoad,
    Start,
    Submit,
    ToWorker,
    decode_to_worker,
    encode,
    read_payload,
)
from decidealot.providers.worker.memory import release_freed, resident_bytes

log = logging.getLogger("decidealot.worker")

_PR_SET_PDEATHSIG = 1


def build_engine(spec: EngineSpec, report: ReportLoad) -> Engine:
    """Import `spec.factory` and call it, with torch's thread count applied (the one place that
    sets it: OpenMP's and MKL's before torch is imported, torch's after).

    What the imports made is frozen out of the garbage collector's reach (`gc.freeze`): it
    lives as long as the process, and a full collection over torch's objects would otherwise
    slow every model switch (docs/performance.md, "Model switches")."""
    if spec.torch_threads > 0:
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[variable] = str(spec.torch_threads)
    module_name, _, function_name = spec.factory.partition(":")
    factory = getattr(importlib.import_module(module_name), function_name)
    if spec.torch_threads > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(spec.torch_threads)
    gc.freeze()
    engine: Engine = factory(spec, report)
    return engine


class _Pulse:
    """The heartbeat thread: while the worker builds an engine or its core holds work, a
    `Heartbeat` every `Start.heartbeat_seconds`. It needs only the GIL, so it goes quiet when
    the process is stopped or wedged, which is what the client looks for."""

    def __init__(self, emit: Callable[[FromWorker], None], interval: float) -> None:
        self._emit = emit
        self.interval = interval
        self.core: EngineCore | None = None
        self.building: float | None = None
        """When the engine being built began (`time.monotonic`)."""
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()

    def _run(self) -> None:
        told = False
        while not self._stop.wait(self.interval):
            beat = self._beat()
            if beat is not None or told:  # once more when all is quiet: what ran has ended
                self._emit(beat or Heartbeat())
            told = beat is not None

    def _beat(self) -> Heartbeat | None:
        """(A method, so that no reference to a released core outlives the call.)"""
        core, building = self.core, self.building
        if building is not None:
            return Heartbeat(preparing=time.monotonic() - building)
        return None if core is None else core.heartbeat()

    def stop(self) -> None:
        self._stop.set()


def host_engines(receive: Callable[[], ToWorker | None], emit: Callable[[FromWorker], None]) -> int:
    """Build each `Start`'s engine and run its jobs until the input ends; the exit status: 0
    at the end of the input, 1 when an engine cannot be built, 2 for a frame out of place.

    `receive` blocks for the next message (None at the end); `emit` sends one, from any
    thread. A worker process runs this on its pipes; `inprocess` on queues in a thread."""
    pulse: _Pulse | None = None
    try:
        while True:
            try:
                start = receive()
            except FrameError:
                log.error("malformed start frame")
                return 2
            if start is None:
                return 0
            if not isinstance(start, Start):
                log.error("expected a start frame, got %s", type(start).__name__)
                return 2
            if pulse is None:
                pulse = _Pulse(emit, start.heartbeat_seconds)
            code = _run_engine(start, receive, emit, pulse)
            if code is not None:
                return code
            emit(Released(release_memory()))
    finally:
        if pulse is not None:
            pulse.stop()


def _run_engine(
    start: Start,
    receive: Callable[[], ToWorker | None],
    emit: Callable[[FromWorker], None],
    pulse: _Pulse,
) -> int | None:
    """Build `start`'s engine and run its jobs until a `Release` (None, with nothing left that
    refers to the engine, so that its memory can go) or an exit status."""
    pulse.interval, pulse.building = start.heartbeat_seconds, time.monotonic()
    try:
        engine = build_engine(start.spec, lambda load: emit(Loaded(load)))
    except Exception as exc:
        log.exception("engine %s failed to start", start.spec.factory)
        emit(Failed(type(exc).__name__))
        return 1
    finally:
        pulse.building = None
    core = EngineCore(
        engine, emit, start.batch_token_budget, start.compute_threads, start.job_token_limit
    )
    del engine
    emit(Ready(start.spec.device))
    pulse.core = core
    core.start()
    try:
        while not isinstance(frame := receive(), Release):
            if frame is None:
                core.stop()  # the gateway has gone: nobody waits for answers
                return 0
            if isinstance(frame, Submit):
                core.submit(frame.id, frame.job)
            elif isinstance(frame, Cancel):
                core.cancel(frame.id)
            else:
                log.error("unexpected %s frame; ignored", type(frame).__name__)
    except FrameError:
        log.error("malformed frame from the gateway; exiting")
        core.stop()
        return 2
    core.close()
    pulse.core = None
    return None


def release_memory() -> int:
    """Give the memory of the dropped engine back to the system (`memory.release_freed`: a
    freed checkpoint's tensors otherwise stay in the process's arenas); the resident bytes
    after it."""
    release_freed()
    return resident_bytes()


class _FrameWriter:
    """Serialises frame writes from the loop, heartbeat, prepare and compute threads."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, frame: FromWorker) -> None:
        """Raises what msgpack raises for a frame it cannot carry; nothing is written then."""
        data = encode(frame)
        try:
            with self._lock:
                self._stream.write(data)
                self._stream.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)  # the gateway is gone: nobody is waiting for answers


def _take_frame_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Private handles on the frame pipes; fds 0 and 1 become /dev/null and stderr, so that
    nothing else can write to the frames."""
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (lives as long as the process)
    sys.stdout = sys.stderr
    return frames_in, frames_out


def main() -> None:
    """The process: dies with its gateway, leaves Ctrl-C to it, and ends with `host_engines`' status
    at once (`os._exit`), without waiting for a pass that still runs."""
    if sys.platform.startswith("linux"):  # the kernel kills this process when the gateway dies
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_in, frames_out = _take_frame_pipes()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )

    def receive() -> ToWorker | None:
        payload = read_payload(frames_in)
        return None if payload is None else decode_to_worker(payload)

    code = host_engines(receive, _FrameWriter(frames_out).write)
    sys.stderr.flush()
    os._exit(code)
