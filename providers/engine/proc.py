"""The worker process of one local provider (`python -m decidealot.providers.engine`): the loop
around an `EngineCore`, its pipes and its exit.

Torch and checkpoints live only in this process, so unloading a provider is ending it. Each
`Start` builds an engine and runs its jobs until a `Release`; then its memory goes back to the
system, and the next `Start` builds the next engine in the same process (a model switch costs no
new interpreter and no second torch import). At the end of stdin the process ends at once.
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

from decidealot.jobs import CheckpointLoad, EngineSpec
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
    """The one place that sets torch's thread count (OpenMP's and MKL's before torch is
    imported, torch's after). What the imports made lives as long as the process: frozen out of
    the collector's reach, or a full collection over torch's objects would slow every model
    switch (docs/performance.md, "Model switches")."""
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
    """The heartbeat thread, while an engine builds or the core holds work: it goes quiet when
    the process is stopped or wedged, which is what the client looks for."""

    def __init__(self, emit: Callable[[FromWorker], None], interval: float) -> None:
        self._emit = emit
        self.interval = interval
        self.core: EngineCore | None = None
        self.building: float | None = None
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
    """The exit status: 0 at the end of the input, 1 when an engine cannot be built, 2 for a
    frame out of place. `emit` is called from any thread; `inprocess` runs this on queues."""
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
    """None at a `Release`, with nothing left that refers to the engine (its memory can go)."""
    pulse.interval, pulse.building = start.heartbeat_seconds, time.monotonic()
    live = [True]  # False from the release on: a compile still under way tells nobody
    reporting = threading.Lock()

    def report(load: CheckpointLoad) -> None:
        with reporting:
            if live[0]:
                emit(Loaded(load))

    try:
        engine = build_engine(start.spec, report)
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
    with reporting:
        live[0] = False
    pulse.core = None
    return None


def release_memory() -> int:
    """A freed checkpoint's tensors otherwise stay in the process's arenas."""
    release_freed()
    return resident_bytes()


class _FrameWriter:
    """Serialises writes from the loop, heartbeat, prepare and compute threads."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, frame: FromWorker) -> None:
        data = encode(frame)
        try:
            with self._lock:
                self._stream.write(data)
                self._stream.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)  # the gateway is gone: nobody is waiting for answers


def _take_frame_pipes() -> tuple[BinaryIO, BinaryIO]:
    """fds 0 and 1 become /dev/null and stderr: a stray print cannot corrupt the frames."""
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
    """Dies with its gateway, leaves Ctrl-C to it, and exits at once, never waiting for a pass
    that still runs."""
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
