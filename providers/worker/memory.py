"""Handing a worker's freed memory back to the system, and reading what it holds.

A freed tensor's pages stay in the process's malloc arenas (reusable by it, but counted in its
resident memory) until glibc is asked to return them: after an engine is dropped
(`process.release_memory`), after int8 quantisation has dropped the fp32 weights and the
probe's activations (`int8.quantize_guarded`), and when passes fall idle (`trim`). A file
mapping's pages read once are given back with `drop_pages` (Laya's safetensors reader).
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import sys
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)
"""glibc's; None on a libc without it (musl, macOS), where freed pages stay with the process."""


def release_freed() -> None:
    """Collect cycles, empty torch's CUDA cache when CUDA was used, and ask glibc to return
    its free heap pages (`malloc_trim`)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def trim() -> None:
    """Each time passes fall idle: each compute thread's arena keeps its largest pass's
    temporaries (a bf16 or int8 pass's more than fp32's), so untrimmed a reduced-precision worker
    held as much as an fp32 one after a round of load (docs/performance.md)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def drop_pages(address: int, size: int) -> None:
    """Give back the pages of a private file mapping that cover `size` bytes at `address`
    (`madvise(MADV_DONTNEED)`): read again from the page cache if ever touched."""
    first = address // mmap.PAGESIZE * mmap.PAGESIZE
    length = address + size - first
    _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(length), mmap.MADV_DONTNEED)


def resident_bytes() -> int:
    """This process's resident memory (Linux `/proc/self/statm`), 0 where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")
