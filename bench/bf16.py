"""DECIDEALOT_PRECISION=auto against fp32 and upstream `laya-serve`, side by side in one run.

Per checkpoint (Laya english, random weights at ModernBERT's initializer range): `base`
(ModernBERT-base's shape, 22 layers) and `base-4` (its width, 4 layers, as issue 27 measured),
five servers run at once on the same checkpoint, one torch thread per pass:

- `decidealot auto`: the default (bf16 on a CPU with amx_bf16 or avx512_bf16, else fp32), its
  passes compiled (`DECIDEALOT_COMPILE=auto`): the load waits until its compile has ended;
- `decidealot bf16 eager`: bf16 with `DECIDEALOT_COMPILE=off` (only where the CPU has bf16
  units: elsewhere bf16 is refused before listening);
- `decidealot fp32`;
- `laya serve fp32` and `laya serve bf16` (upstream, `LAYA_CPU_AMP=bf16`: CPU autocast).

Every point is closed-loop load with the same requests (bench/peers.py's `load_points`: the
servers take turns per point, in a rotating order); reported per server: decisions/s, p50, p99,
the CPU of its process tree per decision, the worker's (laya serve's) resident memory after the
runs, and max and mean |dp| against Decidealot fp32 over the same requests. What `auto` ran,
and why, is read from its `decidealot_precision_info` gauge; the CPU's model and bf16/int8
flags head the table. For `auto`: what its passes run through and why (`/v1/status`), the
seconds from its first request until its compile ended after a cold start (an empty inductor
cache), and again in a second server over the same model directory (the cache filled).
`--peers` runs some of the servers only.

`--passes` measures one pass in this process instead (no servers): eager against compiled at the
issue's eight worker shapes (3 to 18 rows of 120 to 260 tokens), per precision this CPU runs
natively (fp32, and bf16 where it has bf16 units; `--precisions` to choose), the compile's
seconds cold and from the cache, and the largest |dp| between them. `--during` times one
decision at a time on the tiny english checkpoint in bf16 while the engine's compile runs in
another thread (as a worker's compile thread does), against before and after it.

    .venv/bin/python bench/bf16.py                       # both checkpoints, 8 and 32 clients
    .venv/bin/python bench/bf16.py --sections base-4 --seconds 5 --quality 8
    .venv/bin/python bench/bf16.py --passes --sections base-4
    .venv/bin/python bench/bf16.py --during
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.int8 import worker_memory
from bench.laya import VARIANTS
from bench.loadgen import cpu_model, free_port, process_tree, python, server
from bench.peers import COMMON_ENV, answers, decidealot, http_peer, load_points
from bench.workload import QUESTIONS, sized_states
from decidealot import cpu

SHAPES = {"base": {}, "base-4": {"num_hidden_layers": 4}}
"""On top of ModernBERT-base's shape (`size="base"`)."""
OURS = ("decidealot auto", "decidealot bf16 eager", "decidealot fp32")
THEIRS = ("laya serve fp32", "laya serve bf16")


@dataclass
class Peer:
    rps: dict[int, float] = field(default_factory=dict)
    p50: dict[int, float] = field(default_factory=dict)
    p99: dict[int, float] = field(default_factory=dict)
    cpu_ms: dict[int, float] = field(default_factory=dict)
    """CPU of the server's process tree per decision."""
    rss_mb: float = float("nan")
    max_dp: float = float("nan")
    mean_dp: float = float("nan")


@dataclass
class Section:
    name: str
    peers: dict[str, Peer]
    auto: str = ""
    """What `auto` ran, from `decidealot_precision_info` (precision and reason)."""
    requests: int = 0
    passes: dict[str, object] = field(default_factory=dict)
    """`auto`'s english checkpoint's compile, from `/v1/status`, once it ended."""
    until_compiled: float = float("nan")
    """Seconds from `auto`'s first request until its compile ended (cold cache)."""
    cached: dict[str, object] = field(default_factory=dict)
    until_cached: float = float("nan")
    """The same in a second server over the same model directory (the cache filled)."""


