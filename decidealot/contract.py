"""Wire types of the Decidealot contract (seeds/003): requests, answers, listings and errors.

Only `decidealot.validation.requests` builds requests, so everything past it holds validated
structs. Fields are in the order the contract's examples show."""

from __future__ import annotations

import math
import re
from typing import Any, Literal, TypeAlias
from urllib.parse import quote, unquote

import msgspec

Json: TypeAlias = Any  # any JSON value: msgspec cannot name a recursive alias

State: TypeAlias = str | dict[str, Json] | list[Json]
Loc: TypeAlias = list[str | int]

# -- requests --------------------------------------------------------------------------------


class ChoiceQuestion(msgspec.Struct, tag="choice", tag_field="type", frozen=True):
    """Pick one of the named options; `criteria` keys are the only valid labels."""

    criteria: dict[str, Json]
    instructions: Json = None


class ScoreQuestion(msgspec.Struct, tag="score", tag_field="type", frozen=True):
    """Expected level on an ordered rubric; a level's position is its score, from 0."""

    criteria: list[Json]
    instructions: Json = None


class NoulQuestion(msgspec.Struct, tag="noul", tag_field="type", frozen=True):
    """Probability that a statement is true; `criteria` keys are only `true` and `false`."""

    instructions: Json = None
    criteria: dict[str, Json] | None = None


Question: TypeAlias = ChoiceQuestion | ScoreQuestion | NoulQuestion


class SystemOneRequest(msgspec.Struct, frozen=True):
    """A validated `POST /v1/systemone` body. `config` is {} when omitted."""

    model: str
    state: State
    questions: dict[str, Question]
    config: dict[str, Json] = msgspec.field(default_factory=dict)


class BatchRequest(msgspec.Struct, frozen=True):
    requests: list[SystemOneRequest]


class Labelled(msgspec.Struct, frozen=True):
    """One row of a label file (`decidealot calibrate`)."""

    line: int
    state: State
    question: Question
    gold: int  # the right answer: a choice label's index in criteria, a score level, noul 1 if true


# -- answers ---------------------------------------------------------------------------------


class ChoiceAnswer(msgspec.Struct, tag="choice", tag_field="type"):
    choice: str
    confidence: float
    probabilities: dict[str, float]


class ScoreAnswer(msgspec.Struct, tag="score", tag_field="type"):
    score: float
    confidence: float
    legend: dict[str, Json]
    probabilities: dict[str, float]


class NoulAnswer(msgspec.Struct, tag="noul", tag_field="type"):
    noul: float


Answer: TypeAlias = ChoiceAnswer | ScoreAnswer | NoulAnswer


def reported_level(answer: ScoreAnswer) -> int:
    """The rubric level nearest a score answer's expected score (halves round up)."""
    return min(max(math.floor(answer.score + 0.5), 0), max(len(answer.probabilities) - 1, 0))


def answer_confidence(answer: Answer) -> float:
    """The probability of the answer reported, the number a caller thresholds (not the entropy
    `confidence`): `probabilities[choice]`, a noul's max(p, 1 - p), a score's nearest level's.
    `decidealot evaluate` judges thresholds on it and `/metrics` watches it drift."""
    if isinstance(answer, NoulAnswer):
        return max(answer.noul, 1.0 - answer.noul)
    if isinstance(answer, ChoiceAnswer):
        chosen = answer.probabilities.get(answer.choice)
    else:
        chosen = answer.probabilities.get(str(reported_level(answer)))
    return chosen if chosen is not None else max(answer.probabilities.values(), default=0.0)


class Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int = 0


class Cut(msgspec.Struct, frozen=True, omit_defaults=True):
    """A question whose state the model read only in part (`read` of `total` tokens; `item`: the
    request's index in a batch), told beside the body (`Decidealot-Truncated`, MCP `_meta`)."""

    question: str
    read: int
    total: int
    item: int | None = None


TRUNCATED_HEADER = "Decidealot-Truncated"
TRUNCATED_META = "decidealot/truncated"


def truncated_header(cuts: list[Cut]) -> str:
    """`cuts` as an RFC 8941 List of sf-strings with integer parameters (docs/api.md)."""
    members = []
    for cut in cuts:
        item = "" if cut.item is None else f";item={cut.item}"
        members.append(f"{_sf_string(cut.question)};read={cut.read};total={cut.total}{item}")
    return ", ".join(members)


_PRINTABLE_BUT_PERCENT = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def _sf_string(text: str) -> str:
    """An sf-string holds printable ASCII only: `"` and `\\` are escaped as RFC 8941 says,
    `%` and any other character are written as their UTF-8 bytes `%`-escaped."""
    escaped = quote(text, safe=_PRINTABLE_BUT_PERCENT).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


_MEMBER = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"((?:;[a-z*][a-z0-9_.*-]*=-?[0-9]{1,15})*)')
_LIST = re.compile(rf"{_MEMBER.pattern}(?:[ \t]*,[ \t]*{_MEMBER.pattern})*")


