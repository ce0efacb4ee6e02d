"""Von: Decidealot against upstream `von serve` on the same random checkpoint, side by side.

Both servers run at once on the same checkpoint, with the same torch thread count, and take
turns (the order alternates per point) under closed-loop load at 1, 8 and 32 clients. Every
request is distinct (a numbered state of 100-300 tokens) and asks three questions: a choice
with four options, a score with three levels and a zero-shot noul, so upstream runs four
encoder passes per request (the noul's no-state debias pass included) and Decidealot scores
the same four rows together with whatever else is queued (and reuses the debias row's logits,
which depend on the question only). A decision here
is one request. Upstream runs as the parity tests run it: chains off, raw noul, CPU. Besides
throughput and latency, each point records the servers' CPU time per decision (Decidealot:
gateway and worker), which other load on a shared machine disturbs far less.

Checkpoints are random (providers/von/tiny.py): `tiny` (hidden 32, 3 layers) shows
serving overhead; `small` (hidden 384, 6 layers, ModernBERT's window and layer pattern) makes
the forward pass dominate. `--mode` picks the attention mode: `plain` (joint attention, the
Von 1.1 weights Decidealot ships) or `independent` (the 1.2/1.3 independent-options mask).
On CPU each checkpoint's tables end with the compute bound: the matrix-multiply work of a
decision (counted by torch for both servers) against this core's fp32 matmul rate, which says
how far any server could get ahead of upstream at equal CPU. The last table compares the
engines without HTTP, in this process: upstream's backend `evaluate` against Decidealot's
`VonEngine` one request at a time and in batches of 32. `--device cuda` runs all of it on a GPU.

    .venv/bin/python bench/von.py            # full run (about 6 minutes on 2 cores)
    .venv/bin/python bench/von.py --quick    # under a minute, tiny checkpoint only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compute import bound_table, matmul_ceiling, matmul_gflop
from bench.loadgen import (
    LoadResult,
    drive_raw,
    python,
    server_root,
    side_by_side,
    table,
    tree_cpu_seconds,
    upstream_package,
)
from bench.workload import QUESTIONS, sized_states

DECIDEALOT = "decidealot"
UPSTREAM = "von-serve"
MODEL = "von-1.1"
"""Both servers accept this selector; upstream answers every alias with its one model."""
JSON = {"content-type": "application/json"}


def build_checkpoint(cache: Path, size: str, mode: str) -> Path:
    """The `size` checkpoint in attention `mode`, built once into `cache`."""
    from decidealot.providers.von.tiny import build_von_checkpoint

    folder = cache / f"{size}-{mode}"
    if not (folder / "marker_calibration.json").exists():
        print(f"building the {size} {mode} checkpoint in {folder}", file=sys.stderr)
        build_von_checkpoint(folder, independent_options=mode == "independent", size=size)
    return folder


def make_states(checkpoint: Path, count: int) -> list[str]:
    """`count` distinct states of 100-300 tokens (under this checkpoint's tokenizer)."""
    return sized_states(checkpoint / "tokenizer.json", count, lambda i: f"Ticket {i}:")


class Bodies:
    """Request bodies: the same state sequence for both servers, each run starting elsewhere."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.offset = 0

    def body(self, index: int) -> bytes:
        state = self.states[index % len(self.states)]
        return json.dumps({"model": MODEL, "state": state, "questions": QUESTIONS}).encode()

    def next_run(self) -> Callable[[int], bytes]:
        start = self.offset
        self.offset += 997
        return lambda i: self.body(start + i)


@contextmanager
def servers(
    checkpoint: Path, threads: int, device: str, logs: Path, decidealot_env: dict[str, str]
) -> Iterator[dict[str, tuple[str, int]]]:
    """Both servers, up; yields {name: (decision URL, server pid)}."""

    def von_serve(port: int) -> tuple[list[str], dict[str, str]]:
        command = [str(Path(python()).with_name("von")), "serve", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--device", device, "--no-chains"]
        command += ["--noul-decision", "raw"]
        env = {
            "VON_CHECKPOINT_DIR": str(checkpoint),
            "VON_CHAINS_DIR": "off",
            "VON_DEVICE": device,
            "VON_NOUL_DECISION": "raw",
        }
        return command, env

    ours_env = {
        "DECIDEALOT_PRECISION": "fp32",  # like for like with upstream (bench/bf16.py: auto)
        "DECIDEALOT_LAYA_ENABLED": "false",
        "DECIDEALOT_VON_CHECKPOINT": str(checkpoint),
        "DECIDEALOT_MODEL_DIR": str(logs / "models"),
        **decidealot_env,
    }
    with side_by_side(
        threads=threads,
        device=device,
        logs=logs,
        decidealot_env=ours_env,
        upstream=von_serve,
        upstream_log=f"{UPSTREAM}.log",
    ) as (ours, theirs):
        yield {
            DECIDEALOT: (ours + "/v1/systemone", server_root("decidealot")),
            UPSTREAM: (theirs + "/v1/systemone", server_root("bin/von")),
        }


def _numbers(payload: dict[str, object]) -> dict[str, list[float]]:
    """Each answer's probabilities (noul: P(yes)), whichever server sent it."""
    numbers: dict[str, list[float]] = {}
    for name, answer in payload["answers"].items():  # type: ignore[union-attr]
        if "probabilities" in answer:
            numbers[name] = list(answer["probabilities"].values())
        else:
            numbers[name] = [answer.get("noul_raw", answer["noul"])]
    return numbers


def check_same_answers(urls: dict[str, tuple[str, int]], bodies: Bodies) -> int:
    """Both servers answer a sample request alike (and load the model); returns that request's
    input tokens, which must agree too: the same passes over the same tokens."""
    payloads = {}
    for name, (url, _) in urls.items():
        response = httpx.post(url, content=bodies.body(0), headers=JSON, timeout=900.0)
        response.raise_for_status()
        payloads[name] = response.json()
    ours, theirs = (_numbers(payloads[name]) for name in (DECIDEALOT, UPSTREAM))
    far = [
        name
        for name in ours
        if any(abs(a - b) > 1e-4 for a, b in zip(ours[name], theirs[name], strict=True))
    ]
    tokens = {name: payloads[name]["usage"]["input_tokens"] for name in payloads}
    if far or tokens[DECIDEALOT] != tokens[UPSTREAM]:
        raise SystemExit(f"servers disagree on the same request: {ours} {theirs} {tokens}")
    return int(tokens[DECIDEALOT])


def load_points(
    urls: dict[str, tuple[str, int]],
    bodies: Bodies,
    clients: list[int],
    seconds: float,
    warmup: int,
) -> tuple[list[LoadResult], dict[tuple[str, int], float]]:
    """Each client count against both servers in turn (the order alternates); returns the
    results and each point's server CPU milliseconds per decision."""
    results: list[LoadResult] = []
    cpu_ms: dict[tuple[str, int], float] = {}
    for i, n in enumerate(clients):
        order = [DECIDEALOT, UPSTREAM] if i % 2 == 0 else [UPSTREAM, DECIDEALOT]
        for name in order:
            url, pid = urls[name]
            run_bodies = bodies.next_run()
            drive_raw(name, url, run_bodies, clients=n, seconds=0, warmup=warmup)
            before = tree_cpu_seconds(pid)
            result = drive_raw(name, url, run_bodies, clients=n, seconds=seconds, warmup=0)
            cpu_ms[(name, n)] = 1000 * (tree_cpu_seconds(pid) - before) / max(1, result.requests)
            print(
                f"  {name:>10} {n:>2} clients: {result.rps:7.2f} dec/s  "
                f"p50 {result.p50_ms:8.1f} ms  p99 {result.p99_ms:8.1f} ms  "
                f"cpu {cpu_ms[(name, n)]:7.1f} ms/dec  "
                f"({result.requests} requests, {result.errors} errors)",
                file=sys.stderr,
            )
            results.append(result)
    return results, cpu_ms


def summary(results: list[LoadResult], cpu_ms: dict[tuple[str, int], float]) -> str:
    """Per client count: both servers' decisions per second, latency and CPU per decision,
    and Decidealot's ratios (throughput: ours / theirs; CPU: theirs / ours, > 1 favours ours)."""
    by_key = {(r.name, r.clients): r for r in results}
    lines = [
        f"| clients | {DECIDEALOT} dec/s | {UPSTREAM} dec/s | throughput ratio | "
        "p50 ms (ours / theirs) | p99 ms (ours / theirs) | server CPU ms/dec (ours / theirs) | "
        "CPU efficiency ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r.clients for r in results}):
        ours, theirs = by_key[(DECIDEALOT, n)], by_key[(UPSTREAM, n)]
        ratio = ours.rps / theirs.rps if theirs.rps else float("nan")
        cpu_ours, cpu_theirs = cpu_ms[(DECIDEALOT, n)], cpu_ms[(UPSTREAM, n)]
        lines.append(
            f"| {n} | {ours.rps:.1f} | {theirs.rps:.1f} | **{ratio:.2f}x** | "
            f"{ours.p50_ms:.0f} / {theirs.p50_ms:.0f} | {ours.p99_ms:.0f} / {theirs.p99_ms:.0f} | "
            f"{cpu_ours:.1f} / {cpu_theirs:.1f} | {cpu_theirs / cpu_ours:.2f}x |"
        )
    return "\n".join(lines)


class UpstreamBackend(Protocol):
    """What the bench calls on von-sdk's backend."""

    def evaluate(self, state: str, questions: dict[str, dict[str, object]]) -> object: ...


def upstream_backend(checkpoint: Path, device: str) -> UpstreamBackend:
    """von-sdk's option-marker backend on `checkpoint`, configured as its server runs here."""
    os.environ.update(VON_CHAINS_DIR="off", VON_NOUL_DECISION="raw", HF_HUB_OFFLINE="1")
    backend = upstream_package("von.backends.option_marker_backend")
    return backend.OptionMarkerBackend(checkpoint_dir=str(checkpoint), device=device)


def in_process(
    checkpoint: Path, device: str, threads: int
) -> tuple[UpstreamBackend, Callable[[list[str]], object]]:
    """Upstream's backend and a function answering states with Decidealot's engine as one
    batch, both in this process on `checkpoint`."""
    import msgspec
    import torch

    from decidealot.contract import Question
    from decidealot.jobs import EngineSpec, Job
    from decidealot.providers.engine.planner import run_together
    from decidealot.providers.von.worker.engine import create

    torch.set_num_threads(threads)
    upstream = upstream_backend(checkpoint, device)
    engine = create(
        EngineSpec(
            factory="decidealot.providers.von.worker.engine:create",
            checkpoints={MODEL: str(checkpoint)},
            preload=(MODEL,),
            device=device,
            torch_threads=threads,
        )
    )
    questions = msgspec.convert(QUESTIONS, dict[str, Question])

    def ours(states: list[str]) -> object:
        return run_together(
            engine, [engine.prepare(Job(MODEL, state, questions)) for state in states]
        )

    return upstream, ours


def engine_times(
    checkpoint: Path, bodies: Bodies, threads: int, device: str, requests: int
) -> dict[str, float]:
    """Milliseconds per request without HTTP: upstream's backend, Decidealot's engine alone
    and in batches of 32; the same states, the three taking turns per 32 requests."""
    upstream, ours = in_process(checkpoint, device, threads)
    runs: dict[str, Callable[[list[str]], object]] = {
        "upstream": lambda states: [upstream.evaluate(state, QUESTIONS) for state in states],
        "alone": lambda states: [ours([state]) for state in states],
        "batched": ours,
    }
    spent = dict.fromkeys(runs, 0.0)
    for run in runs.values():  # warm-up
        run(bodies.states[:2])
    for start in range(0, requests, 32):
        states = bodies.states[start : start + 32]
        for name, run in runs.items():
            began = time.perf_counter()
            run(states)
            spent[name] += time.perf_counter() - began
    return {name: seconds * 1000 / requests for name, seconds in spent.items()}


def matmul_flops(checkpoint: Path, bodies: Bodies, threads: int, requests: int) -> dict[str, float]:
    """Matrix-multiply GFLOP per request of upstream's backend and of Decidealot's engine
    (batched, its debias cache warm), on `requests` of the bench's states, on CPU."""
    upstream, ours = in_process(checkpoint, "cpu", threads)
    states = bodies.states[:requests]
    ours(states[:1])  # the debias row cached, as under load
    return {
        UPSTREAM: matmul_gflop(lambda: [upstream.evaluate(s, QUESTIONS) for s in states])
        / len(states),
        DECIDEALOT: matmul_gflop(lambda: ours(states)) / len(states),
    }


def engine_table(rows: dict[str, dict[str, float]]) -> str:
    lines = [
        f"| checkpoint | {UPSTREAM} backend ms/request | Decidealot engine alone | "
        "Decidealot engine, batches of 32 | ratio (upstream / batched) |",
        "|---|---:|---:|---:|---:|",
    ]
    for size, t in rows.items():
        lines.append(
            f"| {size} | {t['upstream']:.1f} | {t['alone']:.1f} | {t['batched']:.1f} | "
            f"**{t['upstream'] / t['batched']:.2f}x** |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short tiny-only run")
    parser.add_argument("--sizes", default=None, help="comma list of tiny,small")
    parser.add_argument("--mode", choices=("plain", "independent"), default="plain")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=None, help="per point, tiny checkpoint")
    parser.add_argument("--small-seconds", type=float, default=20.0, help="per point, small")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both servers")
    parser.add_argument(
        "--device", default="cpu", help="torch device for both servers and engines, e.g. cuda"
    )
    parser.add_argument(
        "--decidealot-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra setting for Decidealot (repeatable), e.g. DECIDEALOT_BATCH_TOKEN_BUDGET=4096",
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-von"))
    args = parser.parse_args()
    sizes = (args.sizes or ("tiny" if args.quick else "tiny,small")).split(",")
    clients = [int(n) for n in args.clients.split(",")]
    tiny_seconds = args.seconds or (5.0 if args.quick else 15.0)
    extra_env = dict(item.split("=", 1) for item in args.decidealot_env)
    args.cache.mkdir(parents=True, exist_ok=True)

    report: list[str] = [
        f"Attention mode: {args.mode}. Device: {args.device}. Torch threads: {args.threads} "
        "for both servers (OMP_NUM_THREADS, and DECIDEALOT_TORCH_THREADS for Decidealot's "
        f"worker); Decidealot settings beyond the defaults: {extra_env or 'none'}. "
        f"{os.cpu_count()} CPUs. Command: `{' '.join(['bench/von.py', *sys.argv[1:]])}`",
    ]
    engines: dict[str, dict[str, float]] = {}
    for size in sizes:
        checkpoint = build_checkpoint(args.cache, size, args.mode)
        bodies = Bodies(make_states(checkpoint, 512))
        seconds = tiny_seconds if size == "tiny" else args.small_seconds
        warmup = 3 if size == "tiny" else 1
        print(f"{size} ({args.mode}): {seconds:g} s per point", file=sys.stderr)
        with servers(checkpoint, args.threads, args.device, args.cache, extra_env) as urls:
            tokens = check_same_answers(urls, bodies)
            results, cpu_ms = load_points(urls, bodies, clients, seconds, warmup)
        requests = 64 if size == "tiny" and not args.quick else 32
        engines[size] = engine_times(checkpoint, bodies, args.threads, args.device, requests)
        report += [
            f"\n### {size} checkpoint, {args.mode} attention ({seconds:g} s per point; sample "
            f"request: 3 questions, 4 encoder rows, {tokens} input tokens)\n",
            summary(results, cpu_ms),
            "",
            table(results, UPSTREAM),
        ]
        if args.device == "cpu":
            hidden = json.loads((checkpoint / "config.json").read_text())["hidden_size"]
            gflop = matmul_flops(checkpoint, bodies, args.threads, 8)
            ceiling = matmul_ceiling(hidden, args.threads)
            report += [
                "",
                bound_table(gflop, ceiling, args.threads, cpu_ms, DECIDEALOT, UPSTREAM),
            ]
    report += [f"\n### Engines without HTTP ({args.mode} attention, same requests)\n"]
    report.append(engine_table(engines))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