def checkpoint(cache: Path, name: str) -> Path:
    """The section's english checkpoint (tiny siblings, configured but never loaded)."""
    from decidealot.providers.laya.tiny import build_laya_checkpoint

    folder = cache / name
    for variant in VARIANTS:
        size, shape = ("base", SHAPES[name]) if variant == "english" else ("tiny", None)
        if not (folder / variant / "rl_agent_config.json").exists():
            build_laya_checkpoint(folder / variant, variant, size=size, shape=shape)
    return folder


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1e3
    return float("nan")


def precision_info(url: str) -> str:
    """`decidealot_precision_info`'s labels for the english checkpoint."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("decidealot_precision_info{") and 'checkpoint="english"' in line:
            return line.split("{", 1)[1].rsplit("}", 1)[0]
    return "(not reported)"


def differences(reference: list[dict], other: list[dict]) -> tuple[float, float]:
    """Max and mean |dp| over every probability (noul: P(true)) of the same requests."""
    moved: list[float] = []
    for ours, theirs in zip(reference, other, strict=True):
        for name, answer in ours.items():
            peer = theirs[name]
            if "noul" in answer:
                moved.append(abs(answer["noul"] - peer.get("noul_raw", peer["noul"])))
            else:
                moved += [
                    abs(p - peer["probabilities"][k]) for k, p in answer["probabilities"].items()
                ]
    return max(moved), statistics.fmean(moved)


def _provider_env(folder: Path) -> dict[str, str]:
    return {
        "DECIDEALOT_VON_ENABLED": "false",
        **{
            f"DECIDEALOT_LAYA_{v.upper().replace('-', '_')}_CHECKPOINT": str(folder / v)
            for v in VARIANTS
        },
    }


def _ours(peer: str) -> tuple[str, dict[str, str]]:
    """The precision a Decidealot peer runs in, and its compile setting."""
    precision = peer.split(" ")[1]
    return precision, {"DECIDEALOT_COMPILE": "off"} if peer.endswith("eager") else {}


def servers(
    stack: ExitStack, folder: Path, logs: Path, name: str, peers: list[str]
) -> Iterator[tuple[str, str]]:
    """(peer, base URL) of the servers, each started in `stack`."""
    english = folder / "english"
    for peer in OURS:
        if peer not in peers:
            continue
        precision, compile_env = _ours(peer)
        port = free_port()
        env = _provider_env(folder) | compile_env
        yield (
            peer,
            stack.enter_context(decidealot(f"bf16-{name}-{precision}", port, precision, env, logs)),
        )
    for peer in THEIRS:
        if peer not in peers:
            continue
        port = free_port()
        env = {
            **COMMON_ENV,
            "LAYA_HOST": "127.0.0.1",
            "LAYA_PORT": str(port),
            "LAYA_DEVICE": "cpu",
            "LAYA_THREADS": "1",
            "LAYA_MODELS": "english",
            "LAYA_EXTRA_MODELS": json.dumps({"english": str(english)}),
            "LAYA_MAX_CONCURRENT": "64",
        }
        if peer.endswith("bf16"):
            env["LAYA_CPU_AMP"] = "bf16"
        command = [str(Path(python()).with_name("laya-serve"))]
        log = logs / f"{peer.replace(' ', '-')}-{name}.log"
        yield peer, stack.enter_context(server(command, port=port, env=env, log_path=log))


def english_status(url: str) -> dict[str, object]:
    """`/v1/status`'s entry for Laya's english checkpoint."""
    status = httpx.get(url + "/v1/status", timeout=30).json()
    laya = next(p for p in status["providers"] if p["name"] == "laya")
    return next(c for c in laya["checkpoints"] if c["name"] == "english")


def until_compiled(url: str, model: str, state: str) -> tuple[float, dict[str, object]]:
    """Seconds from a first request until the english checkpoint's compile ended, and what
    `/v1/status` then says of it."""
    began = time.monotonic()
    answers(url + "/v1/systemone", model, [state])
    while (found := english_status(url))["compile_state"] == "compiling":
        time.sleep(0.5)
    keys = ("passes", "compile_state", "compile_reason", "compiled_graphs", "cached_graphs")
    return time.monotonic() - began, {k: found[k] for k in keys}


def cached_start(folder: Path, args: argparse.Namespace, name: str, state: str) -> tuple:
    """A second `auto` server over the first's model directory: its time until compiled."""
    precision, _ = _ours("decidealot auto")
    env = _provider_env(folder)
    with decidealot(f"bf16-{name}-auto-cached", free_port(), precision, env, args.logs) as url:
        return until_compiled(url, "laya-english", state)


