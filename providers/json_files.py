"""The one reader of a provider's JSON files that must hold an object, in both processes.

Python's `json`, not msgspec: the upstream packages read these files with it, so a NaN or
Infinity literal loads here as it loads there (the parity tests hold us to that).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}


def read_json_object(path: Path, error: Callable[[str], Exception]) -> dict[str, Any]:
    """`path` as a JSON object, else `error(message)`, the message naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path.name} cannot be read ({exc.strerror or type(exc).__name__})") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{path.name} is not UTF-8 JSON ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path.name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        kind = _KINDS.get(type(data), "null")
        raise error(f"{path.name} is not a JSON object but {kind}")
    return data
