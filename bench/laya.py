"""Laya: Decidealot against upstream `laya-serve` on the same random checkpoint, side by side.

Both servers run at once on the same english checkpoint, with the same torch thread count, and
take turns (the order alternates every round) under closed-loop load at 1, 8 and 32 clients.
Every request is distinct (a numbered state of 100-300 tokens before the checkpoint's row
budget) and asks three questions: a choice with four options, a score with three levels and a
noul. A decision here is one request. Besides throughput and latency, each point reports the
servers' CPU time per decision, which other load on a shared machine disturbs far less.

Checkpoints are random (providers/laya/tiny.py): `tiny` (hidden 64, 2 layers, rows
cut to 128 tokens) shows serving overhead; `tiny512` (hidden 64, 3 layers, Laya english's real
row budgets 512 / 192) shows the same overhead at the real row lengths; `base` has
ModernBERT-base's encoder shape and the shipped 512-token budget, and shows compute.
Decidealot's CPU is also split into its gateway and its worker process (read from /proc), and
docs/laya.png (decisions/s and p99 against clients) is drawn from the same run. On CPU each
checkpoint's tables end with the compute bound (bench/compute.py): how far any server could
get ahead of laya-serve at equal CPU. The last table is Decidealot's HTTP overhead: the same
requests through
`LayaEngine.prepare`/`run` in this process, one at a time, against HTTP at one client.
`--device cuda` runs all of it on a GPU.

    .venv/bin/python bench/laya.py            # full run (about 15 minutes on 2 cores)
    .venv/bin/python bench/laya.py --quick    # a few minutes, the two tiny checkpoints only
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compute import bound_table, matmul_ceiling, matmul_gflop
from bench.loadgen import (
    LoadResult,
    cpu_model,
    drive_raw,
    python,
    role_cpu_seconds,
    server_root,
    side_by_side,
    table,
    tree_cpu_seconds,
    upstream_package,
)
from bench.workload import QUESTIONS, sized_states

DECIDEALOT = "decidealot"
UPSTREAM = "laya-serve"
VARIANTS = ("english", "multilingual", "typed-decisions")
ROOT = Path(__file__).resolve().parents[1]
PLOT = ROOT / "docs" / "laya.png"
WORKER = {"worker": "decidealot.providers.engine"}
"""How Decidealot's CPU is split: the worker process by its command line, the rest gateway."""


def build_checkpoints(cache: Path, size: str) -> Path:
    """The english checkpoint of `size` (plus tiny multilingual/typed siblings, which Decidealot
    needs configured but never loads here); built once into `cache`."""
    from decidealot.providers.laya.tiny import build_laya_checkpoint

    folder = cache / size
    for variant in VARIANTS:
        target = folder / variant
        variant_size = size if variant == "english" else "tiny"
        if not (target / "rl_agent_config.json").exists():
            print(f"building {variant_size} {variant} checkpoint in {target}", file=sys.stderr)
            build_laya_checkpoint(target, variant, size=variant_size)
    return folder


def make_states(checkpoint: Path, count: int) -> list[str]:
    """`count` states of 100-300 tokens (under this checkpoint's tokenizer), before the request
    number `Bodies` puts in front of each."""
    heading = "Ticket 1000:"
    tokenizer = checkpoint / "tokenizer" / "tokenizer.json"
    return [s.removeprefix(heading) for s in sized_states(tokenizer, count, lambda _: heading)]


