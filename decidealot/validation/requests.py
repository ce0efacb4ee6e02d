"""The System One request rules: decoded JSON -> validated requests, each with the route its
model resolved to (nothing resolves a name twice), or every issue of the body at once, in
TypeSafe's (FastAPI/pydantic) 422 shape: the question type in `loc` as pydantic reports a
discriminated union (`["body", "questions", "urgency", "score", "criteria"]`). The bounds
beyond TypeSafe's schema are docs/api.md's table.

Why not pydantic, which is installed and whose messages these are: it reports a model's unknown
fields after its fields, not in the body's order; its `missing` issue echoes the parent object
(the state with it), and its `too_long` the whole list; and the contract's own rules (a score's
level count, `json_type`, refused assets and box questions) would each need a custom error.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

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
_QUESTION_FIELDS = frozenset({"type", "instructions", "criteria"})
_QUESTIONS = {"choice": ChoiceQuestion, "score": ScoreQuestion, "noul": NoulQuestion}
_UNCHECKED: Any = object()  # a route not looked up (hosted catalog down, body invalid anyway)


class _Issues(list[ValidationIssue]):
    def add(self, loc: Loc, msg: str, type_: str, input_: Json = None) -> None:
        self.append(ValidationIssue(list(loc), msg, type_, input_))

    def missing(self, loc: Loc) -> None:
        """`input` is `{}`, as in TypeSafe's example: the parent may hold state contents."""
        self.add(loc, "Field required", "missing", {})

    def extra(self, loc: Loc, value: Json) -> None:
        self.add(loc, "Extra inputs are not permitted", "extra_forbidden", value)

    def count(self, loc: Loc, kind: str, value: list[Json] | dict[str, Json], most: int) -> None:
        """pydantic's issue for a `kind` (List, Dictionary) that is empty or over `most` items."""
        if value:
            what = f"at most {most} items after validation, not {len(value)}"
            self.add(loc, f"{kind} should have {what}", "too_long")
        else:
            msg = f"{kind} should have at least 1 item after validation, not 0"
            self.add(loc, msg, "too_short", value)

    def needs(
        self, loc: Loc, what: str, value: list[Json] | dict[str, Json], low: int, high: int
    ) -> bool:
        """A choice's options or a score's levels: `low` to `high` of them (`what` names them)."""
        if low <= len(value) <= high:
            return True
        short = len(value) < low
        msg = f"A {what.format(low, high)}, not {len(value)}"
        self.add(loc, msg, "too_short" if short else "too_long", value if short else None)
        return False


class _Draft(NamedTuple):
    """A request's structural check (`ok`: it found nothing); its model's route is checked after."""

    loc: Loc
    ok: bool
    model: str | None
    fields: dict[str, Json]  # `state`, `questions` (checked) and `config` of the request


@tracing.traced("validation")
async def validate_request(obj: Json, catalog: Catalog) -> Routed:
    """One `POST /v1/systemone` body (decoded JSON) -> validated request, or RequestInvalid."""
    return (await _routed(catalog, [(obj, ["body"])], _Issues()))[0]


@tracing.traced("validation")
async def validate_batch(obj: Json, catalog: Catalog, max_requests: int = 0) -> list[Routed]:
    """A `POST /v1/systemone/batch` body; every item (config included) is checked first."""
    issues = _Issues()
    if not isinstance(obj, dict):
        issues.add(["body"], "Input should be a valid dictionary", "dict_type")
        raise RequestInvalid(issues)
    for key in obj:
        if key != "requests":
            issues.extra(["body", key], obj[key])
    loc: Loc = ["body", "requests"]
    items = obj.get("requests")
    if "requests" not in obj:
        issues.missing(loc)
    elif not isinstance(items, list):
        issues.add(loc, "Input should be a valid list", "list_type", items)
    elif not items or 0 < max_requests < len(items):
        issues.count(loc, "List", items, max_requests)
    else:
        return await _routed(catalog, [(item, [*loc, i]) for i, item in enumerate(items)], issues)
    raise RequestInvalid(issues)


