"""The OpenAPI document, from the msgspec wire types plus the validator's bounds; by hand, not by
Litestar, because the routes read their bodies themselves (limits, decompression, all-issues
validation), so Litestar cannot see their request types.

Its named examples are the contract's own requests beside answers whose numbers only show the
shape: Swagger UI pre-fills a body with an operation's first example, so a first "Try it out"
gets a decision, not a schema-generated body the validator refuses. An example is listed only
while every model it names is accepted.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import msgspec
from mcp.server.streamable_http import jsonrpc_message_adapter

from decidealot import registry, schema
from decidealot.catalog import Catalog
from decidealot.config import Settings
from decidealot.contract import (
    BatchResponse,
    ErrorBody,
    Health,
    ModelList,
    Status,
    SystemOneResponse,
    UnloadResponse,
    ValidationErrorBody,
)
from decidealot.errors import ProviderUnavailable, Unauthorized
from decidealot.validation.requests import unknown_model

_REF = "#/components/schemas/{name}"
_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


@dataclass(frozen=True)
class Example:
    summary: str
    request: dict[str, Any]
    response: dict[str, Any]

    @property
    def models(self) -> set[str]:
        items = self.request.get("requests", [self.request])
        return {item["model"] for item in items}


def _choice(probabilities: dict[str, float]) -> dict[str, Any]:
    best = max(probabilities, key=probabilities.__getitem__)
    return {
        "type": "choice",
        "choice": best,
        "confidence": probabilities[best],
        "probabilities": probabilities,
    }


def _answered(model: str, input_tokens: int, **answers: Any) -> dict[str, Any]:
    usage = {"input_tokens": input_tokens, "output_tokens": 0}
    return {"model": model, "answers": answers, "usage": usage}


_PRIORITIES = [
    "Routine, answer in the normal queue.",
    "Important, answer soon.",
    "Urgent, interrupt the on-call queue.",
]

CHOICE = Example(
    "A choice on laya: one named label",
    {
        "model": "laya",
        "state": {"operation": "delete", "resource": "protected-record", "reversible": False},
        "questions": {
            "handling": {
                "type": "choice",
                "instructions": "Select the required handling.",
                "criteria": {
                    "allow": "The operation is reversible and does not affect protected data.",
                    "require_review": "The operation is irreversible or affects protected data.",
                    "deny": "The operation is prohibited.",
                },
            }
        },
    },
    _answered(
        "laya-multilingual",
        91,
        handling=_choice({"allow": 0.02, "require_review": 0.94, "deny": 0.04}),
    ),
)

SCORE = Example(
    "A score on laya: an expected position on an ordered rubric",
    {
        "model": "laya",
        "state": "A customer reports repeated failures after following the documented setup.",
        "questions": {
            "priority": {
                "type": "score",
                "instructions": "Score the response priority.",
                "criteria": _PRIORITIES,
            }
        },
    },
    _answered(
        "laya-english",
        62,
        priority={
            "type": "score",
            "score": 1.63,
            "confidence": 0.81,
            "legend": {str(level): text for level, text in enumerate(_PRIORITIES)},
            "probabilities": {"0": 0.08, "1": 0.21, "2": 0.71},
        },
    ),
)

NOUL = Example(
    "A noul on laya: the probability that a statement is true",
    {
        "model": "laya",
        "state": [
            "The requested change removes an audit record.",
            "The requester has no documented exception.",
        ],
        "questions": {
            "needs_review": {
                "type": "noul",
                "instructions": "Is human review required before the change runs?",
                "criteria": {
                    "true": "Review is required before the operation.",
                    "false": "The operation may run without human review.",
                },
            }
        },
    },
    _answered("laya-english", 58, needs_review={"type": "noul", "noul": 0.97}),
)

CLM = Example(
    "CLM with a temperature (CLM selectors take one; the others take no config)",
    {
        "model": "clm",
        "config": {"temperature": 0.8},
        "state": "The customer requests a refund for a duplicate payment.",
        "questions": {
            "queue": {
                "type": "choice",
                "instructions": (
                    "Route payment or refund questions to billing; software failures to technical."
                ),
                "criteria": {
                    "billing": "Payment or refund question",
                    "technical": "Software failure",
                },
            }
        },
    },
    _answered("clm-0.1-8b", 41, queue=_choice({"billing": 0.9, "technical": 0.1})),
)

BATCH = Example(
    "Two independent decisions, answered in input order",
    {
        "requests": [
            {
                "model": "laya",
                "state": "A request would delete an audit record.",
                "questions": {
                    "review": {"type": "noul", "instructions": "Is human review needed?"}
                },
            },
            {
                "model": "von",
                "state": "A support request arrived with no account identifier.",
                "questions": {
                    "queue": {
                        "type": "choice",
                        "criteria": {"standard": "Normal queue", "review": "Needs manual routing"},
                    }
                },
            },
        ]
    },
    {
        "results": [
            _answered("laya-english", 21, review={"type": "noul", "noul": 0.92}),
            _answered("von-1.1", 23, queue=_choice({"standard": 0.2, "review": 0.8})),
        ]
    },
)

# the first example of an operation is the one Swagger UI pre-fills
DECISIONS = {"choice": CHOICE, "score": SCORE, "noul": NOUL, "clm-temperature": CLM}
BATCHES = {"batch": BATCH}

UNLOADED = {
    "status": "unloaded",
    "providers": [{"name": "laya", "wasLoaded": True}, {"name": "von", "wasLoaded": False}],
}
UNAUTHORIZED = {"code": Unauthorized.code, "message": Unauthorized.message, "details": {}}
UNKNOWN_MODEL = msgspec.to_builtins(ValidationErrorBody([unknown_model(["body"], "unknown-model")]))


_TRUNCATED: dict[str, Any] = {
    "description": (
        "Present only when the model read part of the state for some question: an RFC 8941 "
        "list of sf-strings, one per such question (its name), each with the integer "
        "parameters read (state tokens the model read for it) and total (the state's tokens "
        "for it), and item (the request's index) on a batch. See DECIDEALOT_LONG_STATES."
    ),
    "schema": {"type": "string"},
    "example": '"category";read=448;total=2029, "urgency";read=462;total=2029',
}


def _content(
    schema: str | dict[str, Any], named: dict[str, Any] | None = None, media: str = _JSON
) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": _ref(schema) if isinstance(schema, str) else schema}
    if named:
        body["examples"] = named
    return {media: body}


def _response(
    schema: str | dict[str, Any], description: str, examples: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"description": description, "content": _content(schema, _named(examples or {}))}


def _named(values: dict[str, Any], answers: bool = False) -> dict[str, Any]:
    """OpenAPI's named examples: an `Example`'s request with its summary (or its answer, under
    the same name, so that Swagger UI shows the two together), a plain value under its name."""
    return {
        name: {"summary": value.summary, "value": value.response if answers else value.request}
        if isinstance(value, Example)
        else {"value": value}
        for name, value in values.items()
    }


_ERRORS = {
    "401": _response(
        "ErrorBody",
        "UNAUTHORIZED: DECIDEALOT_API_KEY is set and the token is wrong.",
        {"unauthorized": UNAUTHORIZED},
    ),
    "408": _response("ErrorBody", "REQUEST_TIMEOUT: the body did not arrive in time."),
    "413": _response("ErrorBody", "REQUEST_TOO_LARGE: the (decoded) body exceeds the limit."),
    "415": _response(
        "ErrorBody", "Not JSON, multipart assets, or an unsupported Content-Encoding."
    ),
    "422": _response(
        "ValidationErrorBody",
        "TypeSafe validation envelope; every issue, with loc.",
        {"unknown-model": UNKNOWN_MODEL},
    ),
    "503": _response("ErrorBody", "PROVIDER_UNAVAILABLE."),
}


def _text(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}


_JSON_RPC = jsonrpc_message_adapter.json_schema(ref_template=_REF.replace("{name}", "{model}"))
"""The MCP SDK's own schema of the JSON-RPC messages `/mcp` takes: its $defs become components."""
_JSON_RPC_MESSAGE = {"anyOf": _JSON_RPC["anyOf"]}
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"const": "message"},
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["data"],
}  # one event of the stream: `data` is the JSON-RPC response


