"""Model switches at one resident slot: Decidealot before and after, side by side.

With `DECIDEALOT_MAX_RESIDENT_PROVIDERS=1` (the contract's default), a workflow that sends Laya
and Von requests in turn pays a model switch each time the model changes. Two `decidealot
serve` processes run at once on the same tiny checkpoints: `before` is the source tree of a
git revision (default: the last commit before switches reused the worker, exported and run
from its own folder), `after` is this checkout. Each takes closed-loop traffic at 1 and 8
clients where the model alternates between `laya-english` and `von` every N requests (N = 1,
10, 100): decisions/s, p50/p99, the first decision after each switch (1 client) and the
distribution of switch times: at each change of model, from the last answer of the old model
to the first answer of the new one (the stall a client sees; it holds the new model's load,
which Laya does on its first job, and that job's pass). Then, for each server: the first
decision after a start and after `POST /v1/models/unload`, the service's memory before the
first load and after the unload; on base-shaped checkpoints (ModernBERT-base's shape for
both), each checkpoint's own load time against what a switch adds to a decision; and the
candidates docs/performance.md reports (imports, the meta device, reading safetensors, a spare
interpreter). The plot (docs/switch-times.png) is drawn from the same run.

    .venv/bin/python bench/switch.py            # about 10 minutes on 2 cores
    .venv/bin/python bench/switch.py --quick    # about 3 minutes, no base checkpoints
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import ROOT, RawConnection, _percentile, cpu_model, free_port, python, server
from bench.workload import QUESTIONS

BEFORE = "eb36347"
"""The last commit whose model switches start a new worker process."""
MODELS = ("laya-english", "von")
PLOT = ROOT / "docs" / "switch-times.png"


# -- checkpoints and the two trees ----------------------------------------------------------


def checkpoints(cache: Path, size: str) -> dict[str, Path]:
    """Laya's three checkpoints (english of `size`, the others tiny) and Von's, built once."""
    from decidealot.providers.laya.tiny import VARIANTS, build_laya_checkpoint
    from decidealot.providers.von.tiny import build_von_checkpoint

    folder = cache / size
    paths: dict[str, Path] = {}
    for variant in VARIANTS:
        paths[variant] = folder / f"laya-{variant}"
        if not (paths[variant] / "rl_agent_config.json").exists():
            print(f"building {size} laya {variant} in {paths[variant]}", file=sys.stderr)
            build_laya_checkpoint(
                paths[variant], variant, size=size if variant == "english" else "tiny"
            )
    paths["von"] = folder / "von"
    if not (paths["von"] / "marker_calibration.json").exists():
        print(f"building {size} von in {paths['von']}", file=sys.stderr)
        build_von_checkpoint(paths["von"], independent_options=False, size=size)
    return paths


def export(revision: str, cache: Path) -> Path:
    """`revision`'s service as an installed package would lay it out (providers/ and bundles/
    inside decidealot/); put first on PYTHONPATH, it wins over this checkout's editable
    install, entry points included (they name modules, which resolve through the path)."""
    target = cache / f"tree-{revision}"
    if (target / "decidealot" / "providers").exists():
        return target
    source = cache / f"src-{revision}"
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "decidealot", "providers", "bundles"],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryFile() as file:
        file.write(archive)
        file.seek(0)
        with tarfile.open(fileobj=file) as tar:
            tar.extractall(source, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source / "decidealot", target / "decidealot")
    shutil.copytree(source / "providers", target / "decidealot" / "providers")
    shutil.copytree(source / "bundles", target / "decidealot" / "bundles")
    return target


@dataclass
class Tree:
    name: str
    path: Path | None
    """Put first on PYTHONPATH; None: this checkout."""

    def env(self) -> dict[str, str]:
        if self.path is None:
            return {}
        rest = os.environ.get("PYTHONPATH", "")
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(self.path), rest]))}

    def worker(self) -> str:
        """The module holding `build_engine` in this tree (BEFORE's: providers/worker/host.py)."""
        providers = (
            ROOT / "providers" if self.path is None else self.path / "decidealot" / "providers"
        )
        for module in ("engine/proc", "worker/process", "worker/host"):
            if (providers / f"{module}.py").exists():
                return "decidealot.providers." + module.replace("/", ".")
        raise RuntimeError(f"{self.name}: no worker module under {providers}")


def serve_env(paths: dict[str, Path], port: int, tree: Tree) -> dict[str, str]:
    return {
        **tree.env(),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DECIDEALOT_PORT": str(port),
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_TORCH_THREADS": "1",
        "DECIDEALOT_MAX_RESIDENT_PROVIDERS": "1",
        "DECIDEALOT_LOG_FORMAT": "json",
        "DECIDEALOT_PROVIDER_TIMEOUT_SECONDS": "900",
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": str(paths["english"]),
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT": str(paths["multilingual"]),
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT": str(paths["typed-decisions"]),
        "DECIDEALOT_VON_CHECKPOINT": str(paths["von"]),
    }


@dataclass
class Server:
    tree: Tree
    url: str
    pid: int
    log: Path


@contextlib.contextmanager
def running(tree: Tree, paths: dict[str, Path], logs: Path, tag: str) -> Iterator[Server]:
    port = free_port()
    log = logs / f"{tree.name}-{tag}.log"
    with server(
        [python(), "-m", "decidealot", "serve"],
        port=port,
        env=serve_env(paths, port, tree),
        log_path=log,
        timeout=120,
    ) as url:
        yield Server(tree, url, gateway_pid(port), log)


def gateway_pid(port: int) -> int:
    """The process listening on `port` (the gateway), from /proc."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inode = fields[9]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
    raise RuntimeError(f"nothing listens on port {port}")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def rss(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def service_memory(gateway: int) -> int:
    return rss(gateway) + sum(rss(pid) for pid in children(gateway))


# -- traffic --------------------------------------------------------------------------------


LIGHT = {"category": QUESTIONS["category"]}
"""One choice (one row; a zero-shot noul would add Von's debias row, whose logits a model keeps
after its first use): on base-shaped checkpoints a decision that costs little next to a load."""


def body(model: str, index: int, questions: dict[str, object] = QUESTIONS) -> bytes:
    state = (
        f"Ticket {index}: the customer was charged twice this month and asks whether the "
        "duplicate payment can be refunded to the original card."
    )
    return json.dumps({"model": model, "state": state, "questions": questions}).encode()


def decide(url: str, model: str, index: int = 0, questions: dict[str, object] = QUESTIONS) -> float:
    """Seconds one decision took; raises unless it answered 200."""
    started = time.perf_counter()
    content = body(model, index, questions)
    response = httpx.post(url + "/v1/systemone", content=content, timeout=900)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"decision failed: {response.status_code} {response.text[:200]}")
    return seconds


@dataclass
class Point:
    server: str
    clients: int
    every: int
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    first_after_switch: list[float]
    """Latency of each block's first request (a switch's first decision at one client)."""
    switches: list[float]
    """Per change of the answering model: the old model's last answer to the new one's first."""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


async def _alternate(url: str, clients: int, every: int, total: int) -> tuple[dict, int, float]:
    """Closed loop: request k asks MODELS[(k // every) % 2]; each client sends the next k.
    (k -> (sent, answered)), errors, elapsed seconds."""
    times: dict[int, tuple[float, float]] = {}
    errors = 0
    counter = 0

    async def client() -> None:
        nonlocal counter, errors
        connection = RawConnection(url + "/v1/systemone")
        try:
            while counter < total:
                k = counter
                counter += 1
                started = time.perf_counter()
                status = await connection.call(body(MODELS[(k // every) % 2], k))
                times[k] = (started, time.perf_counter())
                errors += status != 200
        finally:
            connection.close()

    begun = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return times, errors, time.perf_counter() - begun


def alternate(srv: Server, clients: int, every: int, blocks: int) -> Point:
    decide(srv.url, MODELS[0])  # the first block's model is resident: every block is a switch
    total = every * blocks
    times, errors, elapsed = asyncio.run(_alternate(srv.url, clients, every, total))
    # With one slot, answers of one model never overlap another's: each change of model in the
    # order answers arrive is a switch the server made (a request that reached the server
    # after the next block's first, by microseconds, makes one more).
    answered = sorted((end, MODELS[(k // every) % 2]) for k, (_, end) in times.items())
    switches = [
        later - earlier
        for (earlier, before), (later, after) in itertools.pairwise(answered)
        if before != after
    ]
    return Point(
        srv.tree.name,
        clients,
        every,
        total,
        errors,
        elapsed,
        [times[k][1] - times[k][0] for k in range(total)],
        [times[k][1] - times[k][0] for k in range(every, total, every)],
        switches,
    )


def torch_import_seconds() -> float:
    """What `import torch` alone takes in a fresh interpreter now (its import, not the
    interpreter's start or exit)."""
    script = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    out = subprocess.run([python(), "-P", "-c", script], check=True, capture_output=True, text=True)
    return float(out.stdout)


def first_decisions(tree: Tree, paths: dict[str, Path], logs: Path, rounds: int) -> dict:
    """Per round, a fresh server: its first Laya decision, then unload and the next one; the
    service's memory before the first load and after the unload; and, just before, what
    `import torch` alone takes (on a shared machine it moves from minute to minute)."""
    after_start, after_unload, memory, torch_alone = [], [], [], []
    for round_ in range(rounds):
        torch_alone.append(torch_import_seconds())
        with running(tree, paths, logs, f"first{round_}") as srv:
            httpx.get(srv.url + "/v1/models", timeout=30)
            before = service_memory(srv.pid)
            after_start.append(decide(srv.url, "laya-english"))
            worker = children(srv.pid)
            loaded = service_memory(srv.pid)
            httpx.post(srv.url + "/v1/models/unload", timeout=60).raise_for_status()
            time.sleep(0.3)
            memory.append((before, loaded, service_memory(srv.pid), len(children(srv.pid))))
            after_unload.append(decide(srv.url, "laya-english"))
            assert worker, "no worker after a local decision"
    return {
        "after_start": after_start,
        "after_unload": after_unload,
        "memory": memory,
        "torch": torch_alone,
    }


# -- base-shaped checkpoints: load time, switch time -------------------------------------------

_PEAK = """
def peak():
    # VmHWM: this process's own high-water mark (ru_maxrss carries the parent's across exec)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
"""

_LOAD_SCRIPT = (
    _PEAK
    + """
import importlib, json, sys, time
import torch
torch.set_num_threads(1)
from decidealot.jobs import EngineSpec
factory, key, path, worker = sys.argv[1:5]
worker = importlib.import_module(worker)
def build_engine(spec):
    if worker.__name__ != "decidealot.providers.engine.proc":
        return worker.build_engine(spec)  # a tree before providers/engine
    from decidealot.providers.engine.protocol import ignore_load
    return worker.build_engine(spec, ignore_load)
spec = EngineSpec(factory, {key: path}, [key], torch_threads=1)
# the imports, outside the clock
build_engine(EngineSpec(factory, {key: path}, [], torch_threads=1))
started = time.perf_counter()
build_engine(spec)
print(json.dumps({"seconds": time.perf_counter() - started,
                  "peak": peak()}))
"""
)

ENGINES = {
    "laya-english": ("decidealot.providers.laya.worker.engine:create", "english", "english"),
    "von": ("decidealot.providers.von.worker.engine:create", "von-1.1", "von"),
}


def load_time(tree: Tree, paths: dict[str, Path], model: str) -> dict[str, float]:
    """The checkpoint's own load: building `model`'s engine in a process that has already
    imported everything (page cache warm)."""
    factory, key, folder = ENGINES[model]
    out = subprocess.run(
        [python(), "-P", "-c", _LOAD_SCRIPT, factory, key, str(paths[folder]), tree.worker()],
        env={**os.environ, **tree.env(), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def base_switches(srv: Server, switches: int) -> dict[str, dict[str, list[float]]]:
    """`switches` turns, alternating the model, of one-question decisions (`LIGHT`): per model, the
    first decision after each switch to it, the two warm decisions after that one, and the
    worker's resident bytes then."""
    found: dict[str, dict[str, list[float]]] = {
        m: {"first": [], "warm": [], "rss": []} for m in MODELS
    }
    decide(srv.url, MODELS[0], 0, LIGHT)
    for turn in range(1, switches + 1):
        model = MODELS[turn % 2]
        found[model]["first"].append(decide(srv.url, model, 3 * turn, LIGHT))
        found[model]["rss"].append(sum(rss(pid) for pid in children(srv.pid)))
        found[model]["warm"] += [decide(srv.url, model, 3 * turn + i, LIGHT) for i in (1, 2)]
    return found


# -- candidates -------------------------------------------------------------------------------

_IMPORT_SCRIPT = (
    _PEAK
    + """
import importlib, json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
importlib.import_module(sys.argv[2])
importlib.import_module(sys.argv[1])
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                  "rss": peak(), "transformers": "transformers" in sys.modules}))
"""
)

_SPARE_SCRIPT = (
    _PEAK
    + """
import json, time
cpu = time.process_time()
import torch, decidealot.providers.engine.proc
import decidealot.providers.laya.worker.engine, decidealot.providers.von.worker.engine
print(json.dumps({"cpu": time.process_time() - cpu, "rss": peak()}))
"""
)

_BUILD_SCRIPT = (
    _PEAK
    + """
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from decidealot.providers.worker import modernbert
from decidealot.providers.laya.worker.model import read_safetensors
mode, folder = sys.argv[1], Path(sys.argv[2])
config = modernbert.Config.read(folder / "encoder" / "config.json")
weights = folder / "model.safetensors"
started = time.perf_counter()
if mode == "meta":
    with torch.device("meta"):
        model = modernbert.ModernBert(config)
elif mode == "cpu-init":
    model = modernbert.ModernBert(config)
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            torch.nn.init.normal_(module.weight)
elif mode == "load_file":
    from safetensors.torch import load_file
    state = {k: v.float() for k, v in load_file(str(weights)).items()}
elif mode == "mmap":
    state = read_safetensors(weights, torch.float32)
print(json.dumps({"seconds": time.perf_counter() - started, "peak": peak()}))
"""
)


def run_json(script: str, *args: str, tree: Tree | None = None) -> dict[str, float]:
    out = subprocess.run(
        [python(), "-P", "-c", script, *args],
        env={**os.environ, **(tree.env() if tree else {}), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def candidates(trees: list[Tree], base: dict[str, Path] | None, rounds: int) -> list[str]:
    lines = [
        "\n### Imports a worker pays for (median of "
        f"{rounds}; `import` of the engine module in a fresh `python -P`)\n",
        "| tree | engine | wall s | CPU s | peak RSS MB | imports transformers |",
        "|---|---|---:|---:|---:|---|",
    ]
    for tree in trees:
        for model, (factory, _, _) in ENGINES.items():
            runs = [
                run_json(_IMPORT_SCRIPT, factory.split(":")[0], tree.worker(), tree=tree)
                for _ in range(rounds)
            ]
            lines.append(
                f"| {tree.name} | {model} | {med(r['wall'] for r in runs):.2f} | "
                f"{med(r['cpu'] for r in runs):.2f} | {med(r['rss'] for r in runs) / 1e6:.0f} | "
                f"{'yes' if runs[0]['transformers'] else 'no'} |"
            )
    spare = [run_json(_SPARE_SCRIPT) for _ in range(rounds)]
    lines += [
        "",
        "A spare interpreter (torch and both engines imported, no model) would cost "
        f"**{med(r['rss'] for r in spare) / 1e6:.0f} MB** resident while any local provider is, "
        f"and **{med(r['cpu'] for r in spare):.2f} s** of CPU to refill after every switch.",
    ]
    if base is not None:
        lines += [
            "\n### Building and reading the base Laya checkpoint (median of "
            f"{rounds}; fresh process each)\n",
            "| step | how | seconds | peak RSS MB |",
            "|---|---|---:|---:|",
        ]
        for mode, step, how in (
            ("cpu-init", "build", "on the CPU, random init (what no meta device costs)"),
            ("meta", "build", "on the meta device (kept)"),
            ("load_file", "read", "`safetensors.load_file` then `.float()`"),
            ("mmap", "read", "from a memory map, a tensor at a time (kept)"),
        ):
            runs = [run_json(_BUILD_SCRIPT, mode, str(base["english"])) for _ in range(rounds)]
            lines.append(
                f"| {step} | {how} | {med(r['seconds'] for r in runs):.3f} | "
                f"{med(r['peak'] for r in runs) / 1e6:.0f} |"
            )
    return lines


# -- report -------------------------------------------------------------------------------------


def med(values: object) -> float:
    items = list(values)  # type: ignore[call-overload]
    return statistics.median(items) if items else float("nan")


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{med(values):.2f} / {_percentile(sorted(values), 90):.2f} / {max(values):.2f}"


def point_table(points: list[Point]) -> list[str]:
    lines = [
        "| server | clients | switch every | requests | errors | decisions/s | p50 ms | p99 ms "
        "| switches | switch s (median / p90 / max) | first decision after a switch s (median) "
        "| decisions/s after / before |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    by_key = {(p.server, p.clients, p.every): p for p in points}
    for p in points:
        ms = sorted(x * 1000 for x in p.latencies)
        before = by_key.get(("before", p.clients, p.every))
        ratio = f"{p.rps / before.rps:.2f}x" if before and p.server != "before" else "-"
        first = f"{med(p.first_after_switch):.2f}" if p.clients == 1 else "-"
        lines.append(
            f"| {p.server} | {p.clients} | {p.every} | {p.requests} | {p.errors} | {p.rps:.2f} | "
            f"{_percentile(ms, 50):.0f} | {_percentile(ms, 99):.0f} | {len(p.switches)} | "
            f"{spread(p.switches)} | {first} | {ratio} |"
        )
    return lines


def plot(points: list[Point], firsts: dict[str, dict], base: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if base else 2
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2))
    colours = {"before": "#c44e52", "after": "#4c72b0"}
    names = [name for name in ("before", "after") if any(p.server == name for p in points)]
    switch_times = [[s for p in points if p.server == name for s in p.switches] for name in names]
    axis = axes[0]
    parts = axis.boxplot(switch_times, tick_labels=names, patch_artist=True, widths=0.5)
    for patch, name in zip(parts["boxes"], names, strict=True):
        patch.set_facecolor(colours[name])
        patch.set_alpha(0.35)
    for i, values in enumerate(switch_times, start=1):
        offsets = [i + 0.18 * ((k % 7) - 3) / 3 for k in range(len(values))]
        axis.scatter(offsets, values, s=8, color=colours[names[i - 1]], alpha=0.7)
    axis.set_yscale("log")
    axis.set_ylabel("seconds (log)")
    axis.set_title("Switch time, tiny checkpoints\n(old model's last answer to new one's first)")
    axis.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    axis = axes[1]
    kinds = ("after_start", "after_unload")
    for j, name in enumerate(names):
        values = [med(firsts[name][kind]) for kind in kinds]
        axis.bar(
            [k + 0.38 * j for k in range(len(kinds))],
            values,
            0.36,
            label=name,
            color=colours[name],
            alpha=0.8,
        )
    axis.set_xticks([k + 0.19 for k in range(len(kinds))], ["after start", "after unload"])
    axis.axhline(2.5, color="grey", linestyle=":", linewidth=1)
    axis.set_ylabel("seconds")
    axis.set_title("First laya-english decision\n(median, tiny checkpoints)")
    axis.legend()
    if base:
        axis = axes[2]
        base_names = [name for name in names if name in base]
        parts = axis.boxplot(
            [base[n] for n in base_names], tick_labels=base_names, patch_artist=True, widths=0.5
        )
        for patch, name in zip(parts["boxes"], base_names, strict=True):
            patch.set_facecolor(colours[name])
            patch.set_alpha(0.35)
        axis.set_ylabel("seconds")
        axis.set_title("What a switch adds to a decision,\nbase-shaped checkpoints (first - warm)")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=110)
    print(f"plot: {PLOT.relative_to(ROOT)}", file=sys.stderr)


PARTS = ("alternate", "first", "base", "candidates")


def measure(
    part: str, args: argparse.Namespace, trees: list[Tree], logs: Path
) -> list | dict | None:
    """One part's results, as JSON-able data."""
    tiny = checkpoints(args.cache, "tiny")
    rounds = args.rounds or (2 if args.quick else 3)
    if part == "alternate":
        clients = [int(n) for n in (args.clients or ("1" if args.quick else "1,8")).split(",")]
        everies = [
            int(n) for n in (args.every or ("1,10" if args.quick else "1,10,100")).split(",")
        ]
        blocks = {1: 9 if args.quick else 13, 10: 5 if args.quick else 7, 100: 4}
        points: list[Point] = []
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(running(t, tiny, logs, "load")) for t in trees]
            for n_clients in clients:
                for every in everies:
                    order = servers if len(points) % 4 == 0 else servers[::-1]
                    for srv in order:
                        print(
                            f"{srv.tree.name}: {n_clients} clients, every {every}", file=sys.stderr
                        )
                        points.append(alternate(srv, n_clients, every, blocks.get(every, 5)))
        points.sort(key=lambda p: (p.clients, p.every, p.server != "before"))
        return [asdict(p) for p in points]
    if part == "first":
        return {t.name: first_decisions(t, tiny, logs, rounds) for t in trees}
    if part == "base":
        if args.quick:
            return None
        base = checkpoints(args.cache, "base")
        found = {}
        for tree in trees:
            loads = {m: [load_time(tree, base, m) for _ in range(3)] for m in MODELS}
            with running(tree, base, logs, "base") as srv:
                found[tree.name] = {
                    "loads": loads,
                    "switches": base_switches(srv, 6 if tree.name == "after" else 4),
                }
        return found
    base_folder = None if args.quick else checkpoints(args.cache, "base")
    return candidates(trees, base_folder, rounds)


def render(results: dict, header: str) -> tuple[list[str], dict[str, list[float]]]:
    """The report's tables, and per server what a switch adds on base (for the plot)."""
    report = [header]
    points = [Point(**p) for p in results.get("alternate") or []]
    if points:
        report += ["\n### Alternating laya-english and von, tiny checkpoints\n"]
        report += point_table(points)
    firsts = results.get("first") or {}
    if firsts:
        rounds = len(next(iter(firsts.values()))["after_start"])
        report += [
            f"\n### First decision after start and after unload (tiny; {rounds} fresh servers "
            "each)\n",
            "| server | after start s (each) | after unload s (each) | `import torch` alone s, "
            "just before (each) | after start less torch s (median) | service MB before first "
            "load / loaded / after unload | workers after unload |",
            "|---|---|---|---|---:|---|---:|",
        ]
    for name, found in firsts.items():
        memory = found["memory"]
        beyond = [a - t for a, t in zip(found["after_start"], found["torch"], strict=True)]
        report.append(
            f"| {name} | {', '.join(f'{s:.2f}' for s in found['after_start'])} | "
            f"{', '.join(f'{s:.2f}' for s in found['after_unload'])} | "
            f"{', '.join(f'{s:.2f}' for s in found['torch'])} | {med(beyond):.2f} | "
            + ", ".join(f"{b / 1e6:.0f} / {m / 1e6:.0f} / {a / 1e6:.0f}" for b, m, a, _ in memory)
            + f" | {max(m[3] for m in memory)} |"
        )
    base_switch: dict[str, list[float]] = {}
    base = results.get("base") or {}
    if base:
        report += [
            "\n### Base-shaped checkpoints: the checkpoint's own load against a switch\n",
            "ModernBERT-base's shape for both (hidden 768, 22 layers, 50,368-row embeddings; "
            "Laya's weights fp16 on disk, Von's fp32). Load: building the engine in a process "
            "that already imported everything, page cache warm (median of 3). Switch: "
            "alternating turns of three one-choice decisions at one client (a short ticket; the "
            "pass is small next to a load); `switch adds` is a turn's first decision less its "
            "warm ones.\n",
            "| server | model | own load s | load peak RSS MB | first decision after a switch s "
            "(median) | warm decision s | switch adds s (median / max) | target: load + 0.5 s "
            "| worker RSS MB after the switch (min-max) |",
            "|---|---|---:|---:|---:|---:|---|---:|---|",
        ]
    for name, found in base.items():
        base_switch[name] = []
        for model in MODELS:
            loads, turns = found["loads"][model], found["switches"][model]
            load, warm = med(r["seconds"] for r in loads), med(turns["warm"])
            adds = [first - warm for first in turns["first"]]
            base_switch[name] += adds
            report.append(
                f"| {name} | {model} | {load:.2f} | {med(r['peak'] for r in loads) / 1e6:.0f} | "
                f"{med(turns['first']):.2f} | {warm:.2f} | {med(adds):.2f} / {max(adds):.2f} | "
                f"{load + 0.5:.2f} | {min(turns['rss']) / 1e6:.0f}-{max(turns['rss']) / 1e6:.0f} |"
            )
    report += results.get("candidates") or []
    return report, base_switch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer points, no base checkpoints")
    parser.add_argument("--before", default=BEFORE, help="git revision of the `before` server")
    parser.add_argument("--clients", default=None, help="comma list (default 1,8)")
    parser.add_argument("--every", default=None, help="comma list of N (default 1,10,100)")
    parser.add_argument("--rounds", type=int, default=None, help="first-decision rounds")
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma list of the parts to measure; the others are read from the last run's "
        "results in --cache, so tables and plot always show every part",
    )
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-switch"))
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    logs = args.cache / "logs"
    logs.mkdir(exist_ok=True)
    saved = args.cache / "results.json"
    results = json.loads(saved.read_text()) if saved.exists() else {}
    trees = [Tree("before", export(args.before, args.cache)), Tree("after", None)]
    for part in args.parts.split(","):
        if part not in PARTS:
            parser.error(f"--parts: unknown part {part!r}; expected some of {', '.join(PARTS)}")
        results[part] = measure(part, args, trees, logs)
        saved.write_text(json.dumps(results))
    header = (
        f"CPU: {cpu_model()}, {os.cpu_count()} cores. One torch thread, CPU, one resident slot, "
        f"both servers up at once. `before` = {args.before}, `after` = this checkout. "
        f"Command: `{' '.join(['bench/switch.py', *sys.argv[1:]])}`"
    )
    report, base_switch = render(results, header)
    print("\n".join(report))
    if not args.no_plot:
        plot(
            [Point(**p) for p in results.get("alternate") or []],
            results.get("first") or {},
            base_switch,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