async def _routed(catalog: Catalog, items: list[tuple[Json, Loc]], issues: _Issues) -> list[Routed]:
    """Each item checked and routed; RequestInvalid with `issues` and each item's, in order."""
    drafts = []
    for obj, loc in items:
        own = _Issues()
        drafts.append((_check_request(obj, loc, own), own))
    names = {draft.model for draft, _ in drafts if draft.model is not None}
    routes = await _resolve(catalog, names, bool(issues) or any(own for _, own in drafts))
    requests = []
    for draft, own in drafts:
        requests.append(_finish(draft, routes, own))
        issues.extend(own)
    if issues:  # a request is None only where it has issues
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


def _check_request(obj: Json, loc: Loc, issues: _Issues) -> _Draft:
    if not isinstance(obj, dict):
        issues.add(loc, "Input should be a valid dictionary or object", "dict_type")
        return _Draft(loc, False, None, {})
    before = len(issues)
    for key, value in obj.items():
        if key == "assets":
            msg = "Value error, image assets are not supported by these models"
            issues.add([*loc, key], msg, "value_error")
        elif key not in _REQUEST_FIELDS:
            issues.extra([*loc, key], value)
    model = obj.get("model")
    if "model" not in obj:
        issues.missing([*loc, "model"])
    elif not isinstance(model, str):
        issues.add([*loc, "model"], "Input should be a valid string", "string_type", model)
        model = None
    if "state" not in obj:
        issues.missing([*loc, "state"])
    else:
        _check_text(obj["state"], [*loc, "state"], issues, allow_null=False)
    questions: dict[str, Question] = {}
    if "questions" not in obj:
        issues.missing([*loc, "questions"])
    else:
        questions = _check_questions(obj["questions"], [*loc, "questions"], issues)
    config = obj.get("config", {})
    if not isinstance(config, dict):
        issues.add([*loc, "config"], "Input should be a valid dictionary", "dict_type", config)
    fields = {"state": obj.get("state"), "questions": questions, "config": config}
    return _Draft(loc, len(issues) == before, model, fields)


def _check_questions(value: Json, loc: Loc, issues: _Issues) -> dict[str, Question]:
    if not isinstance(value, dict):
        issues.add(loc, "Input should be a valid dictionary", "dict_type", value)
        return {}
    if not value or len(value) > MAX_QUESTIONS:
        issues.count(loc, "Dictionary", value, MAX_QUESTIONS)
        return {}
    questions: dict[str, Question] = {}
    for name, question in value.items():
        if _check_key(name, loc, MAX_QUESTION_NAME_CHARS, issues):
            checked = _check_question(question, [*loc, name], issues)
            if checked is not None:
                questions[name] = checked
    return questions


