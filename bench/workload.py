"""The decision workload both model benchmarks send: three questions over support tickets."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

QUESTIONS = {
    "category": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "Payments, refunds, invoices and duplicate charges.",
            "technical": "Software failures, errors and outages.",
            "sales": "New purchases, upgrades and quotes.",
            "other": None,
        },
    },
    "priority": {
        "type": "score",
        "instructions": "How urgent is this ticket?",
        "criteria": [
            "Routine, answer in the normal queue.",
            "Important, answer soon.",
            "Urgent, interrupt the on-call queue.",
        ],
    },
    "refund": {"type": "noul", "instructions": "The customer asks for a refund."},
}

SENTENCES = [
    "The customer says the invoice was charged twice this month.",
    "They ask whether the duplicate payment can be refunded to the original card.",
    "The dashboard shows an error after the latest update and reports fail to load.",
    "A manager wants a quote for upgrading forty seats to the enterprise plan.",
    "The order arrived late and one of the items was damaged in transit.",
    "Support already restarted the service but the outage continues for some users.",
    "The account owner changed and billing emails go to the wrong address.",
    "They mention a deadline on Friday and sound frustrated with the delay.",
    "Logs show timeouts from the payment gateway during checkout.",
    "The customer would like to cancel the subscription unless the issue is fixed.",
]


def sized_states(
    tokenizer_file: Path, count: int, heading: Callable[[int], str], seed: int = 7
) -> list[str]:
    """`count` ticket texts, the i-th `heading(i)` followed by sentences up to a random 100-300
    tokens under `tokenizer_file` (a tokenizers JSON file), heading included."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    rng = random.Random(seed)
    states: list[str] = []
    for i in range(count):
        target = rng.randint(100, 300)
        text = heading(i)
        while True:
            longer = text + " " + rng.choice(SENTENCES)
            if len(tokenizer.encode(longer, add_special_tokens=False).ids) > target:
                break
            text = longer
        states.append(text)
    return states
