"""JSON Schemas of the request bodies with every bound the validator enforces, for both the
OpenAPI document and the MCP tools; msgspec derives the shapes from the wire types."""

from __future__ import annotations

from typing import Any

import msgspec

from decidealot.contract import BatchRequest, SystemOneRequest
from decidealot.validation import requests as validation

CONFIG_DESCRIPTION = (
    f'CLM selectors: {{"temperature": t}} with 0 < t <= {validation.MAX_TEMPERATURE:g}. '
    "Every other selector: omitted or {}."
)


INTEGER = {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}
SMALL_NUMBER = {"type": "number", "minimum": -(2**53), "maximum": 2**53}
"""Together, what `strict_json.parse_json` takes for a number: the 64-bit integer range, however
spelled. Every double past 2**53 is whole, so the two cover each number once; as one bounded
`number`, hypothesis-based generators would reject most of what they draw."""


def _json_value(ref: dict[str, str]) -> dict[str, Any]:
    """Any JSON value as `parse_json` reads it, numbers bounded, so that a schema-valid body is
    never refused and a body this calls invalid always is."""
    return {
        "anyOf": [
            {"type": ["null", "boolean", "string"]},
            INTEGER,
            SMALL_NUMBER,
            {"type": "array", "items": ref},
            {"type": "object", "additionalProperties": ref},
        ]
    }


def request_components(ref_template: str, *, json_values: bool = False) -> dict[str, Any]:
    """`SystemOneRequest`, `BatchRequest` and the question types, by name, refs spelled by
    `ref_template`. With `json_values` the free JSON in a state, instructions and criteria is a
    recursive `JsonValue` (numbers bounded), for tools that generate bodies; without, only a
    string, object or array, which every MCP client reads."""
    _, components = msgspec.json.schema_components(
        [SystemOneRequest, BatchRequest], ref_template=ref_template
    )
    if json_values:
        value = {"$ref": ref_template.format(name="JsonValue")}
        components["JsonValue"] = _json_value(value)
        text: list[dict[str, Any]] = [
            {"type": "string"},
            {"type": "object", "additionalProperties": value},
            {"type": "array", "items": value},
        ]
    else:
        text = [{"type": "string"}, {"type": "object"}, {"type": "array"}]
    text_or_null = [*text, {"type": "null"}]
    request = components["SystemOneRequest"]
    request["additionalProperties"] = False
    request["description"] = "One System One decision request."
    request["properties"]["state"] = {"anyOf": text}
    request["properties"]["questions"].update(
        minProperties=1,
        maxProperties=validation.MAX_QUESTIONS,
        propertyNames={"minLength": 1, "maxLength": validation.MAX_QUESTION_NAME_CHARS},
    )
    request["properties"]["config"] = {
        "type": "object",
        "description": CONFIG_DESCRIPTION,
        "properties": {
            "temperature": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": validation.MAX_TEMPERATURE,
            }
        },
        "additionalProperties": False,
    }
    for name in ("ChoiceQuestion", "ScoreQuestion", "NoulQuestion"):
        components[name]["additionalProperties"] = False
        components[name]["properties"]["instructions"] = {"anyOf": text_or_null}
    components["ChoiceQuestion"]["properties"]["criteria"] = {
        "type": "object",
        "minProperties": 1,
        "maxProperties": validation.MAX_CHOICE_OPTIONS,
        "propertyNames": {"minLength": 1, "maxLength": validation.MAX_LABEL_CHARS},
        "additionalProperties": {"anyOf": text_or_null},
    }
    components["ScoreQuestion"]["properties"]["criteria"] = {
        "type": "array",
        "minItems": validation.MIN_SCORE_LEVELS,
        "maxItems": validation.MAX_SCORE_LEVELS,
        "items": {"anyOf": text},
    }
    components["NoulQuestion"]["properties"]["criteria"] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"true": {"anyOf": text_or_null}, "false": {"anyOf": text_or_null}},
                "additionalProperties": False,
            },
            {"type": "null"},
        ]
    }
    batch = components["BatchRequest"]
    batch["additionalProperties"] = False
    batch["properties"]["requests"]["minItems"] = 1
    return components


def declare_models(request: dict[str, Any], names: list[str] | None, listing: str) -> None:
    """`model` of a `SystemOneRequest` schema as the enum of `names`, the catalog now, or open
    and saying so where there are none (a hosted catalog could not be read); `listing` is where
    a caller reads them (`GET /v1/models`, `list_models`)."""
    model = request["properties"]["model"]
    if names is None:
        model["description"] = (
            f"A name from {listing} (the hosted catalog could not be read when this schema "
            "was served, so the names are not listed here)."
        )
        return
    model["enum"] = names
    model["description"] = f"A name from {listing}: the catalog when this schema was served."