class Bodies:
    """Request bodies per server: the same state sequence, each server's model name. Every
    index gets its own state text (numbered), so no request repeats an earlier one."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.offset = 0

    def state(self, index: int) -> str:
        return f"Ticket {index}:" + self.states[index % len(self.states)]

    def body(self, index: int, model: str) -> bytes:
        state = self.state(index)
        return json.dumps({"model": model, "state": state, "questions": QUESTIONS}).encode()

    def next_run(self, model: str) -> Callable[[int], bytes]:
        """Bodies for one load run; runs start at different states."""
        start = self.offset
        self.offset += 997
        return lambda i: self.body(start + i, model)


@contextmanager
def servers(
    folder: Path, threads: int, device: str, logs: Path, decidealot_env: dict[str, str]
) -> Iterator[dict[str, tuple[str, str, int]]]:
    """Both servers, up; yields {name: (decision URL, model name, server pid)}."""

    def laya_serve(port: int) -> tuple[list[str], dict[str, str]]:
        env = {
            "LAYA_HOST": "127.0.0.1",
            "LAYA_PORT": str(port),
            "LAYA_DEVICE": device,
            "LAYA_THREADS": str(threads),
            "LAYA_MODELS": "english",
            "LAYA_EXTRA_MODELS": json.dumps({"english": str(folder / "english")}),
            "LAYA_MAX_CONCURRENT": "64",
        }
        return [str(Path(python()).with_name("laya-serve"))], env

    ours_env = {
        "DECIDEALOT_PRECISION": "fp32",  # like for like with upstream (bench/bf16.py: auto)
        "DECIDEALOT_VON_ENABLED": "false",
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": str(folder / "english"),
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT": str(folder / "multilingual"),
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT": str(folder / "typed-decisions"),
        **decidealot_env,
    }
    with side_by_side(
        threads=threads,
        device=device,
        logs=logs,
        decidealot_env=ours_env,
        upstream=laya_serve,
        upstream_log="laya.log",
    ) as (ours, theirs):
        yield {
            DECIDEALOT: (ours + "/v1/systemone", "laya-english", server_root("decidealot")),
            UPSTREAM: (theirs + "/v1/systemone", "english", server_root("laya-serve")),
        }


def check_same_answers(urls: dict[str, tuple[str, str, int]], bodies: Bodies) -> int:
    """Both servers answer a sample request with the same probabilities (this also loads
    Decidealot's worker); returns that request's input tokens."""
    answers: dict[str, list[float]] = {}
    tokens: dict[str, int] = {}
    for name, (url, model, _) in urls.items():
        response = httpx.post(url, content=bodies.body(0, model), timeout=900.0)
        response.raise_for_status()
        payload = response.json()
        answers[name] = [
            p for a in payload["answers"].values() for p in a.get("probabilities", {}).values()
        ]
        tokens[name] = payload["usage"]["input_tokens"]
    ours, theirs = answers[DECIDEALOT], answers[UPSTREAM]
    same = len(ours) == len(theirs) and all(
        abs(a - b) <= 1e-3 for a, b in zip(ours, theirs, strict=True)
    )
    if not same:
        raise SystemExit(f"servers disagree on the same request: {answers}")
    if tokens[DECIDEALOT] != tokens[UPSTREAM]:
        raise SystemExit(f"servers count input tokens differently: {tokens}")
    return tokens[DECIDEALOT]


def load_points(
    urls: dict[str, tuple[str, str, int]],
    bodies: Bodies,
    clients: list[int],
    seconds: float,
    rounds: int,
    warmup: int,
    driver: Callable[..., LoadResult],
) -> tuple[
    list[LoadResult],
    dict[tuple[str, int], float],
    dict[int, list[float]],
    dict[tuple[str, int], float],
]:
    """Each client count against both servers in turn, `rounds` times (the order alternates),
    `seconds` each. Returns per server and client count the rounds combined (requests and
    seconds summed, p50 and p99 the median over rounds), server CPU milliseconds per decision
    (robust to other load on the machine, unlike throughput), each round's throughput ratio
    (ours / theirs), whose spread shows how noisy the machine was, and Decidealot's CPU
    milliseconds per decision by process (`("gateway" | "worker", clients)`)."""
    runs: dict[tuple[str, int], list[LoadResult]] = {}
    cpu_seconds: dict[tuple[str, int], float] = {}
    role_seconds: dict[tuple[str, int], float] = {}
    ratios: dict[int, list[float]] = {}
    turn = 0
    for n in clients:
        for _ in range(rounds):
            order = [DECIDEALOT, UPSTREAM] if turn % 2 == 0 else [UPSTREAM, DECIDEALOT]
            turn += 1
            for name in order:
                url, model, pid = urls[name]
                run_bodies = bodies.next_run(model)
                if warmup:
                    driver(name, url, run_bodies, clients=n, seconds=0, warmup=warmup)
                before, roles_before = tree_cpu_seconds(pid), role_cpu_seconds(pid, WORKER)
                result = driver(name, url, run_bodies, clients=n, seconds=seconds, warmup=0)
                used = tree_cpu_seconds(pid) - before
                cpu_seconds[(name, n)] = cpu_seconds.get((name, n), 0.0) + used
                if name == DECIDEALOT:
                    for role, after in role_cpu_seconds(pid, WORKER).items():
                        spent = after - roles_before[role]
                        role_seconds[(role, n)] = role_seconds.get((role, n), 0.0) + spent
                runs.setdefault((name, n), []).append(result)
                print(
                    f"  {name:>10} {n:>2} clients: {result.rps:7.2f} req/s  "
                    f"p50 {result.p50_ms:8.1f} ms  p99 {result.p99_ms:8.1f} ms  "
                    f"cpu {1000 * used / max(1, result.requests):7.2f} ms/req  "
                    f"({result.requests} requests, {result.errors} errors)",
                    file=sys.stderr,
                )
            ours, theirs = runs[(DECIDEALOT, n)][-1], runs[(UPSTREAM, n)][-1]
            ratios.setdefault(n, []).append(ours.rps / theirs.rps if theirs.rps else float("nan"))
    results = [
        LoadResult(
            name,
            n,
            sum(r.requests for r in parts),
            sum(r.errors for r in parts),
            sum(r.seconds for r in parts),
            statistics.median(r.p50_ms for r in parts),
            statistics.median(r.p99_ms for r in parts),
        )
        for (name, n), parts in runs.items()
    ]
    cpu_ms = {
        key: 1000 * cpu_seconds[key] / max(1, r.requests)
        for key, r in zip(runs, results, strict=True)
    }
    ours = {r.clients: r.requests for r in results if r.name == DECIDEALOT}
    role_ms = {(role, n): 1000 * s / max(1, ours[n]) for (role, n), s in role_seconds.items()}
    return results, cpu_ms, ratios, role_ms


def summary(
    results: list[LoadResult],
    cpu_ms: dict[tuple[str, int], float],
    ratios: dict[int, list[float]],
    role_ms: dict[tuple[str, int], float],
) -> str:
    """Per client count: throughput, latency and server CPU per decision of both servers,
    Decidealot's ratios (throughput: ours / theirs; CPU: theirs / ours, so > 1 favours ours)
    and Decidealot's CPU per decision split into its gateway and its worker."""
    by_key = {(r.name, r.clients): r for r in results}
    lines = [
        "| clients | decidealot dec/s | laya-serve dec/s | throughput ratio | "
        "p50 ms (ours / theirs) | p99 ms (ours / theirs) | "
        "per-round throughput ratios | server CPU ms/dec (ours / theirs) | "
        "CPU efficiency ratio | ours: gateway / worker CPU ms/dec |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r.clients for r in results}):
        ours, theirs = by_key[(DECIDEALOT, n)], by_key[(UPSTREAM, n)]
        ratio = ours.rps / theirs.rps if theirs.rps else float("nan")
        cpu_ours, cpu_theirs = cpu_ms[(DECIDEALOT, n)], cpu_ms[(UPSTREAM, n)]
        lines.append(
            f"| {n} | {ours.rps:.2f} | {theirs.rps:.2f} | **{ratio:.2f}x** | "
            f"{ours.p50_ms:.0f} / {theirs.p50_ms:.0f} | {ours.p99_ms:.0f} / {theirs.p99_ms:.0f} | "
            f"{', '.join(f'{r:.2f}' for r in ratios[n])} | "
            f"{cpu_ours:.1f} / {cpu_theirs:.1f} | {cpu_theirs / cpu_ours:.2f}x | "
            f"{role_ms[('gateway', n)]:.2f} / {role_ms[('worker', n)]:.2f} |"
        )
    return "\n".join(lines)


def plot(points: dict[str, list[LoadResult]]) -> None:
    """docs/laya.png: decisions/s and p99 against clients, both servers, one column per
    checkpoint, from this run's results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        2, len(points), figsize=(4.6 * len(points), 7.2), squeeze=False, sharex=True
    )
    colours = {DECIDEALOT: "#4c72b0", UPSTREAM: "#c44e52"}
    for column, (size, results) in enumerate(points.items()):
        for name in (DECIDEALOT, UPSTREAM):
            mine = sorted((r for r in results if r.name == name), key=lambda r: r.clients)
            clients = [r.clients for r in mine]
            style = {"marker": "o", "color": colours[name], "label": name}
            axes[0][column].plot(clients, [r.rps for r in mine], **style)
            axes[1][column].plot(clients, [r.p99_ms for r in mine], **style)
        axes[0][column].set_title(f"Laya english, {size} checkpoint")
        axes[0][column].set_ylabel("decisions/s")
        axes[1][column].set_ylabel("p99 latency, ms (log)")
        axes[1][column].set_yscale("log")
        axes[1][column].set_xlabel("closed-loop clients")
        axes[1][column].set_xscale("log", base=2)
        ticks = sorted({r.clients for r in results})
        axes[1][column].set_xticks(ticks, [str(n) for n in ticks])
        axes[0][column].set_ylim(bottom=0)
        for axis in (axes[0][column], axes[1][column]):
            axis.grid(alpha=0.3)
        axes[0][column].legend()
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)
    print(f"plot: {PLOT.relative_to(ROOT)}", file=sys.stderr)


def english_engine(folder: Path, device: str, threads: int) -> Callable[[list[str]], object]:
    """A function answering states with Decidealot's engine on the english checkpoint, as one
    batch, in this process."""
    import msgspec
    import torch

    from decidealot.contract import Question
    from decidealot.jobs import EngineSpec, Job
    from decidealot.providers.engine.planner import run_together
    from decidealot.providers.laya.worker.engine import create

    torch.set_num_threads(threads)
    engine = create(
        EngineSpec(
            factory="decidealot.providers.laya.worker.engine:create",
            checkpoints={"english": str(folder / "english")},
            preload=("english",),
            device=device,
            torch_threads=threads,
        )
    )
    questions = msgspec.convert(QUESTIONS, dict[str, Question])

    def decide(states: list[str]) -> object:
        return run_together(
            engine, [engine.prepare(Job("english", state, questions)) for state in states]
        )

    return decide


def http_overhead(
    folder: Path,
    url: str,
    bodies: Bodies,
    threads: int,
    device: str,
    requests: int,
    block: int,
) -> dict[str, float]:
    """Milliseconds per request: in-process `prepare`+`run` vs HTTP at one client, the same
    requests, in alternating blocks of `block` so background load hits both alike."""
    decide = english_engine(folder, device, threads)
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port)
    local: list[float] = []
    remote: list[float] = []

    def post(index: int) -> None:
        connection.request(
            "POST",
            parsed.path,
            body=bodies.body(index, "laya-english"),
            headers={"content-type": "application/json"},
        )
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"Decidealot answered {response.status}")

    def timed(call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    def in_process(index: int) -> None:
        decide([bodies.state(index)])

    try:
        in_process(0)  # warm both paths
        post(0)
        for first in range(0, requests, block):
            indices = range(first, min(first + block, requests))
            local += [timed(lambda i=i: in_process(i)) for i in indices]
            remote += [timed(lambda i=i: post(i)) for i in indices]
    finally:
        connection.close()
    return {
        "requests": len(local),
        "in_process_p50": statistics.median(local),
        "http_p50": statistics.median(remote),
        "in_process_mean": statistics.fmean(local),
        "http_mean": statistics.fmean(remote),
        "overhead_p50": statistics.median(remote) - statistics.median(local),
    }


def matmul_flops(folder: Path, bodies: Bodies, threads: int, requests: int) -> dict[str, float]:
    """Matrix-multiply GFLOP per request of upstream's `Agent.system_one` and of Decidealot's
    engine (batched), on `requests` of the bench's states, english checkpoint, on CPU."""
    import warnings

    decide = english_engine(folder, "cpu", threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the shipped choice:11+ clamp warning
        agent = upstream_package("laya").load(str(folder / "english"), device="cpu")
    states = [bodies.state(i) for i in range(requests)]
    return {
        UPSTREAM: matmul_gflop(lambda: [agent.system_one(s, QUESTIONS) for s in states])
        / len(states),
        DECIDEALOT: matmul_gflop(lambda: decide(states)) / len(states),
    }


def overhead_table(rows: dict[str, dict[str, float]]) -> str:
    lines = [
        "| checkpoint | requests | in-process p50 ms | HTTP p50 ms | overhead (p50 difference) "
        "ms | in-process mean ms | HTTP mean ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for size, o in rows.items():
        lines.append(
            f"| {size} | {o['requests']:.0f} | {o['in_process_p50']:.2f} | {o['http_p50']:.2f} | "
            f"{o['overhead_p50']:.2f} | {o['in_process_mean']:.2f} | {o['http_mean']:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run, tiny checkpoints only")
    parser.add_argument("--sizes", default=None, help="comma list of tiny,tiny512,base")
    parser.add_argument("--no-plot", action="store_true", help="leave docs/laya.png alone")
    parser.add_argument(
        "--replot", action="store_true", help="redraw docs/laya.png from the last run's points"
    )
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=None, help="per point, tiny checkpoint")
    parser.add_argument("--base-seconds", type=float, default=30.0, help="per point, base")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds per point, tiny (default 3; base: 1)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both servers")
    parser.add_argument(
        "--device", default="cpu", help="torch device for both servers and the engine, e.g. cuda"
    )
    parser.add_argument(
        "--decidealot-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra setting for Decidealot (repeatable), e.g. DECIDEALOT_BATCH_TOKEN_BUDGET=4096",
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-laya"))
    args = parser.parse_args()
    sizes = (args.sizes or ("tiny,tiny512" if args.quick else "tiny,tiny512,base")).split(",")
    clients = [int(n) for n in args.clients.split(",")]
    tiny_seconds = args.seconds or 5.0
    tiny_rounds = args.rounds or (1 if args.quick else 3)
    extra_env = dict(item.split("=", 1) for item in args.decidealot_env)
    args.cache.mkdir(parents=True, exist_ok=True)
    saved = args.cache / "laya-points.json"
    if args.replot:
        plot(
            {
                size: [LoadResult(**r) for r in rs]
                for size, rs in json.loads(saved.read_text()).items()
            }
        )
        return 0

    report: list[str] = [
        f"Device: {args.device}. Torch threads: {args.threads} for both servers; "
        "laya-serve LAYA_MAX_CONCURRENT=64; "
        "Decidealot: DECIDEALOT_PROVIDER_TIMEOUT_SECONDS=900 (a base-sized batch on CPU can "
        f"outlast the 120 s default), other settings: {extra_env or 'defaults'}. "
        f"{os.cpu_count()} CPUs ({cpu_model()}). "
        f"Command: `{' '.join(['bench/laya.py', *sys.argv[1:]])}`",
    ]
    overheads: dict[str, dict[str, float]] = {}
    points: dict[str, list[LoadResult]] = {}
    for size in sizes:
        folder = build_checkpoints(args.cache, size)
        bodies = Bodies(make_states(folder / "english", 512))
        tiny = size != "base"
        seconds = tiny_seconds if tiny else args.base_seconds
        rounds = tiny_rounds if tiny else 1
        warmup = 3 if tiny else 1
        print(f"{size}: {seconds:g} s per point", file=sys.stderr)
        with servers(folder, args.threads, args.device, args.cache, extra_env) as urls:
            tokens = check_same_answers(urls, bodies)
            results, cpu_ms, ratios, role_ms = load_points(
                urls, bodies, clients, seconds, rounds, warmup, drive_raw
            )
            points[size] = results
            saved.write_text(json.dumps({k: [vars(r) for r in v] for k, v in points.items()}))
            count, block = (6, 3) if size == "base" else (40, 20) if args.quick else (200, 25)
            overheads[size] = http_overhead(
                folder, urls[DECIDEALOT][0], bodies, args.threads, args.device, count, block
            )
        report += [
            f"\n### {size} checkpoint ({rounds} x {seconds:g} s per point and server; sample "
            f"request: 3 questions, {tokens} input tokens)\n",
            summary(results, cpu_ms, ratios, role_ms),
            "",
            table(results, UPSTREAM),
        ]
        if args.device == "cpu":
            config = folder / "english" / "encoder" / "config.json"
            hidden = json.loads(config.read_text())["hidden_size"]
            gflop = matmul_flops(folder, bodies, args.threads, 8)
            ceiling = matmul_ceiling(hidden, args.threads)
            report += [
                "",
                bound_table(gflop, ceiling, args.threads, cpu_ms, DECIDEALOT, UPSTREAM),
            ]
    report += ["\n### Decidealot HTTP overhead over an in-process call (1 client)\n"]
    report.append(overhead_table(overheads))
    print("\n".join(report))
    if not args.no_plot:
        plot(points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
