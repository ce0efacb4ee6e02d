"""What Laya's text detection costs on the event loop, against a hop to a thread: the figures
behind `providers/laya/gateway/router.py`'s `INLINE_DETECTION_COST`.

    OMP_NUM_THREADS=1 .venv/bin/python bench/routing.py

For states of about 500 to 4000 characters (one English, accented English, German and Japanese
line repeated, as one string, as an array of lines and as an object of fields) it prints the
best of 15 detections (`router.detect_checkpoint`, the state's leaves already walked), per state
and per character, then the median and best of 200 `asyncio.to_thread` round trips of a no-op,
and the interpreter's switch interval (a thread holds the GIL that long before the loop gets it
back).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable

from decidealot.providers.laya.gateway import lang
from decidealot.providers.laya.gateway.router import detect_checkpoint

LINES = {
    "en": "The customer says the invoice was charged twice and wants a refund today.",
    "en-accent": "The café customer José says the invoice was charged twice, wants a refund.",
    "de": "Mein Konto wurde zweimal belastet, bitte helfen Sie mir mit der Rückerstattung.",
    "ja": "注文が届きません。返金をお願いします。請求が二重になっています。",
}


def best(run: Callable[[], object], times: int = 15) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        run()
        spent.append(time.perf_counter() - started)
    return min(spent)


async def hops(times: int = 200) -> list[float]:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        await asyncio.to_thread(int)
        spent.append(time.perf_counter() - started)
    return spent


def main() -> None:
    print("| text | shape | characters | detection ms | us per character |")
    print("|---|---|---:|---:|---:|")
    for chars in (500, 1000, 2000, 4000):
        for kind, line in LINES.items():
            copies = max(1, chars // (len(line) + 1))
            shapes = {
                "string": "\n".join([line] * copies),
                "array": {"m": [line] * copies},
                "fields": {f"f{i}": line for i in range(copies)},
            }
            for shape, state in shapes.items():
                leaves = lang.text_leaves(state) or []
                size = sum(map(len, leaves))
                seconds = best(lambda state=state, leaves=leaves: detect_checkpoint(state, leaves))
                print(
                    f"| {kind} | {shape} | {size} | {seconds * 1e3:.2f} | "
                    f"{seconds / size * 1e6:.2f} |"
                )
    spent = asyncio.run(hops())
    print(
        f"\nto_thread round trip: median {statistics.median(spent) * 1e6:.0f} us, "
        f"best {min(spent) * 1e6:.0f} us; switch interval {sys.getswitchinterval() * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
