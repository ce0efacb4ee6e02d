"""The OpenAPI document's named examples: the contract's own requests, each beside an answer
whose numbers illustrate the shape only. Swagger UI pre-fills a body with its operation's first
example, so a person's first "Try it out" gets a decision, not a body generated from the schema
(which the validator refuses); an example is listed only while every model it names is enabled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from decidealot.contract import ValidationErrorBody
from decidealot.errors import Unauthorized
from decidealot.validation.requests import unknown_model


@dataclass(frozen=True)
class Example:
    """One named request and the answer the document shows beside it."""

    summary: str
    request: dict[str, Any]
    response: dict[str, Any]

    @property
    def models(self) -> set[str]:
        """The models it names: it is shown only while each of them is accepted."""
        items = self.request.get("requests", [self.request])
        return {item["model"] for item in items}


def _choice(probabilities: dict[str, float]) -> dict[str, Any]:
    """A choice answer: the most probable label, and its probability as the confidence."""
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

DECISIONS = {"choice": CHOICE, "score": SCORE, "noul": NOUL, "clm-temperature": CLM}
"""`POST /v1/systemone`'s examples, the first (pre-filled) one first."""
BATCHES = {"batch": BATCH}
"""`POST /v1/systemone/batch`'s."""

UNLOADED = {
    "status": "unloaded",
    "providers": [{"name": "laya", "wasLoaded": True}, {"name": "von", "wasLoaded": False}],
}
UNAUTHORIZED = {"code": Unauthorized.code, "message": Unauthorized.message, "details": {}}
UNKNOWN_MODEL = msgspec.to_builtins(ValidationErrorBody([unknown_model(["body"], "unknown-model")]))
"""The contract's error bodies, shown beside the answers."""
