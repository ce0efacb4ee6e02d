"""Handing a worker's freed memory back to the system, and reading what it holds.

A freed tensor's pages stay in the process's malloc arenas (reusable by it, but counted in its
resident memory) until glibc is asked to return them: after an engine is dropped
(`process.release_memory`) and after int8 quantisation has dropped the fp32 weights and the
probe's activations (`int8.quantize_guarded`). Worker-side only.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
from pathlib import Path


def release_freed() -> None:
    """Collect cycles, empty torch's CUDA cache when CUDA was used, and ask glibc to return
    its free heap pages (`malloc_trim`)."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)


def trim() -> None:
    """Ask glibc to return its free heap pages (`malloc_trim`), without a collection: what a
    worker does each time its passes fall idle. Each compute thread's malloc arena keeps the
    pages of its largest pass's temporaries, a bf16 or int8 pass's (casts, quantised copies)
    more than an fp32 one's, so after a round of load a reduced-precision worker held as much
    as an fp32 one; trimmed, it holds its weights' saving between rounds (docs/performance.md).
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).malloc_trim(0)


def resident_bytes() -> int:
    """This process's resident memory (Linux `/proc/self/statm`), 0 where it cannot be read."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")
