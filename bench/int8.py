"""int8 against fp32 in the worker, side by side in one run: memory, speed and agreement.

For each model, `decidealot serve` runs twice at once on the same checkpoint, with
DECIDEALOT_PRECISION=fp32 and =int8 (one torch thread per pass, defaults otherwise). Models: a
Laya base-shaped english checkpoint (ModernBERT-base's width, 768, but 4 layers, and
ModernBERT's own initializer range, 0.02, where the int8 probe keeps every layer int8) and
Von `small` (bench/von.py). Measured, in two parts kept in CACHE/results.json (so either can
be rerun alone and the table and plot redrawn from both):

- `load`: each precision's worker started on its own with the checkpoint preloaded, its
  resident memory right after load (VmRSS) and the anonymous part of it (`RssAnon`: weights
  and heap, without the file-backed pages of library code, which the int8 probe pages in and
  an fp32 worker pages in on its first pass);
- `serve`: both servers side by side; per server the first decision's seconds (the load, and
  for int8 the probe), the worker's memory after it and after the load runs, the share of
  linear layers that run int8 (`decidealot_int8_linear_share`), decisions/s, p50/p99 and server
  CPU per decision at 1 and 8 clients (the servers take turns per point), and max |dp| of int8
  against fp32 over the same requests.

What int8 saves is set against the fp32 bytes of the layers it quantised (the target: at least
60% of them). The table is printed as markdown; the plot goes to docs/int8.png.

    .venv/bin/python bench/int8.py --quick   # one request per client and point, 4 for |dp|
    .venv/bin/python bench/int8.py           # 10 s per point, 16 requests for |dp|
    .venv/bin/python bench/int8.py --parts load   # redo the memory after load only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import ROOT, free_port, process_tree, server_root
from bench.peers import answers, body, decidealot, http_peer, load_points
from bench.workload import sized_states
from decidealot.jobs import EngineSpec

LAYA_SHAPE = {"num_hidden_layers": 4}
"""On top of ModernBERT-base's shape (`size="base"`): four layers, as the issue measured."""
PRECISIONS = ("fp32", "int8")
LAYA = "decidealot.providers.laya.worker.engine:create"
VON = "decidealot.providers.von.worker.engine:create"


def _sides() -> dict[str, Side]:
    return {p: Side() for p in PRECISIONS}


@dataclass
class Side:
    """One server's measurements (`serve`), and its worker's memory right after a preloaded
    load (`load`)."""

    loaded_rss_mb: float = float("nan")
    loaded_anon_mb: float = float("nan")
    first_decision_s: float = 0.0
    rss_mb: float = 0.0
    anon_mb: float = 0.0
    rss_after_runs_mb: float = 0.0
    share: float = float("nan")
    rps: dict[int, float] = field(default_factory=dict)
    p50: dict[int, float] = field(default_factory=dict)
    p99: dict[int, float] = field(default_factory=dict)
    cpu_ms: dict[int, float] = field(default_factory=dict)


async def _after_load(spec: EngineSpec) -> tuple[float, float]:
    from decidealot import registry
    from decidealot.providers.engine.client import ProcessRuntime

    settings = registry.settings(device="cpu", torch_threads=1, provider_start_timeout_seconds=3600)
    runtime = ProcessRuntime("bench", spec, settings)
    await runtime.load()
    try:
        return worker_memory(os.getpid())
    finally:
        await runtime.unload()


def after_load(factory: str, key: str, folder: Path, side: dict[str, Side]) -> None:
    """Each precision's worker memory right after it loaded `folder` (preloaded, so the
    probe has run for int8 and no pass for fp32): what the load itself holds."""
    for p in PRECISIONS:
        spec = EngineSpec(factory, {key: str(folder)}, preload=[key], options={"precision": p})
        side[p].loaded_rss_mb, side[p].loaded_anon_mb = asyncio.run(_after_load(spec))
        print(
            f"  {p} after load: {side[p].loaded_rss_mb:.0f} MB "
            f"({side[p].loaded_anon_mb:.0f} MB anonymous)",
            file=sys.stderr,
        )


@dataclass
class Section:
    name: str
    quantised_mb: float
    """fp32 bytes of the encoder's linear weights (what int8 quantises when it keeps none)."""
    sides: dict[str, Side]
    max_dp: float = 0.0
    requests: int = 0


def _zero(_: int) -> str:
    return "Ticket 0:"


def linear_mb(config: Path) -> float:
    """fp32 MB of a ModernBERT encoder's linear weights (Wqkv, Wo, Wi, mlp Wo)."""
    shape = json.loads(config.read_text())
    h, inner, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    return 4 * layers * (h * 3 * h + h * h + h * 2 * inner + inner * h) / 1e6


