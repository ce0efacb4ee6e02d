"""Reading a checkpoint's tensors in the worker (`read_safetensors`, through `safetensors`); its
JSON objects are read by `decidealot.providers.json_files`, which the gateway shares.

`safetensors.torch.load_file` copies the whole file into tensors and the caller's `.float()`
then copies it again, so an fp16 checkpoint read as fp32 held both at once and paid two copies.
Here `safetensors.safe_open` maps the file and each tensor is copied from its view of the
mapping straight into its final dtype, one at a time, after which the view's pages of the
mapping are returned (they stay in the page cache): one copy in all, and at most the model
plus one tensor at its peak (docs/performance.md has the peak RSS of both readers).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from decidealot.providers.worker.memory import drop_pages


class WeightsError(ValueError):
    """A weights file that is not a well-formed safetensors file."""


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor in `path`, floating-point ones as `dtype` (None: as stored), each a tensor
    of its own (never a view of the file's mapping, which is gone once they are dropped)."""
    try:
        with safe_open(path, framework="pt") as file:
            names = file.keys()
            return {name: _own_copy(file.get_tensor(name), dtype) for name in names}
    except SafetensorError as exc:
        raise WeightsError(f"{path.name} is not a well-formed safetensors file ({exc})") from exc


def _own_copy(view: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`view` (of the file's private mapping, only ever read) copied into `dtype`; the view's
    pages of the mapping are then given back, so the file does not stay resident beside the
    copies (a page shared with the next tensor is read again from the page cache)."""
    target = dtype if dtype is not None and view.is_floating_point() else view.dtype
    out = view.to(target, copy=True)
    size = view.numel() * view.element_size()
    if size:
        drop_pages(view.data_ptr(), size)
    return out
