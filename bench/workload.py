"""The decision workload both model benchmarks send: three questions over support tickets."""

from __future__ import annotations

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