def run_section(name: str, args: argparse.Namespace) -> Section:
    folder = checkpoint(args.cache, name)
    tokenizer = folder / "english" / "tokenizer" / "tokenizer.json"
    states = [s.removeprefix("Ticket 0:") for s in sized_states(tokenizer, 256, _zero)]
    peers = [p for p in (*OURS, *THEIRS) if p in args.peers]
    if not cpu.bf16_units(cpu.flags()) and "decidealot bf16 eager" in peers:
        peers.remove("decidealot bf16 eager")  # refused before listening on this CPU
        print("  no bf16 units: decidealot bf16 eager is not run", file=sys.stderr)
    section = Section(name, {peer: Peer() for peer in peers})
    shutil.rmtree(args.logs / "models-auto" / "compiled", ignore_errors=True)  # a cold start
    models = dict.fromkeys(OURS, "laya-english") | dict.fromkeys(THEIRS, "english")
    with ExitStack() as stack:
        urls = dict(servers(stack, folder, args.logs, name, peers))
        pids = {peer: _server_pid(url.rsplit(":", 1)[1]) for peer, url in urls.items()}
        for peer, url in urls.items():  # load each checkpoint before the clock starts
            if peer == "decidealot auto":  # and wait for its compile to end
                section.until_compiled, section.passes = until_compiled(
                    url, models[peer], states[0]
                )
            else:
                answers(url + "/v1/systemone", models[peer], states[:1])
        section.auto = precision_info(urls["decidealot auto"])
        print(f"  {name}: auto runs {section.auto}", file=sys.stderr)
        peers = {
            peer: http_peer(peer, url + "/v1/systemone", models[peer], pids[peer], states)
            for peer, url in urls.items()
        }
        results, cpu_ms = load_points(peers, args.clients, args.seconds)
        for result in results:
            peer = section.peers[result.name]
            peer.cpu_ms[result.clients] = cpu_ms[(result.name, result.clients)]
            peer.rps[result.clients] = result.rps
            peer.p50[result.clients] = result.p50_ms
            peer.p99[result.clients] = result.p99_ms
        quality = [f"Quality {i}:" + states[i % len(states)] for i in range(args.quality)]
        got = {
            peer: answers(url + "/v1/systemone", models[peer], quality)
            for peer, url in urls.items()
        }
        section.requests = len(quality)
        for peer in urls:
            record = section.peers[peer]
            record.max_dp, record.mean_dp = differences(got["decidealot fp32"], got[peer])
            record.rss_mb = worker_memory(pids[peer])[0] if peer in OURS else _rss_mb(pids[peer])
    section.until_cached, section.cached = cached_start(folder, args, name, states[0])
    return section


def _server_pid(port: str) -> int:
    """The server this process started on `port`: Decidealot's names it in its command
    line, laya serve's in its environment (LAYA_PORT)."""
    for pid in process_tree(os.getpid())[1:]:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = b"decidealot\0serve" in command and port.encode() in command.split(b"\0")
        if ours or (b"laya-serve" in command and f"LAYA_PORT={port}".encode() in environ):
            return pid
    raise RuntimeError(f"no server of this bench on port {port}")


def _zero(_: int) -> str:
    return "Ticket 0:"


