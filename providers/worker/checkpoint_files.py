"""Reading a checkpoint's tensors in the worker (its JSON objects: `providers.json_files`).

`safetensors.torch.load_file` copies the whole file into tensors and a `.float()` copies it
again, so an fp16 checkpoint read as fp32 held both at once. Here each tensor is copied from
the file's mapping straight into its final dtype, one at a time, and the mapping's pages are
returned: one copy, and at most the model plus one tensor at the peak (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from decidealot.providers.worker.memory import drop_pages


class WeightsError(ValueError):
    """A weights file that is not a well-formed safetensors file."""


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor in `path`, floating-point ones as `dtype` (None: as stored), each its own
    (never a view of the file's mapping, which is gone once they are dropped)."""
    try:
        with safe_open(path, framework="pt") as file:
            names = file.keys()
            return {name: _own_copy(file.get_tensor(name), dtype) for name in names}
    except SafetensorError as exc:
        raise WeightsError(f"{path.name} is not a well-formed safetensors file ({exc})") from exc


def _own_copy(view: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`view` copied into `dtype`, then its pages of the mapping given back (the page cache
    keeps them), so the file does not stay resident beside the copies."""
    target = dtype if dtype is not None and view.is_floating_point() else view.dtype
    out = view.to(target, copy=True)
    size = view.numel() * view.element_size()
    if size:
        drop_pages(view.data_ptr(), size)
    return out
