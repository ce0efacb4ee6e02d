"""Head-of-line blocking: small requests next to one client sending large ones, side by side.

Decidealot and upstream `laya-serve` run at once on the same random english checkpoint, each
computing one forward pass at a time on one torch thread (`DECIDEALOT_WORKER_PASSES=1`, as
laya-serve's single inference thread), and take turns under the same load:

- *alone*: 16 closed-loop clients of small requests (the three-question workload of
  bench/workload.py);
- *with large*: the same 16 clients plus one client that sends large requests back to back
  (`--large-questions` choice questions of four options over one state).

The table gives the small requests' p50 and p99 latency in both cases, how much the large
client slows them (p99 with / p99 alone), and how many large requests each server finished.
Decidealot cuts every job into passes and lets the job of the fewest turns go first,
so a small request waits about one pass; a server that runs each request whole makes small
requests wait behind whole large ones.

    .venv/bin/python bench/headofline.py            # tiny checkpoint, 20 s per run
    .venv/bin/python bench/headofline.py --size base --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.laya import DECIDEALOT, UPSTREAM, Bodies, build_checkpoints, make_states, servers
from bench.loadgen import LoadResult, drive_raw
from bench.workload import QUESTIONS

SMALL_CLIENTS = 16
_JSON = {"content-type": "application/json"}


def large_body(index: int, model: str, questions: int, state: str) -> bytes:
    criteria = QUESTIONS["category"]["criteria"]
    body = {
        "model": model,
        "state": f"Batch review {index}: {state}",
        "questions": {
            f"case_{n}": {
                "type": "choice",
                "instructions": f"Case {n}: which team should handle it?",
                "criteria": criteria,
            }
            for n in range(questions)
        },
    }
    return json.dumps(body).encode()


def large_client(
    url: str, bodies: Callable[[int], bytes], stop: threading.Event, done: list[float]
) -> None:
    """Sends large requests one after another until `stop`; records each one's seconds."""
    with httpx.Client(timeout=900.0) as client:
        index = 0
        while not stop.is_set():
            started = time.perf_counter()
            response = client.post(url, content=bodies(index), headers=_JSON)
            response.raise_for_status()
            done.append(time.perf_counter() - started)
            index += 1


def run_point(
    name: str, url: str, model: str, bodies: Bodies, seconds: float, large: int, state: str
) -> tuple[LoadResult, list[float]]:
    """Small-request load for `seconds`, with one large client beside it when `large`."""
    stop = threading.Event()
    done: list[float] = []
    thread = None
    if large:
        thread = threading.Thread(
            target=large_client,
            args=(url, lambda i: large_body(i, model, large, state), stop, done),
            daemon=True,
        )
        thread.start()
        time.sleep(1.0)  # the first large request is in its passes
    result = drive_raw(
        name, url, bodies.next_run(model), clients=SMALL_CLIENTS, seconds=seconds, warmup=0
    )
    stop.set()
    if thread is not None:
        thread.join()
    return result, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--large-questions", type=int, default=64)  # laya-serve takes <= 64
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".bench-out/checkpoints"))
    args = parser.parse_args()

    folder = build_checkpoints(args.cache, args.size)
    states = make_states(folder / "english", 64)
    bodies = Bodies(states)
    logs = Path(tempfile.mkdtemp(prefix="headofline-"))
    env = {"DECIDEALOT_WORKER_PASSES": "1", "DECIDEALOT_MAX_PENDING_REQUESTS": "0"}
    results: dict[tuple[str, bool], list[LoadResult]] = {}
    finished: dict[str, list[float]] = {}
    with servers(folder, 1, args.device, logs, env) as urls:
        for url, model, _ in urls.values():  # load the model, check it answers
            httpx.post(url, content=bodies.body(0, model), timeout=900.0).raise_for_status()
            httpx.post(
                url, content=large_body(0, model, args.large_questions, states[0]), timeout=900.0
            ).raise_for_status()
        turn = 0
        for _ in range(args.rounds):
            for with_large in (False, True):
                order = [DECIDEALOT, UPSTREAM] if turn % 2 == 0 else [UPSTREAM, DECIDEALOT]
                turn += 1
                for name in order:
                    url, model, _ = urls[name]
                    large = args.large_questions if with_large else 0
                    result, done = run_point(
                        name, url, model, bodies, args.seconds, large, states[1]
                    )
                    results.setdefault((name, with_large), []).append(result)
                    if with_large:
                        finished.setdefault(name, []).extend(done)
                    print(
                        f"  {name:>10} {'with large' if with_large else 'alone':>10}: "
                        f"{result.rps:7.2f} small/s  p50 {result.p50_ms:8.1f} ms  "
                        f"p99 {result.p99_ms:8.1f} ms  large done {len(done)} "
                        f"({result.errors} errors)",
                        file=sys.stderr,
                    )
    print(report(results, finished, args))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def report(
    results: dict[tuple[str, bool], list[LoadResult]],
    finished: dict[str, list[float]],
    args: argparse.Namespace,
) -> str:
    lines = [
        f"Checkpoint `{args.size}`, {SMALL_CLIENTS} small-request clients, one large client of "
        f"{args.large_questions} questions, {args.seconds:g} s x {args.rounds} rounds, one pass "
        f"at a time on one torch thread each; CPU: {_cpu_model()}.",
        "",
        "| server | small p50 ms alone | small p99 ms alone | small p50 ms with large | "
        "small p99 ms with large | p99 slowdown | small req/s with large | large done | "
        "large s each (median) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in (DECIDEALOT, UPSTREAM):
        alone = results[(name, False)]
        mixed = results[(name, True)]
        p50a, p99a = _median([r.p50_ms for r in alone]), _median([r.p99_ms for r in alone])
        p50m, p99m = _median([r.p50_ms for r in mixed]), _median([r.p99_ms for r in mixed])
        rps = sum(r.requests for r in mixed) / sum(r.seconds for r in mixed)
        done = finished.get(name, [])
        lines.append(
            f"| {name} | {p50a:.0f} | {p99a:.0f} | {p50m:.0f} | {p99m:.0f} | "
            f"{p99m / p99a:.1f}x | {rps:.1f} | {len(done)} | {_median(done):.1f} |"
        )
    return "\n".join(lines)


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    return "unknown"


if __name__ == "__main__":
    main()