def _memory(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of process `pid` in MB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    status = dict(line.split(":", 1) for line in lines)
    return int(status["VmRSS"].split()[0]) / 1e3, int(status["RssAnon"].split()[0]) / 1e3


def worker_memory(server: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) in MB of the worker under server process `server`."""
    for pid in process_tree(server)[1:]:
        try:
            if b"decidealot.providers.engine" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return _memory(pid)
        except OSError:
            continue
    raise RuntimeError(f"no worker under server {server}")


def int8_share(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("decidealot_int8_linear_share{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def max_dp(fp32: list[dict], int8: list[dict]) -> float:
    """Largest |dp| over every probability (noul: P(true)) of the same requests."""
    moved = 0.0
    for ours, theirs in zip(fp32, int8, strict=True):
        for name, answer in ours.items():
            other = theirs[name]
            if "noul" in answer:
                moved = max(moved, abs(answer["noul"] - other["noul"]))
            else:
                for label, p in answer["probabilities"].items():
                    moved = max(moved, abs(p - other["probabilities"][label]))
    return moved


def serve(
    section: Section,
    model: str,
    provider_env: dict[str, str],
    tokenizer: Path,
    args: argparse.Namespace,
) -> None:
    """Both servers side by side: first decision, memory, load points, |dp|."""
    name = section.name
    states = [s.removeprefix("Ticket 0:") for s in sized_states(tokenizer, 256, _zero)]
    ports = {p: free_port() for p in PRECISIONS}
    with ExitStack() as stack:
        urls = {
            p: stack.enter_context(
                decidealot(f"int8-{name}-{p}", ports[p], p, provider_env, args.logs)
            )
            for p in PRECISIONS
        }
        roots = {p: server_root(str(ports[p])) for p in PRECISIONS}
        for p in PRECISIONS:
            side = section.sides[p]
            began = time.perf_counter()
            response = httpx.post(
                urls[p] + "/v1/systemone", content=body(model, states[0]), timeout=1800
            )
            response.raise_for_status()
            side.first_decision_s = time.perf_counter() - began
            side.rss_mb, side.anon_mb = worker_memory(roots[p])
            side.share = int8_share(urls[p])
            print(
                f"  {name} {p}: first decision {side.first_decision_s:.1f} s, worker "
                f"{side.rss_mb:.0f} MB ({side.anon_mb:.0f} MB anonymous), int8 share "
                f"{side.share:g}",
                file=sys.stderr,
            )
        peers = {
            p: http_peer(p, urls[p] + "/v1/systemone", model, roots[p], states) for p in PRECISIONS
        }
        results, cpu_ms = load_points(peers, args.clients, args.seconds)
        for result in results:
            side = section.sides[result.name]
            side.rps[result.clients] = result.rps
            side.p50[result.clients] = result.p50_ms
            side.p99[result.clients] = result.p99_ms
            side.cpu_ms[result.clients] = cpu_ms[(result.name, result.clients)]
        for p in PRECISIONS:
            section.sides[p].rss_after_runs_mb = worker_memory(roots[p])[0]
        quality = [f"Quality {i}:" + states[i] for i in range(args.quality)]
        got = {p: answers(urls[p] + "/v1/systemone", model, quality) for p in PRECISIONS}
        section.max_dp, section.requests = max_dp(got["fp32"], got["int8"]), len(quality)


def load_results(path: Path) -> dict[str, Section]:
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    out = {}
    for name, data in raw.items():
        sides = {}
        for p, side in data.pop("sides").items():
            for key in ("rps", "p50", "p99", "cpu_ms"):
                side[key] = {int(n): v for n, v in side[key].items()}
            sides[p] = Side(**side)
        out[name] = Section(sides=sides, **data)
    return out


def markdown(sections: list[Section], clients: list[int]) -> str:
    head = (
        "| checkpoint | precision | int8 share | after load: RSS MB | anonymous MB "
        "| first decision s | after it: RSS MB | anonymous MB | after the runs: RSS MB | "
        + " | ".join(f"dec/s {n} | CPU ms/dec {n}" for n in clients)
        + " |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * len(clients)]
    notes = []
    for section in sections:
        for p, side in section.sides.items():
            points = " | ".join(f"{side.rps[n]:.2f} | {side.cpu_ms[n]:.0f}" for n in clients)
            lines.append(
                f"| {section.name} | {p} | {side.share:g} | {side.loaded_rss_mb:.0f} "
                f"| {side.loaded_anon_mb:.0f} | {side.first_decision_s:.1f} "
                f"| {side.rss_mb:.0f} | {side.anon_mb:.0f} | {side.rss_after_runs_mb:.0f} "
                f"| {points} |"
            )
        fp32, int8 = section.sides["fp32"], section.sides["int8"]
        quantised = section.quantised_mb * int8.share
        target = 0.6 * quantised
        loaded = fp32.loaded_rss_mb - int8.loaded_rss_mb
        loaded_anon = fp32.loaded_anon_mb - int8.loaded_anon_mb
        first = fp32.rss_mb - int8.rss_mb
        runs = fp32.rss_after_runs_mb - int8.rss_after_runs_mb
        speed = ", ".join(f"{int8.rps[n] / fp32.rps[n]:.2f}x at {n}" for n in clients)
        notes.append(
            f"- {section.name}: int8 quantised {quantised:.0f} MB of fp32 linear weights (the "
            f"target: its worker {target:.0f} MB below fp32's). fp32 minus int8: after load "
            f"**{loaded:.0f} MB** ({loaded_anon:.0f} MB anonymous, {loaded_anon / quantised:.0%}"
            f" of the quantised bytes), after the first decision {first:.0f} MB, after the "
            f"runs {runs:.0f} MB. int8 decisions/s against fp32: {speed}. Max |dp| "
            f"{section.max_dp:.4f} over {section.requests} requests."
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def plot(sections: list[Section], clients: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    names = [s.name for s in sections]
    width = 0.38
    colours = {"fp32": "#4c72b0", "int8": "#dd8452"}
    for k, p in enumerate(PRECISIONS):
        offset = (k - 0.5) * width
        xs = [i + offset for i in range(len(sections))]
        loaded = [s.sides[p].loaded_anon_mb for s in sections]
        axes[0].bar(xs, loaded, width, label=f"{p}, after load", color=colours[p])
        first = [s.sides[p].anon_mb for s in sections]
        axes[0].scatter(xs, first, color="black", marker="_", s=400, zorder=3)
        for c, n in enumerate(clients):
            speed = [s.sides[p].rps[n] / s.sides["fp32"].rps[n] for s in sections]
            xs_n = [i * (len(clients) + 1) + c + offset for i in range(len(sections))]
            axes[1].bar(xs_n, speed, width, color=colours[p], label=p if c == 0 else None)
    axes[0].set_xticks(range(len(sections)), names)
    axes[0].set_ylabel("worker RssAnon MB (line: after 1st decision)")
    axes[0].legend()
    ticks = [i * (len(clients) + 1) + c for i in range(len(sections)) for c in range(len(clients))]
    labels = [f"{s.name}\n{n} client{'s' if n > 1 else ''}" for s in sections for n in clients]
    axes[1].set_xticks(ticks, labels, fontsize=7)
    axes[1].set_ylabel("decisions/s against fp32")
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    axes[1].legend()
    axes[2].bar(names, [s.max_dp for s in sections], color=colours["int8"])
    axes[2].set_ylabel("max |dp|, int8 against fp32")
    figure.suptitle("DECIDEALOT_PRECISION=int8 against fp32 (bench/int8.py)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one decision per client a point")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quality", type=int, default=16, help="requests compared for |dp|")
    parser.add_argument("--clients", type=lambda s: [int(n) for n in s.split(",")], default=[1, 8])
    parser.add_argument("--sections", default="laya,von")
    parser.add_argument(
        "--parts",
        default="load,serve",
        help="load: worker memory right after a preloaded load; serve: the servers side by "
        "side. Results are kept in CACHE/results.json, so a part can be rerun alone.",
    )
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-int8"))
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "int8.png")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.quality = 0.1, 4  # each client's first request only
    args.logs = args.cache / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    results = args.cache / "results.json"
    sections = load_results(results)
    parts = args.parts.split(",")
    if "laya" in args.sections:
        from bench.laya import VARIANTS
        from decidealot.providers.laya.tiny import build_laya_checkpoint

        folder = args.cache / "laya-base-4"
        for variant in VARIANTS:
            size, shape = ("base", LAYA_SHAPE) if variant == "english" else ("tiny", None)
            if not (folder / variant / "rl_agent_config.json").exists():
                build_laya_checkpoint(folder / variant, variant, size=size, shape=shape)
        english = folder / "english"
        section = sections.setdefault(
            "Laya base-4",
            Section("Laya base-4", linear_mb(english / "encoder" / "config.json"), _sides()),
        )
        if "load" in parts:
            after_load(LAYA, "english", english, section.sides)
        if "serve" in parts:
            env = {"DECIDEALOT_VON_ENABLED": "false"}
            env |= {
                f"DECIDEALOT_LAYA_{v.upper().replace('-', '_')}_CHECKPOINT": str(folder / v)
                for v in VARIANTS
            }
            serve(section, "laya-english", env, english / "tokenizer" / "tokenizer.json", args)
        results.write_text(json.dumps({n: asdict(s) for n, s in sections.items()}, indent=1))
    if "von" in args.sections:
        from bench.von import build_checkpoint

        checkpoint = build_checkpoint(args.cache / "von", "small", "plain")
        section = sections.setdefault(
            "Von small", Section("Von small", linear_mb(checkpoint / "config.json"), _sides())
        )
        if "load" in parts:
            after_load(VON, "von-1.1", checkpoint, section.sides)
        if "serve" in parts:
            env = {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_VON_CHECKPOINT": str(checkpoint)}
            serve(section, "von-1.1", env, checkpoint / "tokenizer.json", args)
        results.write_text(json.dumps({n: asdict(s) for n, s in sections.items()}, indent=1))
    sections = {n: s for n, s in sections.items() if s.sides["fp32"].rps}
    print(markdown(list(sections.values()), args.clients))
    plot(list(sections.values()), args.clients, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
