"""What this CPU's matrix units can do, from the flags the kernel lists in /proc/cpuinfo.

Reduced precision pays on a CPU only where it has units for it: bf16 matrix products run about
10x fp32 with AMX and 3x with avx512_bf16, but at about 1 GFLOP/s where neither exists, and
int8 through `torch._int_mm` is 20x slower than fp32 without VNNI or AMX (docs/performance.md).
It is decided from the flags, never by running a kernel: oneDNN can pick an instruction the CPU
lacks, and the process dies of SIGILL. The gateway (refusals) and the worker (`auto`) read them.
"""

from __future__ import annotations

import functools
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
BF16_UNITS = ("amx_bf16", "avx512_bf16")  # native bf16 dot products, best first
INT8_UNITS = ("amx_int8", "avx512_vnni", "avx_vnni")  # int8 dot-product units, best first


@functools.cache
def _read_flags(path: Path) -> frozenset[str]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):  # x86, arm64
            return frozenset(value.split())
    return frozenset()


def flags() -> frozenset[str]:
    """This CPU's feature flags (empty where /proc/cpuinfo cannot be read: no native units)."""
    return _read_flags(CPUINFO)


def bf16_units(cpu: frozenset[str]) -> tuple[str, ...]:
    """The native bf16 flags `cpu` has, best first; () where bf16 would be emulated."""
    return tuple(flag for flag in BF16_UNITS if flag in cpu)


def int8_units(cpu: frozenset[str]) -> tuple[str, ...]:
    """The int8 dot-product flags `cpu` has, best first; () where int8 would be emulated."""
    return tuple(flag for flag in INT8_UNITS if flag in cpu)


def missing_units(precision: str, cpu: frozenset[str]) -> str | None:
    """Why `precision` would be slow on a CPU with flags `cpu`, naming the flags it lacks."""
    wanted = {"bf16": BF16_UNITS, "int8": INT8_UNITS}.get(precision)
    if wanted is None or any(flag in cpu for flag in wanted):
        return None
    return (
        f"{precision} on this CPU would be emulated, slower than fp32: it has none of "
        f"{', '.join(wanted)} (see /proc/cpuinfo flags)"
    )


def auto_precision(device: str, cpu: frozenset[str], on_cuda: str) -> tuple[str, str]:
    """What `DECIDEALOT_PRECISION=auto` runs on `device` (resolved), and why: `on_cuda` is what
    the engine's upstream runs on a GPU; a bf16 choice may still fall back to fp32 at load."""
    if device == "cuda":
        return on_cuda, f"auto on cuda: {on_cuda}, as upstream runs on a GPU"
    units = bf16_units(cpu)
    if units:
        return "bf16", f"auto on a CPU with {', '.join(units)}"
    return "fp32", f"auto on a CPU with none of {', '.join(BF16_UNITS)}"
