"""Batch items sharing passes: one 32-item batch against 32 single requests, side by side.

One `decidealot serve` on the random english Laya checkpoint answers the same 32 decisions
(the three-question workload of bench/workload.py, each with its own state) three ways, in
turns, several rounds:

- *batch*: one `POST /v1/systemone/batch` of 32 items (items go to the worker in input order
  without waiting for each other, so they share passes);
- *concurrent*: 32 single requests at once, one client each;
- *sequential*: 32 single requests one after another: what a batch cost when its items for
  one provider ran one at a time (before items shared passes).

It reports the wall time of the 32 decisions (median over rounds) and the ratios.

    .venv/bin/python bench/batch.py                 # tiny checkpoint
    .venv/bin/python bench/batch.py --size base
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.laya import build_checkpoints, make_states
from bench.loadgen import free_port, python, server
from bench.workload import QUESTIONS

ITEMS = 32


def item(state: str) -> dict[str, object]:
    return {"model": "laya-english", "state": state, "questions": QUESTIONS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "base"), default="tiny")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".bench-out/checkpoints"))
    args = parser.parse_args()

    folder = build_checkpoints(args.cache, args.size)
    states = make_states(folder / "english", 64)
    port = free_port()
    env = {
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(args.threads),
        "DECIDEALOT_PORT": str(port),
        "DECIDEALOT_DEVICE": args.device,
        "DECIDEALOT_TORCH_THREADS": str(args.threads),
        "DECIDEALOT_VON_ENABLED": "false",
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": str(folder / "english"),
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT": str(folder / "multilingual"),
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT": str(folder / "typed-decisions"),
    }
    logs = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    seconds: dict[str, list[float]] = {"batch": [], "concurrent": [], "sequential": []}
    with (
        server(
            [python(), "-m", "decidealot", "serve"],
            port=port,
            env=env,
            log_path=logs / "decidealot.log",
        ) as base,
        httpx.Client(base_url=base, timeout=900.0) as client,
        ThreadPoolExecutor(ITEMS) as pool,
    ):

        def single(state: str) -> None:
            client.post("/v1/systemone", json=item(state)).raise_for_status()

        def batch(chunk: list[str]) -> None:
            body = {"requests": [item(state) for state in chunk]}
            response = client.post("/v1/systemone/batch", json=body)
            response.raise_for_status()
            assert len(response.json()["results"]) == len(chunk)

        ways = {
            "batch": batch,
            "concurrent": lambda chunk: list(pool.map(single, chunk)),
            "sequential": lambda chunk: [single(state) for state in chunk],
        }
        batch([f"warm-up {s}" for s in states[:ITEMS]])
        for turn in range(args.rounds):
            names = list(ways) if turn % 2 == 0 else list(reversed(ways))
            for name in names:
                chunk = [f"Round {turn} {name}: {s}" for s in states[:ITEMS]]
                started = time.perf_counter()
                ways[name](chunk)
                seconds[name].append(time.perf_counter() - started)
                print(f"  round {turn} {name:>10}: {seconds[name][-1]:.2f} s", file=sys.stderr)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        f"{ITEMS} decisions on the `{args.size}` checkpoint, {args.threads} torch thread(s) per "
        f"pass, median of {args.rounds} rounds:\n"
    )
    print("| way | seconds for 32 | decisions/s | batch speed-up over it |")
    print("|---|---:|---:|---:|")
    for name, value in median.items():
        print(f"| {name} | {value:.2f} | {ITEMS / value:.1f} | {value / median['batch']:.2f}x |")
    print(json.dumps({"seconds": seconds}), file=sys.stderr)


if __name__ == "__main__":
    main()
