"""Label files for `decidealot calibrate` tests: seeded rows of every question type, in von-sdk's
format (and its choice shorthand), with golds drawn so a random model is wrong often."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = (
    "refund", "payment", "invoice", "customer", "account", "order", "shipped", "late",
    "protected", "record", "delete", "review", "urgent", "routine", "billing", "technical",
)  # fmt: skip


def _sentence(rng: random.Random, low: int = 3, high: int = 9) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def label_rows(seed: int, count: int, *, types: tuple[str, ...] = ("choice", "score", "noul"),
               shorthand: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """`count` rows; every fifth choice in the shorthand form when `shorthand`."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(count):
        kind = types[i % len(types)]
        state = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
        instructions = _sentence(rng)
        if kind == "choice":
            labels = rng.sample(WORDS, rng.choice([2, 3, 4]))
            criteria = {label: _sentence(rng, 2, 5) for label in labels}
            gold = rng.choice(labels)
            if shorthand and i % 5 == 0:
                rows.append({"state": state, "instructions": instructions, "choices": labels,
                             "gold": gold})  # fmt: skip
                continue
            question = {"type": "choice", "instructions": instructions, "criteria": criteria}
        elif kind == "score":
            levels = [_sentence(rng, 1, 3) for _ in range(rng.choice([3, 4, 5]))]
            question = {"type": "score", "instructions": instructions, "criteria": levels}
            gold = rng.randrange(len(levels))
        else:
            question = {"type": "noul", "instructions": instructions}
            if rng.random() < 0.5:
                question["criteria"] = {"true": _sentence(rng, 2, 4), "false": _sentence(rng, 2, 4)}
            gold = rng.choice(["yes", "no", True, False])
        rows.append({"state": state, "question": question, "gold": gold})
    return rows


def write_labels(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
