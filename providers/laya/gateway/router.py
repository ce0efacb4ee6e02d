"""Which Laya checkpoint answers a request (laya.md §7), decided in the gateway as upstream
`laya.Router` decides with workflow detection on and no language hints (docs/models.md, "Laya").
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from decidealot.contract import State, SystemOneRequest
from decidealot.providers.laya import CHECKPOINTS
from decidealot.providers.laya.gateway import lang

FALLBACK = "multilingual"
AUTO_SELECTORS = ("laya", "laya-auto", "laya-latest")
INLINE_DETECTION_COST = 2000
"""States up to this size (characters of string values, plus one per value) are routed on the
event loop: detection costs at most 2.6 ms there (`bench/routing.py`), under the interpreter's
5 ms switch interval, so a thread would hold the GIL as long, and its round trip alone (40-70
us) costs more than detecting a short state (about 0.2 ms at 500 characters)."""
DIRECT_SELECTORS = {f"laya-{key}": key for key in CHECKPOINTS}

TYPED_DECISION_WORKFLOWS = {
    workflow: frozenset(questions.split())
    for workflow, questions in (
        ("agent_trace_observability", "action needs_review outcome risk urgency"),
        ("customer_service", "action category churn_risk needs_human urgency"),
        ("invoice_processing", "discrepancy_severity disposition duplicate matches_order urgency"),
        ("security_incidents", "credential_compromise disposition severity true_positive urgency"),
    )
}


def workflow_of(question_names: Iterable[str]) -> str | None:
    """The typed-decisions workflow whose exact question-id set this is, else None."""
    names = set(question_names)
    return next((wf for wf, ids in TYPED_DECISION_WORKFLOWS.items() if names == ids), None)


def detect_checkpoint(state: State, leaves: list[str] | None = None) -> str:
    """`english` or `multilingual` by script and language, as upstream's built-in detection."""
    detection = lang.analyse(state, leaves)
    if detection.script == "unknown":
        return FALLBACK
    if detection.script != "latin" or not detection.is_english:
        return "multilingual"
    if detection.language_undecided:
        return FALLBACK
    return "english"


def named_checkpoint(selector: str, question_names: Iterable[str]) -> str | None:
    """The checkpoint a direct selector or a typed-decisions workflow names, else None."""
    direct = DIRECT_SELECTORS.get(selector)
    if direct is not None:
        return direct
    if selector not in AUTO_SELECTORS:
        raise ValueError(f"{selector!r} is not a Laya selector")
    if workflow_of(question_names) is not None:
        return "typed-decisions"
    return None


async def checkpoint_for(selector: str, request: SystemOneRequest) -> str:
    """The checkpoint key for a request, in a thread where detection must walk a state costlier
    than `INLINE_DETECTION_COST` (every line of every string value, as upstream)."""
    named = named_checkpoint(selector, request.questions)
    if named is not None:
        return named
    leaves = lang.text_leaves(request.state, limit=INLINE_DETECTION_COST)
    if leaves is not None:
        return detect_checkpoint(request.state, leaves)
    return await asyncio.to_thread(detect_checkpoint, request.state)
