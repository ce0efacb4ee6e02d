"""Reading a checkpoint's files in the worker: its JSON objects (`read_json_object`, one message
for each way one can be unusable) and its tensors straight from a memory map of their file.

`safetensors.torch.load_file` copies the whole file into tensors and the caller's `.float()`
then copies it again, so an fp16 checkpoint read as fp32 held both at once and paid two copies.
Here each tensor is converted from a read-only view of the mapped file into its final dtype,
one tensor at a time: one copy in all, and at most the model plus nothing at its peak. The
format is safetensors' (an 8-byte little-endian header length, a JSON header of dtype, shape
and byte offsets per tensor, then the bytes); `safetensors` itself is not imported.
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_json_object(path: Path, error: Callable[[str], Exception]) -> dict[str, object]:
    """`path` as a JSON object; raises `error(message)` naming the file when it cannot be
    read, is not JSON or is not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(f"cannot read {path.name}") from exc
    if not isinstance(data, dict):
        raise error(f"{path.name} is not a JSON object")
    return data


class WeightsError(ValueError):
    """A weights file that is not a well-formed safetensors file."""


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor in `path`, floating-point ones as `dtype` (None: as stored), each a tensor
    of its own (never a view of the file, which is unmapped on return)."""
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise WeightsError(f"{path.name} is not a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        size = path.stat().st_size
        if length > size - 8:
            raise WeightsError(f"{path.name} is not a safetensors file")
        try:
            header = json.loads(file.read(length))
        except ValueError as exc:
            raise WeightsError(f"{path.name} has a malformed header") from exc
        if not isinstance(header, dict):
            raise WeightsError(f"{path.name} has a malformed header")
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + length else None
    tensors: dict[str, torch.Tensor] = {}
    try:
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            tensors[name] = _tensor(path, mapped, 8 + length, entry, dtype)
    finally:
        if mapped is not None:
            mapped.close()
    return tensors


def _tensor(
    path: Path, mapped: mmap.mmap | None, base: int, entry: object, dtype: torch.dtype | None
) -> torch.Tensor:
    try:
        stored = _DTYPES[entry["dtype"]]  # type: ignore[index]
        shape = [int(n) for n in entry["shape"]]  # type: ignore[index]
        start, end = (int(n) for n in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as exc:
        raise WeightsError(f"{path.name} has a malformed or unsupported tensor entry") from exc
    count = 1
    for n in shape:
        count *= n
    width = torch.empty((), dtype=stored).element_size()
    if end - start != count * width or start < 0 or (mapped is None and count):
        raise WeightsError(f"{path.name}: a tensor's size does not match its shape")
    target = dtype if dtype is not None and stored.is_floating_point else stored
    if count == 0:
        return torch.empty(shape, dtype=target)
    assert mapped is not None
    if base + end > len(mapped):
        raise WeightsError(f"{path.name} is shorter than its header says")
    with warnings.catch_warnings():  # a read-only view, only ever read from
        warnings.simplefilter("ignore", UserWarning)
        view = torch.frombuffer(mapped, dtype=stored, count=count, offset=base + start)
    out = torch.empty(shape, dtype=target)
    out.copy_(view.view(shape))
    del view
    # Its pages stay in the page cache, not in this process's memory.
    first = (base + start) // mmap.PAGESIZE * mmap.PAGESIZE
    mapped.madvise(mmap.MADV_DONTNEED, first, base + end - first)
    return out
