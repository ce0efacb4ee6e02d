"""Compiled passes (`DECIDEALOT_COMPILE`): a checkpoint's pass through `torch.compile` under
reduced precision, swapped in once it is compiled and checked, never on the request path.

Under bf16 half a CPU pass is work that is not a matrix product (casts, RoPE, attention's
softmax, norms), run as separate eager kernels; inductor fuses it (docs/performance.md,
"Compiled passes"). Each loaded checkpoint's pass is compiled by the core's compile thread
(`EngineCore`), with dynamic shapes, on warm-up rows made from the precision probe's: one pass of
several ragged rows and one of a single row (torch specialises a size of 1), every size distinct
so no two dimensions share a symbol. Until then, and whenever the compiled pass's probabilities
on those rows move more than bf16's probe tolerance from eager's, or the compile raises, eager
serves. Once swapped in, the compiled pass runs under `torch._dynamo.run`: a shape its graphs do
not cover runs eager, so no request ever waits for a compile.

Inductor's own caches (its FX graph cache) keep what it compiled on disk, under
`DECIDEALOT_MODEL_DIR/compiled/`, one folder per torch version, CPU (flags, torch threads) and
checkpoint (its path and its files' sizes and times), so a restart or a switch back finds them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec
import torch
from torch import nn

from decidealot import cpu
from decidealot.config import COMPILE_MODES
from decidealot.jobs import CheckpointLoad
from decidealot.providers.worker import bf16

log = logging.getLogger("decidealot.worker")

MODES = COMPILE_MODES

TOLERANCE = bf16.PROBE_TOLERANCE
"""Most a warm-up row's probability may move from eager's before the compiled pass serves."""

STATES = (
    "off",
    "eager_precision",
    "no_compiler",
    "compiling",
    "compiled",
    "probe_failed",
    "failed",
)
"""What a checkpoint's pass is, as `CheckpointLoad.compile_state` and the metric say it."""


class Passes:
    """The module a checkpoint's passes call: eager until its compiled form is checked."""

    def __init__(self, eager: nn.Module) -> None:
        self.eager = eager
        self.current: Any = eager
        self.compiled_form: Any = None  # the `torch.compile`d module, once swapped in

    def swap(self, compiled: Any) -> None:
        """Serve `compiled` from now on, never compiling again: a shape its graphs do not
        cover runs eager (`torch._dynamo.run`)."""
        import torch._dynamo

        self.compiled_form = compiled
        self.current = torch._dynamo.run(compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.current(*args, **kwargs)

    @property
    def compiled(self) -> bool:
        return self.current is not self.eager


class Compilable(Protocol):
    """What a loaded model (Laya's `Checkpoint`, a `VonModel`) gives the compiler."""

    passes: Passes

    def warm_up_rows(self) -> list[Sequence[Any]]:
        """Row sets to compile on and to check against eager: several ragged rows, then one."""

    def option_logits(self, rows: Sequence[Any], module: Any) -> list[list[float]]:
        """Each row's option logits from one pass through `module`."""


@dataclass(frozen=True, slots=True)
class CompileOutcome:
    """What became of a checkpoint's pass (`state` one of `STATES`), and why."""

    state: str
    reason: str
    seconds: float = 0.0
    graphs: int = 0  # FX graphs inductor compiled or found
    cached_graphs: int = 0  # of those, found in the on-disk cache

    @property
    def passes(self) -> str:
        return "compiled" if self.state == "compiled" else "eager"


def planned(mode: str, precision: str) -> CompileOutcome:
    """At load: whether a checkpoint loaded in `precision` (after its probe) will be compiled."""
    if mode == "off":
        return CompileOutcome("off", "DECIDEALOT_COMPILE=off")
    if precision == "fp32":
        return CompileOutcome(
            "eager_precision", "fp32 stays eager: its answers stay upstream's exactly"
        )
    if precision == "int8":
        return CompileOutcome(
            "eager_precision", "int8 stays eager: no gain from compiling it is shown"
        )
    return CompileOutcome(
        "compiling", f"{precision}: eager serves until the compiled pass is checked"
    )


_lock = threading.Lock()  # one compile at a time: inductor's cache folder is process-wide
_warned: set[str] = set()  # what was logged once per process
_compiler: list[str | None] = []  # inductor's C++ compiler, once looked up


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU (`CXX`, else g++), or None; said once."""
    if not _compiler:
        from torch._inductor import cpp_builder

        try:
            _compiler.append(cpp_builder.get_cpp_compiler())
        except Exception as exc:
            _compiler.append(None)
            log.warning(
                "no C++ compiler found (CXX=%s, else g++ on PATH; %s): passes run eager "
                "(docs/configuration.md#compiled-passes says how to add one)",
                os.environ.get("CXX", "unset"),
                type(exc).__name__,
            )
    return _compiler[0]


def cache_folder(root: str, checkpoint: str, device: str) -> Path | None:
    """`root`'s folder for this torch, CPU (flags, and the torch threads its kernels are built
    for) and checkpoint, or None where it cannot be written (logged once per root)."""
    identity = {
        "torch": torch.__version__,
        "device": device,
        "cpu": sorted(cpu.flags()) if device == "cpu" else [],
        "threads": torch.get_num_threads(),  # inductor's CPU kernels are built for this many
        "checkpoint": os.path.realpath(checkpoint),
        "files": _files(Path(checkpoint)),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(root) / f"torch-{torch.__version__.replace('+', '-')}-{digest}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        if root not in _warned:
            _warned.add(root)
            log.warning(
                "compiled passes are not cached: %s cannot be written (%s); each start compiles "
                "again",
                root,
                exc.strerror or type(exc).__name__,
            )
        return None
    return folder


def _files(checkpoint: Path) -> list[tuple[str, int, int]]:
    """Each file's path under the checkpoint, size and modification time."""
    paths = [checkpoint] if checkpoint.is_file() else sorted(checkpoint.rglob("*"))
    listed = []
    for path in paths:
        if path.is_file():
            stat = path.stat()
            listed.append(
                (str(path.relative_to(checkpoint.parent)), stat.st_size, stat.st_mtime_ns)
            )
    return listed