def _check_question(value: Json, loc: Loc, issues: _Issues) -> Question | None:
    if not isinstance(value, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        issues.add(loc, msg, "model_attributes_type", value)
        return None
    if "type" not in value:
        msg = "Unable to extract tag using discriminator 'type'"
        issues.add(loc, msg, "union_tag_not_found", value)
        return None
    tag = value["type"]
    if tag == "box":
        msg = "box questions are not supported by these models; use choice, score or noul"
        issues.add([*loc, "type"], f"Value error, {msg}", "value_error", tag)
        return None
    if not isinstance(tag, str) or tag not in _QUESTIONS:
        expected = "'choice', 'score', 'noul'"
        msg = f"Input tag {tag!r} found using 'type' does not match any of the expected tags: "
        issues.add(loc, msg + expected, "union_tag_invalid", value)
        return None
    here = [*loc, tag]
    before = len(issues)
    for key, field in value.items():
        if key not in _QUESTION_FIELDS:
            issues.extra([*here, key], field)
    instructions = value.get("instructions")
    _check_text(instructions, [*here, "instructions"], issues, allow_null=True)
    criteria = value.get("criteria")
    if tag != "noul" and "criteria" not in value:
        issues.missing([*here, "criteria"])
    elif tag != "noul" or criteria is not None:  # a noul's are optional
        _check_criteria(tag, criteria, [*here, "criteria"], issues)
    if len(issues) != before:
        return None
    return _QUESTIONS[tag](criteria=criteria, instructions=instructions)


def question_issues(value: Json) -> tuple[Question | None, list[ValidationIssue]]:
    """One question checked as a request's are (for label files); `loc` starts at its type."""
    issues = _Issues()
    return _check_question(value, [], issues), list(issues)


def _check_key(key: str, loc: Loc, most: int, issues: _Issues) -> bool:
    """A question name or a choice label (a key of the object at `loc`): 1 to `most` characters."""
    if key and len(key) <= most:
        return True
    kind = "string_too_long" if key else "string_too_short"
    issues.add([*loc, key, "[key]"], f"String should have 1 to {most} characters", kind, key)
    return False


def _check_text(value: Json, loc: Loc, issues: _Issues, *, allow_null: bool) -> None:
    """State, instructions and criterion values: TypeSafe's `string | object | array` (| null)."""
    if not (isinstance(value, str | dict | list) or (value is None and allow_null)):
        what = "an object, an array or null" if allow_null else "an object or an array"
        issues.add(loc, f"Input should be a string, {what}", "json_type", value)


def _check_criteria(tag: str, criteria: Json, loc: Loc, issues: _Issues) -> None:
    """A choice's named options, a score's ordered levels, or a noul's `true` and `false`."""
    if tag == "score":
        if not isinstance(criteria, list):
            issues.add(loc, "Input should be a valid list", "list_type", criteria)
        elif issues.needs(
            loc, "score needs {} to {} ordered levels", criteria, MIN_SCORE_LEVELS, MAX_SCORE_LEVELS
        ):
            for position, level in enumerate(criteria):
                _check_text(level, [*loc, position], issues, allow_null=False)
    elif not isinstance(criteria, dict):
        what = "dictionary or null" if tag == "noul" else "dictionary"
        issues.add(loc, f"Input should be a valid {what}", "dict_type", criteria)
    elif tag == "noul":
        for key, description in criteria.items():
            if key in ("true", "false"):
                _check_text(description, [*loc, key], issues, allow_null=True)
            else:
                issues.extra([*loc, key], description)
    elif issues.needs(loc, "choice needs {} to {} named options", criteria, 1, MAX_CHOICE_OPTIONS):
        for label, description in criteria.items():
            _check_key(label, loc, MAX_LABEL_CHARS, issues)
            _check_text(description, [*loc, label], issues, allow_null=True)


def unknown_model(loc: Loc, model: str) -> ValidationIssue:
    """A name the catalog does not accept (the OpenAPI document's example too)."""
    msg = f"Value error, unknown model {model!r}; use a name returned by GET /v1/models"
    return ValidationIssue([*loc, "model"], msg, "value_error", model)


def _finish(draft: _Draft, routes: dict[str, Route | None], issues: _Issues) -> Routed | None:
    if draft.model is None:
        return None
    route = routes.get(draft.model)
    if route is _UNCHECKED:
        return None
    if route is None:
        issues.append(unknown_model(draft.loc, draft.model))
        return None
    config = draft.fields["config"]
    if not isinstance(config, dict):
        return None
    if not _check_config(config, route, [*draft.loc, "config"], issues) or not draft.ok:
        return None
    return Routed(SystemOneRequest(model=draft.model, **draft.fields), route)


def _check_config(config: dict[str, Json], route: Route, loc: Loc, issues: _Issues) -> bool:
    """CLM selectors take `{"temperature": t}` (0 < t <= 100); every other selector only `{}`."""
    before = len(issues)
    for key, value in config.items():
        here = [*loc, key]
        if key != "temperature" or not route.accepts_temperature:
            issues.extra(here, value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            issues.add(here, "Input should be a valid number", "float_type", value)
        elif not math.isfinite(value):
            issues.add(here, "Input should be a finite number", "finite_number")
        elif value <= 0:
            issues.add(here, "Input should be greater than 0", "greater_than", value)
        elif value > MAX_TEMPERATURE:
            msg = f"Input should be less than or equal to {MAX_TEMPERATURE:g}"
            issues.add(here, msg, "less_than_equal", value)
    return len(issues) == before
