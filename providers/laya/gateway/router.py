"""Which Laya checkpoint answers a request (laya.md §7), decided without loading any model.

The auto selectors follow upstream `laya.Router` with workflow detection on and no caller
language hints: a question-id set equal to a typed-decisions workflow picks typed-decisions;
otherwise built-in detection (`lang`) picks english for English Latin text and
multilingual for anything else, and undecided or letterless text takes upstream's fallback,
multilingual. Pure Python: runs in the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from decidealot.contract import State, SystemOneRequest
from decidealot.providers.laya.gateway.lang import analyse

FALLBACK = "multilingual"
AUTO_SELECTORS = ("laya", "laya-auto", "laya-latest")
DIRECT_SELECTORS = {
    "laya-english": "english",
    "laya-multilingual": "multilingual",
    "laya-typed-decisions": "typed-decisions",
}

TYPED_DECISION_WORKFLOWS = {
    "agent_trace_observability": frozenset(
        {"action", "needs_review", "outcome", "risk", "urgency"}
    ),
    "customer_service": frozenset({"action", "category", "churn_risk", "needs_human", "urgency"}),
    "invoice_processing": frozenset(
        {"discrepancy_severity", "disposition", "duplicate", "matches_order", "urgency"}
    ),
    "security_incidents": frozenset(
        {"credential_compromise", "disposition", "severity", "true_positive", "urgency"}
    ),
}


def workflow_of(question_names: Iterable[str]) -> str | None:
    """The typed-decisions workflow whose exact question-id set this is, else None."""
    names = set(question_names)
    return next((wf for wf, ids in TYPED_DECISION_WORKFLOWS.items() if names == ids), None)


def detect_checkpoint(state: State) -> str:
    """`english` or `multilingual` by script and language, as upstream's built-in detection."""
    detection = analyse(state)
    if detection["script"] == "unknown":
        return FALLBACK
    if detection["script"] != "latin" or not detection["is_english"]:
        return "multilingual"
    if detection["language_undecided"]:
        return FALLBACK
    return "english"


def route(selector: str, state: State, question_names: Iterable[str]) -> str:
    """The checkpoint key (`english`, `multilingual`, `typed-decisions`) for one request."""
    direct = DIRECT_SELECTORS.get(selector)
    if direct is not None:
        return direct
    if selector not in AUTO_SELECTORS:
        raise ValueError(f"{selector!r} is not a Laya selector")
    if workflow_of(question_names) is not None:
        return "typed-decisions"
    return detect_checkpoint(state)


async def checkpoint_for(selector: str, request: SystemOneRequest) -> str:
    """`route` for a request, off the event loop: routing reads every line of every string
    value (as upstream), and a state may be megabytes."""
    return await asyncio.to_thread(route, selector, request.state, request.questions)