def _schemas(settings: Settings) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        [
            SystemOneResponse,
            BatchResponse,
            ModelList,
            Health,
            Status,
            UnloadResponse,
            ErrorBody,
            ValidationErrorBody,
        ],
        ref_template=_REF,
    )
    components |= schema.request_components(_REF, json_values=True)
    components |= copy.deepcopy(_JSON_RPC["$defs"])
    if limit := settings.max_batch_requests:
        components["BatchRequest"]["properties"]["requests"]["maxItems"] = limit
    return components


async def accepted_models(catalog: Catalog) -> dict[str, bool] | None:
    """Every name the catalog accepts now, hosted ones included, and whether it takes a
    temperature; None while a hosted catalog cannot be read."""
    try:
        listing = await catalog.models()
        routes = await catalog.resolve(info.name for info in listing)
    except ProviderUnavailable:
        return None
    return {name: route.accepts_temperature for name, route in routes.items() if route}


def _declare_models(request: dict[str, Any], models: dict[str, bool] | None) -> None:
    """`model` as the enum of accepted names, and `config` by model: a temperature only for
    the selectors that take one, so a schema-valid body is never refused for either."""
    schema.declare_models(request, None if models is None else list(models), "GET /v1/models")
    if models is None:
        return
    tempered = [name for name, temperature in models.items() if temperature]
    plain = [name for name, temperature in models.items() if not temperature]
    choices = [
        *([{"properties": {"model": {"enum": tempered}}}] if tempered else []),
        *([{"properties": {"model": {"enum": plain}, "config": {"maxProperties": 0}}}]
          if plain else []),
    ]  # fmt: skip
    if choices:  # an empty anyOf is not a schema; the empty enum already admits nothing
        request["anyOf"] = choices


