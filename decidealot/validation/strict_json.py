"""Strict JSON, as every body and MCP tool argument is parsed: the rules JSON itself leaves open.

Valid UTF-8, no lone surrogates, no duplicate keys, no NaN/Infinity literals, floats that stay
finite and integers that fit in 64 bits; a body that breaks one is a 422 `json_invalid` issue at
the position where it broke.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from decidealot.contract import Json, ValidationIssue
from decidealot.errors import RequestInvalid

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate object key {key!r}")
            seen.add(key)
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """Finite, and inside the 64-bit integer range like `_int64`: JSON (and the OpenAPI
    document's JSON Schema) knows numbers by value, not by spelling, so 1e20 is refused as
    100000000000000000000 is. Every double past 2**53 is whole, so no fraction is lost."""
    value = float(text)
    if not -(2**63) <= value < 2**64:  # NaN and the infinities fail too
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


def _int64(text: str) -> int:
    """Integers must fit the 64 bits that every consumer (msgpack frames, TypeSafe) can carry."""
    value = int(text)
    if not -(2**63) <= value < 2**64:
        raise ValueError(f"the integer {text[:32]}... does not fit in 64 bits")
    return value


def parse_json(body: bytes) -> Json:
    """`body` as strict JSON (see above), or a 422 `json_invalid` issue."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _json_invalid(exc.start, "the body is not valid UTF-8") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_int64,
        )
    except json.JSONDecodeError as exc:
        raise _json_invalid(exc.pos, exc.msg) from None
    except ValueError as exc:  # the hooks' refusals
        raise _json_invalid(0, str(exc)) from None
    except RecursionError:
        raise _json_invalid(0, "the document is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(body):
        try:
            msgspec.json.encode(value)
        except UnicodeEncodeError:
            raise _json_invalid(0, "a string holds a lone UTF-16 surrogate") from None
    return value


def _json_invalid(position: int, reason: str) -> RequestInvalid:
    return RequestInvalid(
        [ValidationIssue(["body", position], f"JSON decode error: {reason}", "json_invalid", {})]
    )
