"""Device policy for local providers: which device, how large a pass, how many at once.

The gateway never imports torch: `resolve_device` decides `auto` from the NVIDIA driver's
files and, only where they exist, asks a short subprocess of the worker's interpreter. The
other functions turn settings and the device into the numbers a worker's start carries.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

from decidealot import cpu
from decidealot.config import ConfigError, Settings, precision_problem

log = logging.getLogger("decidealot.device")

_NVIDIA_DRIVER_FILES = (Path("/proc/driver/nvidia/version"), Path("/dev/nvidiactl"))
_CUDA_PROBE = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
_CUDA_PROBE_TIMEOUT_SECONDS = 120.0

CPU_TOKEN_BUDGET = 4096
CUDA_TOKEN_BUDGET = 32768


def token_budget(settings: Settings, device: str) -> int:
    """Padded tokens per engine run. On CPU a pass costs the same per token at any batch size,
    so big batches only delay every answer in them (and risk the pass timeout): small ones keep
    answers flowing while the next batch forms. On CUDA large batches are what pays."""
    if settings.batch_token_budget:
        return settings.batch_token_budget
    return CUDA_TOKEN_BUDGET if device == "cuda" else CPU_TOKEN_BUDGET


CPU_REQUEST_TOKEN_LIMIT = 32768
CUDA_REQUEST_TOKEN_LIMIT = 262144


def request_token_limit(settings: Settings, device: str) -> int:
    """The most model tokens one request may cost (0: no bound). On CPU at least two full
    8192-token windows plus their null rows fit (one long Von question with its debias row);
    the bound caps what one request holds in the shared passes and in memory."""
    if settings.max_request_tokens is not None:
        return settings.max_request_tokens
    return CUDA_REQUEST_TOKEN_LIMIT if device == "cuda" else CPU_REQUEST_TOKEN_LIMIT


def concurrent_passes(settings: Settings, device: str) -> int:
    """Forward passes a worker runs at once. On CUDA one: the device is the serial lane. On
    CPU a pass costs the same per token at any batch size, so cores, not batches, are what
    pays: as many passes as `DECIDEALOT_TORCH_THREADS`-thread passes fit on the usable cores
    (torch's default uses every core, so one)."""
    if settings.worker_passes:
        return settings.worker_passes
    if device == "cuda":
        return 1
    cores = _usable_cores()
    threads = settings.torch_threads or cores
    return max(1, cores // threads)


def _usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_device(settings: Settings) -> str:
    """`auto` is cuda when torch can use a GPU: cpu at no cost without NVIDIA driver files;
    with them, one subprocess of the worker's interpreter imports torch and asks, once."""
    if settings.device != "auto":
        return settings.device
    return _resolve_auto(settings.worker_python or sys.executable)


@functools.cache
def _resolve_auto(python: str) -> str:
    """Told once per process: every local provider's runtime asks."""
    device = _probe_cuda(python)
    log.info("DECIDEALOT_DEVICE=auto resolved to %s", device)
    return device


def check_cuda(settings: Settings) -> None:
    """`DECIDEALOT_DEVICE=cuda` where torch sees no GPU is a ConfigError naming the setting
    (startup runs this), not workers that report ready and then fail every pass."""
    if settings.device != "cuda":
        return
    if _probe_cuda(settings.worker_python or sys.executable) != "cuda":
        raise ConfigError(
            "DECIDEALOT_DEVICE=cuda: torch in the worker's interpreter sees no CUDA device here; "
            "set DECIDEALOT_DEVICE=cpu (or auto), or run where a GPU and its driver are visible"
        )


def check_precision(settings: Settings) -> None:
    """`DECIDEALOT_PRECISION` on the device it will run on: bf16 or int8 on a CPU without their
    units (`decidealot.cpu`) is a ConfigError naming the setting and the missing flags, told
    before listening, not a server that answers many times slower than fp32 (or dies of
    SIGILL in a kernel the CPU cannot run)."""
    problem = precision_problem(settings.precision, resolve_device(settings), cpu.flags())
    if problem is not None:
        raise ConfigError(f"DECIDEALOT_PRECISION: {problem}")


@functools.cache
def _probe_cuda(python: str) -> str:
    if not any(path.exists() for path in _NVIDIA_DRIVER_FILES):
        return "cpu"
    try:
        probe = subprocess.run(
            [python, "-P", "-c", _CUDA_PROBE],
            capture_output=True,
            text=True,
            timeout=_CUDA_PROBE_TIMEOUT_SECONDS,
            env=worker_environment(),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("could not ask torch whether CUDA is available (%s); using cpu", exc)
        return "cpu"
    return "cuda" if probe.stdout.strip() == "cuda" else "cpu"


def worker_environment() -> dict[str, str]:
    """The gateway's environment without DECIDEALOT_* values (keys among them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
