"""The four MCP tools as clients see them. Their schemas are the wire types' (the `system_one`
input is exactly the `POST /v1/systemone` body, each output the HTTP response type), with the
validator's bounds from `decidealot.schema`, as in the OpenAPI document."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
from mcp_types import Tool, ToolAnnotations

from decidealot.contract import BatchResponse, ModelList, SystemOneResponse, UnloadResponse
from decidealot.schema import declare_models, request_components

SYSTEM_ONE = "system_one"
SYSTEM_ONE_BATCH = "system_one_batch"
LIST_MODELS = "list_models"
UNLOAD_MODELS = "unload_models"

HTTP_ROUTES = {
    SYSTEM_ONE_BATCH: "POST /v1/systemone/batch",
    SYSTEM_ONE: "POST /v1/systemone",
    UNLOAD_MODELS: "POST /v1/models/unload",
    LIST_MODELS: "GET /v1/models",
}
"""The HTTP operation each tool is, longest route first (one route may start another)."""

INSTRUCTIONS = (
    "Decidealot answers typed questions about a state with a System One decision model: "
    "choice (pick one named option), score (expected level on an ordered rubric) and noul "
    "(probability that a statement is true), each with probabilities, in one forward pass and "
    "with no generated text. Call list_models for the accepted model names, then system_one or "
    "system_one_batch. Your caller decides what to do with the probabilities."
)

_SYSTEM_ONE_DESCRIPTION = """\
Judge one state with typed questions and get probabilities back, exactly like \
POST /v1/systemone.

Use it to classify, route, triage, moderate, gate or grade something against options you \
define: `choice` picks one of the named `criteria`, `score` gives the expected position on an \
ordered `criteria` list (0 = first), `noul` gives the probability that the statement in \
`instructions` is true. Several questions about the same state go into one call.

Not for: generating or rewriting text, answering open questions, looking up facts, or \
anything whose answer is not one of the options you list; the model never writes text. The \
probabilities are model output, not a policy: choose thresholds yourself.

Arguments are the HTTP body: `model` (a name from list_models), `state` (string, object or \
array), `questions` (name -> question) and optional `config` (CLM selectors accept \
{"temperature": t}; other models take none). A failed call is a tool error whose text is \
the HTTP API's envelope as JSON: {"detail": [{"loc", "msg", "type", "input"}]} for invalid \
input (each issue names its field in `loc`), {"code", "message", "details"} otherwise."""

_SYSTEM_ONE_BATCH_DESCRIPTION = """\
Run several independent System One decisions in one call, exactly like \
POST /v1/systemone/batch: `requests` is a non-empty list of complete system_one arguments, \
each with its own model, state, questions and config. Results come back in input order.

Use it when you have many items to judge (each item its own request) or need different \
models side by side. Every item is validated before any runs; if any item fails, the whole \
call fails with that item's error (loc `body.requests.<index>...`) and returns no partial \
results.

Not for: a single decision (use system_one), dependent steps where one answer changes the \
next question (call system_one in sequence), or text generation."""

_LIST_MODELS_DESCRIPTION = """\
List every model name system_one accepts, with a description and release date, exactly like \
GET /v1/models. Call it before system_one to pick `model`; names are exact selectors \
(aliases included).

Not for: health or load status; listing does not load any model."""

_UNLOAD_MODELS_DESCRIPTION = """\
Release every loaded local model (Laya, Von, CLM) so its memory returns to the system, \
exactly like POST /v1/models/unload. Idempotent: reports which providers were loaded. Fails \
with PROVIDER_BUSY (nothing unloaded) while a decision is running.

Not for: switching models (system_one loads and evicts by itself) or routine use (idle \
models unload on their own); hosted Jev has nothing to unload."""

_REQUEST_FIELD_DESCRIPTIONS = {
    "model": "One exact model name returned by list_models.",
    "state": "The thing to judge: a string, a JSON object or a JSON array.",
    "questions": (
        "Your question names -> questions; each answer comes back under the same name. "
        "`type` is choice (criteria: label -> description), score (criteria: ordered list) "
        "or noul (criteria: optional {true, false} descriptions). State the question and its "
        "rules in `instructions`."
    ),
}