def markdown(sections: list[Section], clients: list[int]) -> str:
    flags = cpu.flags()
    units = ", ".join((*cpu.bf16_units(flags), *cpu.int8_units(flags))) or "none"
    lines = [
        f"CPU: {cpu_model()}; its bf16 and int8 units (/proc/cpuinfo flags): {units}.",
        "",
        "| checkpoint | server | "
        + " | ".join(f"dec/s {n} | p50 ms {n} | p99 ms {n} | CPU ms/dec {n}" for n in clients)
        + " | max \\|dp\\| | mean \\|dp\\| | RSS MB |",
        "|---|---|" + "---:|---:|---:|---:|" * len(clients) + "---:|---:|---:|",
    ]
    notes = []
    for section in sections:
        notes.append(
            f"- {section.name}: auto's passes {section.passes}; {section.until_compiled:.1f} s "
            f"from its first request until its compile ended (cold cache), "
            f"{section.until_cached:.1f} s in a second server with the cache filled "
            f"({section.cached})."
        )
        for name, peer in section.peers.items():
            points = " | ".join(
                f"{peer.rps[n]:.2f} | {peer.p50[n]:.0f} | {peer.p99[n]:.0f} | {peer.cpu_ms[n]:.0f}"
                for n in clients
            )
            lines.append(
                f"| {section.name} | {name} | {points} | {peer.max_dp:.4f} | "
                f"{peer.mean_dp:.5f} | {peer.rss_mb:.0f} |"
            )
        auto = section.peers["decidealot auto"]
        against = [
            p
            for p in ("decidealot fp32", "decidealot bf16 eager", "laya serve bf16")
            if p in section.peers
        ]
        speed = ", ".join(
            " and ".join(f"{auto.rps[n] / section.peers[p].rps[n]:.2f}x {p}" for p in against)
            + f" at {n} clients"
            for n in clients
        )
        notes.append(
            f"- {section.name}: auto ran {section.auto}; its decisions/s: {speed}; |dp| over "
            f"{section.requests} requests against Decidealot fp32."
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


SHAPES_SEEN = [(3, 120), (5, 140), (6, 160), (8, 180), (10, 200), (12, 220), (15, 240), (18, 260)]
"""(rows, tokens) of the passes timed by `--passes`: the shapes a worker sees (issue 36)."""


def pass_rows(rows: int, tokens: int, seed: int) -> list:
    """Laya rows of random ids, `tokens` long but for the last (padding), four markers each."""
    import random

    from decidealot.providers.laya.worker.render import LayaRow

    draw = random.Random(seed)
    made = []
    for i in range(rows):
        length = tokens - (i == rows - 1) * 7
        ids = [draw.randrange(5, 300) for _ in range(length)]
        markers = [length // 5 * k for k in range(1, 5)]
        made.append(LayaRow(ids, markers, i % 3, length, length))
    return made


def pass_section(name: str, precision: str, args: argparse.Namespace) -> str:
    """One markdown row: eager against compiled passes of `name`'s english checkpoint."""
    import torch
    import torch._dynamo

    from decidealot.providers.laya.worker.model import load_checkpoint
    from decidealot.providers.worker import compiled, memory

    torch.set_num_threads(1)
    folder = checkpoint(args.cache, name) / "english"
    model = load_checkpoint(folder, torch.device("cpu"), precision)
    batches = [pass_rows(r, t, seed) for seed, (r, t) in enumerate(SHAPES_SEEN)]
    rss = memory.resident_bytes() / 1e6

    def timed(module: object) -> tuple[float, list]:
        clock, outputs = time.perf_counter(), []
        for rows in batches:
            outputs += model.option_logits(rows, module)
        return (time.perf_counter() - clock) * 1e3, outputs

    cache = args.cache / "passes-cache"
    shutil.rmtree(cache, ignore_errors=True)
    seconds = []
    for _ in range(2):  # cold, then from the cache (dynamo's own state reset between)
        torch._dynamo.reset()
        model.passes.current = model.passes.eager
        folder_key = compiled.cache_folder(str(cache), str(folder), "cpu")
        outcome = compiled.compile_passes(model, folder_key, "cpu")
        seconds.append(f"{outcome.seconds:.1f} ({outcome.cached_graphs}/{outcome.graphs})")
    compiled_rss = memory.resident_bytes() / 1e6
    eager_ms, want = min((timed(model.passes.eager) for _ in range(args.repeats)), key=_first)
    fast_ms, got = min((timed(model.passes) for _ in range(args.repeats)), key=_first)
    moved = max(
        float((torch.tensor(a).softmax(-1) - torch.tensor(b).softmax(-1)).abs().max())
        for a, b in zip(got, want, strict=True)
    )
    return (
        f"| {name} | {precision} | {outcome.state} | {eager_ms:.0f} | {fast_ms:.0f} | "
        f"{eager_ms / fast_ms:.2f}x | {seconds[0]} | {seconds[1]} | {moved:.2e} | "
        f"{rss:.0f} | {compiled_rss:.0f} |"
    )


def _first(pair: tuple[float, list]) -> float:
    return pair[0]


def passes_markdown(args: argparse.Namespace) -> str:
    flags = cpu.flags()
    precisions = args.precisions or ["fp32", *(["bf16"] if cpu.bf16_units(flags) else [])]
    lines = [
        f"CPU: {cpu_model()}; its bf16 and int8 units (/proc/cpuinfo flags): "
        f"{', '.join((*cpu.bf16_units(flags), *cpu.int8_units(flags))) or 'none'}.",
        "",
        "| checkpoint | precision | compiled | eager ms | compiled ms | speed-up | compile s "
        "cold (cached/graphs) | compile s cached | max \\|dp\\| | RSS MB eager | RSS MB "
        "compiled |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in args.sections.split(","):
        for precision in precisions:
            lines.append(pass_section(name, precision, args))
            print(lines[-1], file=sys.stderr)
    return "\n".join(lines)


def during_compile(args: argparse.Namespace) -> str:
    """Decisions (one job of four questions each, one after another) before, during and after
    the engine's compile, which runs in a thread of its own."""
    import threading

    import torch

    from decidealot.contract import Question
    from decidealot.jobs import EngineSpec, Job
    from decidealot.providers.engine.planner import run_together
    from decidealot.providers.laya.tiny import build_laya_checkpoint
    from decidealot.providers.laya.worker.engine import LayaEngine

    torch.set_num_threads(1)
    folder = args.cache / "during" / "english"
    if not (folder / "rl_agent_config.json").exists():
        build_laya_checkpoint(folder, "english", shape={"initializer_range": 0.02})
    cache = args.cache / "during-cache"
    shutil.rmtree(cache, ignore_errors=True)
    options = {"precision": "bf16", "compile": "auto", "compile_cache": str(cache)}
    engine = LayaEngine(EngineSpec("", {"english": str(folder)}, ["english"], options=options))
    questions = msgspec.convert(QUESTIONS, dict[str, Question])
    job = Job("english", "I was charged twice for one order; please refund one.", questions)

    def decide() -> float:
        clock = time.perf_counter()
        run_together(engine, [engine.prepare(job)])
        return (time.perf_counter() - clock) * 1e3

    for _ in range(3):
        decide()
    before = [decide() for _ in range(20)]
    done = threading.Event()
    compiler = threading.Thread(target=lambda: (engine.compile_next(), done.set()))
    compiler.start()
    during = []
    while not done.is_set():
        during.append(decide())
    compiler.join()
    after = [decide() for _ in range(20)]
    during.sort()
    return (
        f"one decision, ms: before the compile median {statistics.median(before):.1f}; during "
        f"it ({len(during)} decisions) median {statistics.median(during):.1f}, p99 "
        f"{during[int(len(during) * 0.99)]:.0f}, max {during[-1]:.0f}, "
        f"{sum(d > 100 for d in during)} over 100 ms; after it (compiled) median "
        f"{statistics.median(after):.1f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quality", type=int, default=40, help="requests compared for |dp|")
    parser.add_argument("--clients", type=lambda s: [int(n) for n in s.split(",")], default=[8, 32])
    parser.add_argument("--sections", default="base-4,base")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-bf16"))
    parser.add_argument("--peers", default=",".join((*OURS, *THEIRS)))
    parser.add_argument("--passes", action="store_true", help="time passes in this process")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=None)
    parser.add_argument("--repeats", type=int, default=3, help="--passes: best of")
    parser.add_argument("--during", action="store_true", help="decisions during a compile")
    args = parser.parse_args()
    args.peers = args.peers.split(",")
    args.logs = args.cache / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    if args.during:
        print(f"Command: `bench/bf16.py {' '.join(sys.argv[1:])}`\n")
        print(during_compile(args))
        return 0
    if args.passes:
        print(f"Command: `bench/bf16.py {' '.join(sys.argv[1:])}`\n")
        print(passes_markdown(args))
        return 0
    results = args.cache / "results.json"
    sections = [run_section(name, args) for name in args.sections.split(",")]
    results.write_text(json.dumps([asdict(s) for s in sections], indent=1))
    print(f"Command: `bench/bf16.py {' '.join(sys.argv[1:])}`\n")
    print(markdown(sections, args.clients))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