def document(settings: Settings, models: dict[str, bool] | None = None) -> dict[str, Any]:
    """The document; `models` (from `accepted_models`) lists the names `model` accepts."""
    secured = settings.api_key is not None
    guarded = {"401": _ERRORS["401"]} if secured else {}
    body_errors = {k: _ERRORS[k] for k in ("408", "413", "415", "422", "503")}
    # the names an example may use: the catalog's, or (while a hosted catalog cannot be read)
    # every enabled local provider's, which never depend on it
    accepted = (
        set(models)
        if models is not None
        else {info.name for d in registry.enabled_local(settings) for info in d.selectors}
    )

    def operation(
        method: str, summary: str, responses: dict[str, Any], **more: Any
    ) -> dict[str, Any]:
        return {method: {"summary": summary, **more, "responses": responses}}

    def decision(
        request: str, response: str, summary: str, named: dict[str, Example]
    ) -> dict[str, Any]:
        shown = {name: example for name, example in named.items() if example.models <= accepted}
        answers = {
            "description": "The answers.",
            "content": _content(response, _named(shown, answers=True)),
            "headers": {"Decidealot-Truncated": _TRUNCATED},
        }
        body = {"required": True, "content": _content(request, _named(shown))}
        responses = {"200": answers, **guarded, **body_errors}
        return operation("post", summary, responses, requestBody=body)

    rpc = {"jsonrpc": "2.0"}
    mcp_examples: dict[str, Any] = {"tools-list": {**rpc, "id": 1, "method": "tools/list"}}
    if NOUL.models <= accepted:
        call = {"name": "system_one", "arguments": NOUL.request}
        mcp_examples["system-one"] = {**rpc, "id": 2, "method": "tools/call", "params": call}
    mcp_request = {"required": True, "content": _content(_JSON_RPC_MESSAGE, _named(mcp_examples))}
    mcp_responses = {
        "200": {
            "description": "The JSON-RPC response, as a server-sent event.",
            "content": _content(_SSE_EVENT, media="text/event-stream"),
        },
        "202": {"description": "A notification or response, accepted."},
        "400": {
            "description": (
                "A JSON-RPC error: not JSON (-32700), a batch or not one JSON-RPC 2.0 message "
                "(-32600), a protocol version header that disagrees with the body (-32020) or "
                "names no version served (-32022); or MALFORMED_BODY, a gzip/zstd body that "
                "cannot be decoded."
            ),
            "content": _content({"anyOf": [_ref("JSONRPCError"), _ref("ErrorBody")]}),
        },
        **guarded,
        "403": _text("The SDK's DNS-rebinding check: an Origin not allowed."),
        "406": _response("JSONRPCError", "Accept does not admit both JSON and event streams."),
        **{k: _ERRORS[k] for k in ("408", "413", "415", "503")},
        "421": _text("The SDK's DNS-rebinding check: a Host not allowed."),
    }

    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Decidealot", "version": "0.1.0"},
        "paths": {
            "/health": operation(
                "get",
                "Liveness and configured providers (never needs auth)",
                {
                    "200": _response("Health", "Serving."),
                    "503": _response("ErrorBody", "PROVIDER_UNAVAILABLE: shutting down."),
                },
                security=[],
            ),
            "/v1/status": operation(
                "get",
                "What runs: providers, checkpoints, precision and why, slots",
                {"200": _response("Status", "The service's state now."), **guarded},
            ),
            "/v1/models": operation(
                "get",
                "Every accepted model name",
                {
                    "200": _response("ModelList", "The catalog."),
                    **guarded,
                    "503": _response("ErrorBody", "The hosted catalog is unavailable."),
                },
            ),
            "/v1/systemone": decision(
                "SystemOneRequest", "SystemOneResponse", "One decision", DECISIONS
            ),
            "/v1/systemone/batch": decision(
                "BatchRequest",
                "BatchResponse",
                "Independent decisions, all or nothing",
                BATCHES,
            ),
            "/v1/models/unload": operation(
                "post",
                "Unload every loaded local provider (idempotent)",
                {
                    "200": _response(
                        "UnloadResponse", "What was loaded before.", {"unloaded": UNLOADED}
                    ),
                    **guarded,
                    "409": _response("ErrorBody", "PROVIDER_BUSY: a decision is running."),
                },
            ),
            "/mcp": operation(
                "post",
                "MCP over streamable HTTP (stateless JSON-RPC); see docs/mcp.md",
                mcp_responses,
                requestBody=mcp_request,
            ),
        },
        "components": {"schemas": _schemas(settings)},
    }
    _declare_models(document["components"]["schemas"]["SystemOneRequest"], models)
    if secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        document["security"] = [{"bearer": []}]
    if settings.root_path:
        # Behind a proxy under a prefix: Swagger's calls, and any client generated from the
        # document, go to the prefix (a relative server URL keeps the document's host).
        document["servers"] = [{"url": settings.root_path}]
    return document