_DEFS = "#/$defs/{name}"


def _object_schema(root: type[msgspec.Struct]) -> dict[str, Any]:
    """An MCP tool output schema: the struct's at the root (`type: object`), refs in $defs."""
    (_,), components = msgspec.json.schema_components([root], ref_template=_DEFS)
    return _rooted(root.__name__, components)


def _rooted(root: str, components: dict[str, Any]) -> dict[str, Any]:
    components = _plain_json_schema(components)
    schema: dict[str, Any] = components.pop(root)
    schema.pop("title", None)
    schema.pop("description", None)
    if components:
        schema["$defs"] = components
    return schema


def _plain_json_schema(value: Any) -> Any:
    """Drop OpenAPI's `discriminator`: not JSON Schema, and some clients refuse unknown
    keywords; the `type` tag's enum in each variant already tells them apart."""
    if isinstance(value, dict):
        return {k: _plain_json_schema(v) for k, v in value.items() if k != "discriminator"}
    if isinstance(value, list):
        return [_plain_json_schema(v) for v in value]
    return value


def _input(root: str) -> dict[str, Any]:
    """The `root` body with the validator's bounds, its fields described for an agent."""
    components = request_components(_DEFS)
    for name, text in _REQUEST_FIELD_DESCRIPTIONS.items():
        components["SystemOneRequest"]["properties"][name]["description"] = text
    components["BatchRequest"]["properties"]["requests"]["description"] = (
        "Complete system_one arguments, one per decision; results keep this order."
    )
    if root != "BatchRequest":
        del components["BatchRequest"]
    return _rooted(root, components)


_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}

TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            name=SYSTEM_ONE,
            title="System One decision",
            description=_SYSTEM_ONE_DESCRIPTION,
            input_schema=_input("SystemOneRequest"),
            output_schema=_object_schema(SystemOneResponse),
            annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True),
        ),
        Tool(
            name=SYSTEM_ONE_BATCH,
            title="System One decisions, batched",
            description=_SYSTEM_ONE_BATCH_DESCRIPTION,
            input_schema=_input("BatchRequest"),
            output_schema=_object_schema(BatchResponse),
            annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True),
        ),
        Tool(
            name=LIST_MODELS,
            title="List models",
            description=_LIST_MODELS_DESCRIPTION,
            input_schema=_NO_ARGUMENTS,
            output_schema=_object_schema(ModelList),
            annotations=ToolAnnotations(
                read_only_hint=True, idempotent_hint=True, open_world_hint=False
            ),
        ),
        Tool(
            name=UNLOAD_MODELS,
            title="Unload local models",
            description=_UNLOAD_MODELS_DESCRIPTION,
            input_schema=_NO_ARGUMENTS,
            output_schema=_object_schema(UnloadResponse),
            annotations=ToolAnnotations(
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        ),
    )
}  # in the order `tools/list` shows them


def listing(names: list[str] | None) -> list[Tool]:
    """Every tool as `tools/list` shows it now: `model` lists `names`, list_models' (None: they
    cannot be read), as in the OpenAPI document. Only `model` changes: an `anyOf` at the root of
    an input schema, as the document splits `config` by model, is refused by some hosts."""
    system_one = copy.deepcopy(TOOLS[SYSTEM_ONE].input_schema)
    declare_models(system_one, names, LIST_MODELS)
    batch = copy.deepcopy(TOOLS[SYSTEM_ONE_BATCH].input_schema)
    declare_models(batch["$defs"]["SystemOneRequest"], names, LIST_MODELS)
    schemas = {SYSTEM_ONE: system_one, SYSTEM_ONE_BATCH: batch}
    return [
        tool.model_copy(update={"input_schema": schemas[name]}) if name in schemas else tool
        for name, tool in TOOLS.items()
    ]
