"""The System One request rules: decoded JSON -> validated, routed requests, or every issue.

HTTP and MCP both call `strict_json.parse_json`, then `validate_request` / `validate_batch`; nothing
reaches a provider before they return, and each request comes back with the route its model resolved
to, which the executor runs it on (nothing resolves a name twice). Issues use TypeSafe's
(FastAPI/pydantic) 422 shape, with the question type in `loc` the way pydantic reports a
discriminated union: `["body", "questions", "urgency", "score", "criteria"]`. All issues of a body
are reported at once, not just the first.

Bounds beyond TypeSafe's schema (documented in docs/api.md): question names 1-128 characters,
choice labels 1-256 characters, at most 1024 questions, 1-255 choice options, 2-10 score
levels; the body as a whole is bounded by DECIDEALOT_MAX_REQUEST_BYTES.
"""

from __future__ import annotations

import math
from typing import Any

from decidealot import tracing
from decidealot.catalog import Catalog, Route, Routed
from decidealot.contract import (
    ChoiceQuestion,
    Json,
    Loc,
    NoulQuestion,
    Question,
    ScoreQuestion,
    SystemOneRequest,
    ValidationIssue,
)
from decidealot.errors import ProviderUnavailable, RequestInvalid

MAX_QUESTIONS = 1024
MAX_QUESTION_NAME_CHARS = 128
MAX_CHOICE_OPTIONS = 255
MAX_LABEL_CHARS = 256
MIN_SCORE_LEVELS, MAX_SCORE_LEVELS = 2, 10
MAX_TEMPERATURE = 100.0

_REQUEST_FIELDS = frozenset({"model", "state", "questions", "config"})
_QUESTION_FIELDS = {
    "choice": frozenset({"type", "instructions", "criteria"}),
    "score": frozenset({"type", "instructions", "criteria"}),
    "noul": frozenset({"type", "instructions", "criteria"}),
}
_TAGS = "'choice', 'score', 'noul'"
_UNCHECKED: Any = object()
"""Stands for a route that could not be looked up (hosted catalog down, body invalid anyway)."""


# -- requests ----------------------------------------------------------------------------------


class _Issues(list[ValidationIssue]):
    def add(self, loc: Loc, msg: str, type_: str, input_: Json = None) -> None:
        self.append(ValidationIssue(list(loc), msg, type_, input_))

    def missing(self, loc: Loc) -> None:
        """`input` is `{}`, as in TypeSafe's example: the parent may hold state contents."""
        self.add(loc, "Field required", "missing", {})

    def extra(self, loc: Loc, value: Json) -> None:
        self.add(loc, "Extra inputs are not permitted", "extra_forbidden", value)


@tracing.traced("validation")
async def validate_request(obj: Json, catalog: Catalog) -> Routed:
    """One `POST /v1/systemone` body (decoded JSON) -> validated request, or RequestInvalid."""
    issues = _Issues()
    draft = _check_request(obj, ["body"], issues)
    names = {draft.model} if draft.model is not None else set()
    routes = await _resolve(catalog, names, bool(issues))
    request = _finish(draft, routes, issues)
    if issues or request is None:
        raise RequestInvalid(issues)
    return request


@tracing.traced("validation")
async def validate_batch(obj: Json, catalog: Catalog, max_requests: int = 0) -> list[Routed]:
    """A `POST /v1/systemone/batch` body; every item (config included) is checked first."""
    issues = _Issues()
    if not isinstance(obj, dict):
        issues.add(["body"], "Input should be a valid dictionary", "dict_type", None)
        raise RequestInvalid(issues)
    for key in obj:
        if key != "requests":
            issues.extra(["body", key], obj[key])
    items = obj.get("requests")
    per_item: list[tuple[_Draft, _Issues]] = []
    if "requests" not in obj:
        issues.missing(["body", "requests"])
    elif not isinstance(items, list):
        issues.add(["body", "requests"], "Input should be a valid list", "list_type", items)
    elif not items:
        issues.add(
            ["body", "requests"],
            "List should have at least 1 item after validation, not 0",
            "too_short",
            items,
        )
    elif max_requests and len(items) > max_requests:
        issues.add(
            ["body", "requests"],
            f"List should have at most {max_requests} items after validation, not {len(items)}",
            "too_long",
            None,
        )
    else:
        for index, item in enumerate(items):
            item_issues = _Issues()
            per_item.append(
                (_check_request(item, ["body", "requests", index], item_issues), item_issues)
            )
    names = {draft.model for draft, _ in per_item if draft.model is not None}
    routes = await _resolve(catalog, names, bool(issues) or any(i for _, i in per_item))
    requests = []
    for draft, item_issues in per_item:  # issues in item order
        requests.append(_finish(draft, routes, item_issues))
        issues.extend(item_issues)
    if issues:
        raise RequestInvalid(issues)
    return [r for r in requests if r is not None]


