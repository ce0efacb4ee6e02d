"""The OpenAPI document, generated from the msgspec wire types plus the validator's bounds.

Built by hand rather than by Litestar because the routes read their bodies themselves (limits,
decompression, all-issues validation), so Litestar cannot see their request types.
"""

from __future__ import annotations

from typing import Any

import msgspec

from decidealot import validation
from decidealot.config import Settings
from decidealot.contract import (
    BatchRequest,
    BatchResponse,
    ErrorBody,
    Health,
    ModelList,
    SystemOneRequest,
    SystemOneResponse,
    UnloadResponse,
    ValidationErrorBody,
)

_REF = "#/components/schemas/{name}"
_TEXT = [{"type": "string"}, {"type": "object"}, {"type": "array"}]
_TEXT_OR_NULL = [*_TEXT, {"type": "null"}]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


_ERRORS = {
    "401": _json("ErrorBody", "UNAUTHORIZED: DECIDEALOT_API_KEY is set and the token is wrong."),
    "408": _json("ErrorBody", "REQUEST_TIMEOUT: the body did not arrive in time."),
    "413": _json("ErrorBody", "REQUEST_TOO_LARGE: the (decoded) body exceeds the limit."),
    "415": _json("ErrorBody", "Not JSON, multipart assets, or an unsupported Content-Encoding."),
    "422": _json("ValidationErrorBody", "TypeSafe validation envelope; every issue, with loc."),
    "503": _json("ErrorBody", "PROVIDER_UNAVAILABLE."),
}


def _schemas(settings: Settings) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [
            SystemOneRequest,
            BatchRequest,
            SystemOneResponse,
            BatchResponse,
            ModelList,
            Health,
            UnloadResponse,
            ErrorBody,
            ValidationErrorBody,
        ],
        ref_template=_REF,
    )
    request = components["SystemOneRequest"]
    request["additionalProperties"] = False
    request["description"] = "One System One decision request."
    request["properties"]["questions"].update(
        minProperties=1,
        maxProperties=validation.MAX_QUESTIONS,
        propertyNames={"minLength": 1, "maxLength": validation.MAX_QUESTION_NAME_CHARS},
    )
    request["properties"]["config"] = {
        "type": "object",
        "description": 'CLM selectors: {"temperature": t} with 0 < t <= 100. '
        "Every other selector: omitted or {}.",
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
        components[name]["properties"]["instructions"] = {"anyOf": _TEXT_OR_NULL}
    components["ChoiceQuestion"]["properties"]["criteria"] = {
        "type": "object",
        "minProperties": 1,
        "maxProperties": validation.MAX_CHOICE_OPTIONS,
        "propertyNames": {"minLength": 1, "maxLength": validation.MAX_LABEL_CHARS},
        "additionalProperties": {"anyOf": _TEXT_OR_NULL},
    }
    components["ScoreQuestion"]["properties"]["criteria"] = {
        "type": "array",
        "minItems": validation.MIN_SCORE_LEVELS,
        "maxItems": validation.MAX_SCORE_LEVELS,
        "items": {"anyOf": _TEXT},
    }
    components["NoulQuestion"]["properties"]["criteria"] = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"true": {"anyOf": _TEXT_OR_NULL}, "false": {"anyOf": _TEXT_OR_NULL}},
                "additionalProperties": False,
            },
            {"type": "null"},
        ]
    }
    batch = components["BatchRequest"]
    batch["additionalProperties"] = False
    batch["properties"]["requests"]["minItems"] = 1
    if settings.max_batch_requests:
        batch["properties"]["requests"]["maxItems"] = settings.max_batch_requests
    return components


def build(settings: Settings) -> dict[str, Any]:
    secured = settings.api_key is not None
    guarded = {"401": _ERRORS["401"]} if secured else {}
    body_errors = {k: _ERRORS[k] for k in ("408", "413", "415", "422", "503")}

    def decision(request: str, response: str, summary: str) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref(request)}},
                },
                "responses": {"200": _json(response, "The answers."), **guarded, **body_errors},
            }
        }

    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Decidealot", "version": "0.1.0"},
        "paths": {
            "/health": {
                "get": {
                    "summary": "Liveness and configured providers (never needs auth)",
                    "security": [],
                    "responses": {
                        "200": _json("Health", "Serving."),
                        "503": _json("ErrorBody", "PROVIDER_UNAVAILABLE: shutting down."),
                    },
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "Every accepted model name",
                    "responses": {
                        "200": _json("ModelList", "The catalog."),
                        **guarded,
                        "503": _json("ErrorBody", "The hosted catalog is unavailable."),
                    },
                }
            },
            "/v1/systemone": decision("SystemOneRequest", "SystemOneResponse", "One decision"),
            "/v1/systemone/batch": decision(
                "BatchRequest", "BatchResponse", "Independent decisions, all or nothing"
            ),
            "/v1/models/unload": {
                "post": {
                    "summary": "Unload every loaded local provider (idempotent)",
                    "responses": {
                        "200": _json("UnloadResponse", "What was loaded before."),
                        **guarded,
                        "409": _json("ErrorBody", "PROVIDER_BUSY: a decision is running."),
                    },
                }
            },
            "/mcp": {
                "post": {
                    "summary": "MCP over streamable HTTP (stateless JSON-RPC); see docs/mcp.md",
                    "responses": {
                        "200": {"description": "A JSON-RPC response."},
                        **guarded,
                        "default": {
                            "description": "A transport rejection from the MCP SDK (bad "
                            "Content-Type or Accept, disallowed Host, body too large)."
                        },
                    },
                }
            },
        },
        "components": {"schemas": _schemas(settings)},
    }
    if secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    return document
