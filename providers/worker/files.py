"""Reading a checkpoint's JSON files, with one message for each way one can be unusable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def json_object(path: Path, error: Callable[[str], Exception]) -> dict[str, object]:
    """`path` as a JSON object; raises `error(message)` naming the file when it cannot be
    read, is not JSON or is not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise error(f"cannot read {path.name}") from exc
    if not isinstance(data, dict):
        raise error(f"{path.name} is not a JSON object")
    return data