async def _resolve(catalog: Catalog, names: set[str], invalid: bool) -> dict[str, Route | None]:
    """Routes for `names`. When the hosted catalog is down, a body that is invalid anyway gets
    its 422 (without the model check) rather than the 503."""
    if not names:
        return {}
    try:
        return await catalog.resolve(names)
    except ProviderUnavailable:
        if invalid:
            return {name: _UNCHECKED for name in names}
        raise


class _Draft:
    """What a request's structural check produced; the model's route is checked after."""

    __slots__ = ("config", "loc", "model", "ok", "questions", "state")

    def __init__(self, loc: Loc) -> None:
        self.loc = loc
        self.ok = True
        self.model: str | None = None
        self.state: Json = None
        self.questions: dict[str, Question] = {}
        self.config: Json = None


def _check_request(obj: Json, loc: Loc, issues: _Issues) -> _Draft:
    draft = _Draft(loc)
    before = len(issues)
    if not isinstance(obj, dict):
        issues.add(loc, "Input should be a valid dictionary or object", "dict_type", None)
        draft.ok = False
        return draft
    for key, value in obj.items():
        if key == "assets":
            issues.add(
                [*loc, key],
                "Value error, image assets are not supported by these models",
                "value_error",
                None,
            )
        elif key not in _REQUEST_FIELDS:
            issues.extra([*loc, key], value)

    model = obj.get("model")
    if "model" not in obj:
        issues.missing([*loc, "model"])
    elif not isinstance(model, str):
        issues.add([*loc, "model"], "Input should be a valid string", "string_type", model)
    else:
        draft.model = model

    if "state" not in obj:
        issues.missing([*loc, "state"])
    elif not isinstance(obj["state"], str | dict | list):
        issues.add(
            [*loc, "state"],
            "Input should be a string, an object or an array",
            "json_type",
            obj["state"],
        )
    else:
        draft.state = obj["state"]

    if "questions" not in obj:
        issues.missing([*loc, "questions"])
    else:
        draft.questions = _check_questions(obj["questions"], [*loc, "questions"], issues)

    if "config" in obj:
        config = obj["config"]
        if not isinstance(config, dict):
            issues.add([*loc, "config"], "Input should be a valid dictionary", "dict_type", config)
        else:
            draft.config = config
    else:
        draft.config = {}
    draft.ok = len(issues) == before
    return draft


def _check_questions(value: Json, loc: Loc, issues: _Issues) -> dict[str, Question]:
    if not isinstance(value, dict):
        issues.add(loc, "Input should be a valid dictionary", "dict_type", value)
        return {}
    if not value:
        issues.add(
            loc,
            "Dictionary should have at least 1 item after validation, not 0",
            "too_short",
            value,
        )
        return {}
    if len(value) > MAX_QUESTIONS:
        issues.add(
            loc,
            f"Dictionary should have at most {MAX_QUESTIONS} items after validation, "
            f"not {len(value)}",
            "too_long",
            None,
        )
        return {}
    questions: dict[str, Question] = {}
    for name, question in value.items():
        if not name or len(name) > MAX_QUESTION_NAME_CHARS:
            issues.add(
                [*loc, name, "[key]"],
                f"String should have 1 to {MAX_QUESTION_NAME_CHARS} characters",
                "string_too_long" if name else "string_too_short",
                name,
            )
            continue
        checked = _check_question(question, [*loc, name], issues)
        if checked is not None:
            questions[name] = checked
    return questions


def _check_question(value: Json, loc: Loc, issues: _Issues) -> Question | None:
    if not isinstance(value, dict):
        issues.add(
            loc,
            "Input should be a valid dictionary or object to extract fields from",
            "model_attributes_type",
            value,
        )
        return None
    tag = value.get("type")
    if "type" not in value:
        issues.add(
            loc, "Unable to extract tag using discriminator 'type'", "union_tag_not_found", value
        )
        return None
    if tag == "box":
        issues.add(
            [*loc, "type"],
            "Value error, box questions are not supported by these models; "
            "use choice, score or noul",
            "value_error",
            tag,
        )
        return None
    if not isinstance(tag, str) or tag not in _QUESTION_FIELDS:
        issues.add(
            loc,
            f"Input tag {tag!r} found using 'type' does not match any of the expected tags: "
            f"{_TAGS}",
            "union_tag_invalid",
            value,
        )
        return None
    here = [*loc, tag]
    before = len(issues)
    for key, field in value.items():
        if key not in _QUESTION_FIELDS[tag]:
            issues.extra([*here, key], field)
    instructions = value.get("instructions")
    _check_text(instructions, [*here, "instructions"], issues, allow_null=True)
    criteria = value.get("criteria")
    if tag == "choice":
        _check_choice_criteria(value, [*here, "criteria"], issues)
    elif tag == "score":
        _check_score_criteria(value, [*here, "criteria"], issues)
    elif criteria is not None:
        _check_noul_criteria(criteria, [*here, "criteria"], issues)
    if len(issues) != before:
        return None
    if tag == "choice":
        return ChoiceQuestion(criteria=criteria, instructions=instructions)
    if tag == "score":
        return ScoreQuestion(criteria=criteria, instructions=instructions)
    return NoulQuestion(instructions=instructions, criteria=criteria)