def read_truncated_header(value: str) -> list[Cut] | None:
    """The cuts a `Decidealot-Truncated` header names, or None when it is not one."""
    if not _LIST.fullmatch(value):
        return None
    cuts = []
    for match in _MEMBER.finditer(value):
        params = dict(param.split("=") for param in match.group(2).split(";")[1:])
        if not {"read", "total"} <= params.keys():
            return None
        try:
            question = unquote(re.sub(r"\\(.)", r"\1", match.group(1)), errors="strict")
        except UnicodeDecodeError:
            return None
        item = int(params["item"]) if "item" in params else None
        cuts.append(Cut(question, int(params["read"]), int(params["total"]), item))
    return cuts


class SystemOneResponse(msgspec.Struct):
    """`model` names the model that answered, which can differ from the requested alias."""

    model: str
    answers: dict[str, Answer]
    usage: Usage


class BatchResponse(msgspec.Struct):
    results: list[SystemOneResponse]


# -- listings --------------------------------------------------------------------------------


class ModelInfo(msgspec.Struct, frozen=True):
    name: str
    description: str
    release_date: str


class ModelList(msgspec.Struct):
    models: list[ModelInfo]


class Health(msgspec.Struct):
    status: Literal["ok"]
    providers: list[str]


class CheckpointStatus(msgspec.Struct, kw_only=True):
    """A checkpoint a local provider's worker holds, as it reported its load."""

    name: str
    precision: str
    requested: str  # the `DECIDEALOT_PRECISION` value it came from (`auto` by default)
    reason: str  # `requested`, what `auto` chose on which CPU flags, or the load probe's fallback
    folder: str
    verified: str | None  # `repo@revision` of the install record that verified it; None: local
    int8_share: float  # share of its encoder's linear layers that run int8 (0 outside `int8`)
    calibration: str | None = None  # its `DECIDEALOT_*_CALIBRATION` file; None: as shipped
    passes: str = "eager"  # what its passes run through: eager, or compiled once checked
    compile_state: str = "off"  # off, eager_precision, no_compiler, compiling, compiled, ...
    compile_reason: str = ""  # `compile_state` in words (`DECIDEALOT_COMPILE`)
    compile_seconds: float = 0.0  # how long the compile on the warm-up rows took
    compiled_graphs: int = 0  # FX graphs it compiled or found
    cached_graphs: int = 0  # of those, found in the on-disk cache


class ProviderStatus(msgspec.Struct, kw_only=True):
    name: str
    enabled: bool
    local: bool
    loaded: bool | None = None  # whether its worker is up (None: a hosted or disabled one)
    device: str | None = None
    running: int = 0  # decisions holding its residency slot now
    checkpoints: list[CheckpointStatus] = []
    details: dict[str, Json] = {}  # its own (CLM `encoder_answered_last_call`, Jev catalog age)


class SlotStatus(msgspec.Struct, kw_only=True):
    total: int  # `DECIDEALOT_MAX_RESIDENT_PROVIDERS`
    held_by: list[str]


class DecisionStatus(msgspec.Struct, kw_only=True):
    queued: int  # admitted to local providers and not yet holding a slot
    running: int  # holding a slot: sent to a worker, or about to be
    limit: int  # `DECIDEALOT_MAX_PENDING_REQUESTS` (0: no bound) on queued plus running


class CpuStatus(msgspec.Struct, kw_only=True):
    bf16_units: list[str]  # native bf16 flags (amx_bf16, avx512_bf16): where `auto` runs bf16
    int8_units: list[str]  # int8 dot-product flags (amx_int8, avx512_vnni, avx_vnni)


class Status(msgspec.Struct, kw_only=True):
    """`GET /v1/status`: what runs, for an operator (the contract's `/health` stays as it is)."""

    status: Literal["ok", "draining"]
    precision: str  # `DECIDEALOT_PRECISION` as set
    cpu: CpuStatus
    providers: list[ProviderStatus]
    slots: SlotStatus
    decisions: DecisionStatus


class UnloadedProvider(msgspec.Struct):
    name: str
    was_loaded: bool = msgspec.field(name="wasLoaded")


class UnloadResponse(msgspec.Struct, kw_only=True):
    status: Literal["unloaded"] = "unloaded"
    providers: list[UnloadedProvider]


# -- errors ----------------------------------------------------------------------------------


class ValidationIssue(msgspec.Struct):
    """One entry of the TypeSafe/FastAPI 422 envelope."""

    loc: Loc
    msg: str
    type: str
    input: Json = None


class ValidationErrorBody(msgspec.Struct):
    detail: list[ValidationIssue]


class ErrorBody(msgspec.Struct):
    """Decidealot's envelope for failures outside the input contract."""

    code: str
    message: str
    details: dict[str, Json] = msgspec.field(default_factory=dict)
