"""Questions several tests ask: one of each kind about a support ticket."""

from __future__ import annotations

from typing import Any

TICKET_QUESTIONS: dict[str, dict[str, Any]] = {
    "queue": {
        "type": "choice",
        "instructions": "Route the ticket.",
        "criteria": {"billing": "A payment or refund", "shipping": None, "audit": "An audit"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["routine", "important", "urgent"],
    },
    "review": {"type": "noul", "instructions": "Is human review needed?"},
}
"""A choice of three options (one without a description), a score of three levels, a noul."""