def question_issues(value: Json) -> tuple[Question | None, list[ValidationIssue]]:
    """One question checked as a request's are (label files, `decidealot.validation.labels`);
    `loc` starts at the question's type."""
    issues = _Issues()
    return _check_question(value, [], issues), list(issues)


def _check_text(value: Json, loc: Loc, issues: _Issues, *, allow_null: bool) -> None:
    """Instructions and criterion values: TypeSafe's `string | object | array` (| null)."""
    if isinstance(value, str | dict | list) or (value is None and allow_null):
        return
    what = (
        "a string, an object, an array or null" if allow_null else "a string, an object or an array"
    )
    issues.add(loc, f"Input should be {what}", "json_type", value)


def _check_choice_criteria(question: dict[str, Json], loc: Loc, issues: _Issues) -> None:
    if "criteria" not in question:
        issues.missing(loc)
        return
    criteria = question["criteria"]
    if not isinstance(criteria, dict):
        issues.add(loc, "Input should be a valid dictionary", "dict_type", criteria)
        return
    if not 1 <= len(criteria) <= MAX_CHOICE_OPTIONS:
        issues.add(
            loc,
            f"A choice needs 1 to {MAX_CHOICE_OPTIONS} named options, not {len(criteria)}",
            "too_short" if not criteria else "too_long",
            None if criteria else criteria,
        )
        return
    for label, description in criteria.items():
        if not label or len(label) > MAX_LABEL_CHARS:
            issues.add(
                [*loc, label, "[key]"],
                f"String should have 1 to {MAX_LABEL_CHARS} characters",
                "string_too_long" if label else "string_too_short",
                label,
            )
        _check_text(description, [*loc, label], issues, allow_null=True)


def _check_score_criteria(question: dict[str, Json], loc: Loc, issues: _Issues) -> None:
    if "criteria" not in question:
        issues.missing(loc)
        return
    levels = question["criteria"]
    if not isinstance(levels, list):
        issues.add(loc, "Input should be a valid list", "list_type", levels)
        return
    if not MIN_SCORE_LEVELS <= len(levels) <= MAX_SCORE_LEVELS:
        issues.add(
            loc,
            f"A score needs {MIN_SCORE_LEVELS} to {MAX_SCORE_LEVELS} ordered levels, "
            f"not {len(levels)}",
            "too_short" if len(levels) < MIN_SCORE_LEVELS else "too_long",
            levels if len(levels) < MIN_SCORE_LEVELS else None,
        )
        return
    for position, level in enumerate(levels):
        _check_text(level, [*loc, position], issues, allow_null=False)


def _check_noul_criteria(criteria: Json, loc: Loc, issues: _Issues) -> None:
    if not isinstance(criteria, dict):
        issues.add(loc, "Input should be a valid dictionary or null", "dict_type", criteria)
        return
    for key, description in criteria.items():
        if key not in ("true", "false"):
            issues.extra([*loc, key], description)
        else:
            _check_text(description, [*loc, key], issues, allow_null=True)


def _finish(draft: _Draft, routes: dict[str, Route | None], issues: _Issues) -> Routed | None:
    """Check the model name and its config schema; build the request if all of it is valid."""
    if draft.model is None:
        return None
    route = routes.get(draft.model)
    if route is _UNCHECKED:
        return None
    if route is None:
        issues.add(
            [*draft.loc, "model"],
            f"Value error, unknown model {draft.model!r}; use a name returned by GET /v1/models",
            "value_error",
            draft.model,
        )
        return None
    config = draft.config if isinstance(draft.config, dict) else None
    config_ok = config is not None and _check_config(config, route, [*draft.loc, "config"], issues)
    if not (draft.ok and config_ok) or config is None:
        return None
    request = SystemOneRequest(
        model=draft.model, state=draft.state, questions=draft.questions, config=config
    )
    return Routed(request, route)


def _check_config(config: dict[str, Json], route: Route, loc: Loc, issues: _Issues) -> bool:
    """CLM selectors take `{"temperature": t}` (0 < t <= 100); every other selector only `{}`."""
    before = len(issues)
    for key, value in config.items():
        if key != "temperature" or not route.accepts_temperature:
            issues.extra([*loc, key], value)
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            issues.add([*loc, key], "Input should be a valid number", "float_type", value)
        elif not math.isfinite(value):
            issues.add([*loc, key], "Input should be a finite number", "finite_number", None)
        elif value <= 0:
            issues.add([*loc, key], "Input should be greater than 0", "greater_than", value)
        elif value > MAX_TEMPERATURE:
            issues.add(
                [*loc, key],
                f"Input should be less than or equal to {MAX_TEMPERATURE:g}",
                "less_than_equal",
                value,
            )
    return len(issues) == before