def lower_priority() -> None:
    """The calling thread (and the compilers it starts) yields the CPU to the passes."""
    with contextlib.suppress(AttributeError, OSError):  # not on this platform, or refused
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


SWITCH_SECONDS = 1e-5
"""Python's switch interval while a compile runs (5 ms otherwise). Every torch op of a pass
gives the interpreter lock up and asks for it back, and behind a compiling thread each ask
waited for the interval: a pass of a few hundred ops took up to half a second more (p99 of
decisions during a compile 482 ms at 5 ms, 40 ms at 10 µs: docs/performance.md)."""


@contextlib.contextmanager
def _quick_switches() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_SECONDS)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def compile_passes(model: Compilable, cache: Path | None, device: str) -> CompileOutcome:
    """Compile `model`'s pass on its warm-up rows, check it against eager there, and swap it
    in; any failure leaves eager serving and says why."""
    lower_priority()
    if device == "cpu" and cxx_compiler() is None:
        return CompileOutcome(
            "no_compiler", "inductor has no C++ compiler to build CPU kernels with"
        )
    with _lock, _quick_switches():
        try:
            return _compile(model, cache)
        except Exception as exc:
            where = traceback.extract_tb(exc.__traceback__)[-1]
            log.warning(
                "compiling a pass raised %s (%s:%d), eager serves",
                type(exc).__name__,
                Path(where.filename).name,
                where.lineno,
            )
            return CompileOutcome(
                "failed", f"the compile raised {type(exc).__name__}: eager serves"
            )


def _compile(model: Compilable, cache: Path | None) -> CompileOutcome:
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import counters

    torch._inductor.config.compile_threads = 1  # no pool of compile processes in a worker
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache or _scratch())
    warm = model.warm_up_rows()
    eager = [model.option_logits(rows, model.passes.eager) for rows in warm]
    compiled = torch.compile(
        model.passes.eager, dynamic=True, options={"fx_graph_cache": cache is not None}
    )
    before = counters["inductor"].copy()
    clock = time.perf_counter()
    outputs = [model.option_logits(rows, compiled) for rows in warm]
    seconds = time.perf_counter() - clock
    hits = counters["inductor"]["fxgraph_cache_hit"] - before["fxgraph_cache_hit"]
    misses = counters["inductor"]["fxgraph_cache_miss"] - before["fxgraph_cache_miss"]
    bypassed = counters["inductor"]["fxgraph_cache_bypass"] - before["fxgraph_cache_bypass"]
    graphs = hits + misses + bypassed
    error = max(
        _moved(a, b)
        for got, want in zip(outputs, eager, strict=True)
        for a, b in zip(got, want, strict=True)
    )
    found = f"{hits} of {graphs} graphs from the cache" if cache else "no cache"
    if error > TOLERANCE:
        return CompileOutcome(
            "probe_failed",
            f"the compiled pass moved warm-up probabilities by {error:.4f}, more than "
            f"{TOLERANCE}: eager serves",
            seconds,
            graphs,
            hits,
        )
    model.passes.swap(compiled)
    return CompileOutcome(
        "compiled",
        f"compiled in {seconds:.1f} s ({found}); warm-up probabilities within {error:.4f} of eager",
        seconds,
        graphs,
        hits,
    )


def _moved(got: Sequence[float], want: Sequence[float]) -> float:
    if not got:
        return 0.0
    a = torch.tensor(got, dtype=torch.float64).softmax(-1)
    b = torch.tensor(want, dtype=torch.float64).softmax(-1)
    return float((a - b).abs().max())


_scratch_dir: list[str] = []


def _scratch() -> str:
    """Where inductor writes its code when nothing is cached: this process's own folder."""
    if not _scratch_dir:
        _scratch_dir.append(tempfile.mkdtemp(prefix="decidealot-inductor-"))
    return _scratch_dir[0]


def with_outcome(load: CheckpointLoad, outcome: CompileOutcome) -> CheckpointLoad:
    """`load` as it reports `outcome`."""
    return msgspec.structs.replace(
        load,
        passes=outcome.passes,
        compile_state=outcome.state,
        compile_reason=outcome.reason,
        compile_seconds=round(outcome.seconds, 3),
        compiled_graphs=outcome.graphs,
        cached_graphs=outcome.cached_graphs,
    )
