"""int8 against fp32 in the worker, side by side in one run: memory, speed and agreement.

For each model, `decidealot serve` runs twice at once on the same checkpoint, with
DECIDEALOT_PRECISION=fp32 and =int8 (one torch thread per pass, defaults otherwise). Models: a
Laya base-shaped english checkpoint (ModernBERT-base's width, 768, but 4 layers, and
ModernBERT's own initializer range, 0.02, where the int8 probe keeps every layer int8) and
Von `small` (bench/von.py). Reported per server: the worker's resident memory after its first
decision (the checkpoint loaded, one pass run: both workers have then paged in the same
library code) and its anonymous part (`RssAnon`: weights and heap), the share of linear
layers that run int8 (`decidealot_int8_linear_share`), the first decision's seconds (the
load, and for int8 the probe), decisions/s, p50/p99 and server CPU per decision at 1 and 8
clients (the two servers take turns per point), the worker's memory after those runs, and
max |dp| of int8 against fp32 over the same requests. What int8 saves is set against the
fp32 bytes of the layers it quantised (the target: at least 60% of them). The table is
printed as markdown; the plot goes to docs/int8.png.

    .venv/bin/python bench/int8.py --quick   # a few decisions per point (minutes on AVX2)
    .venv/bin/python bench/int8.py           # 10 s per point, 16 requests for |dp|
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import ROOT, free_port, process_tree, server_root
from bench.peers import answers, body, decidealot, http_peer, load_points
from bench.workload import sized_states

LAYA_SHAPE = {"num_hidden_layers": 4}
"""On top of ModernBERT-base's shape (`size="base"`): four layers, as the issue measured."""
PRECISIONS = ("fp32", "int8")


@dataclass
class Side:
    """One server's measurements."""

    first_decision_s: float = 0.0
    rss_mb: float = 0.0
    anon_mb: float = 0.0
    rss_after_runs_mb: float = 0.0
    share: float = float("nan")
    rps: dict[int, float] = field(default_factory=dict)
    p50: dict[int, float] = field(default_factory=dict)
    p99: dict[int, float] = field(default_factory=dict)
    cpu_ms: dict[int, float] = field(default_factory=dict)


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


def worker_memory(server: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) in MB of the worker under server process `server`."""
    for pid in process_tree(server)[1:]:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"decidealot.providers.worker" not in command:
                continue
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
        except OSError:
            continue
        return int(status["VmRSS"].split()[0]) / 1e3, int(status["RssAnon"].split()[0]) / 1e3
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


def run_section(
    name: str,
    model: str,
    provider_env: dict[str, str],
    tokenizer: Path,
    quantised_mb: float,
    args: argparse.Namespace,
) -> Section:
    states = [s.removeprefix("Ticket 0:") for s in sized_states(tokenizer, 256, _zero)]
    section = Section(name, quantised_mb, {p: Side() for p in PRECISIONS})
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
    return section


def markdown(sections: list[Section], clients: list[int]) -> str:
    head = (
        "| checkpoint | precision | int8 share | first decision s | worker RSS MB "
        "| anonymous MB | RSS after the runs MB | "
        + " | ".join(f"dec/s {n} | CPU ms/dec {n}" for n in clients)
        + " |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|" + "---:|---:|" * len(clients)]
    notes = []
    for section in sections:
        for p, side in section.sides.items():
            points = " | ".join(f"{side.rps[n]:.2f} | {side.cpu_ms[n]:.0f}" for n in clients)
            lines.append(
                f"| {section.name} | {p} | {side.share:g} | {side.first_decision_s:.1f} "
                f"| {side.rss_mb:.0f} | {side.anon_mb:.0f} | {side.rss_after_runs_mb:.0f} "
                f"| {points} |"
            )
        fp32, int8 = section.sides["fp32"], section.sides["int8"]
        quantised = section.quantised_mb * int8.share
        saved, saved_anon = fp32.rss_mb - int8.rss_mb, fp32.anon_mb - int8.anon_mb
        speed = ", ".join(f"{int8.rps[n] / fp32.rps[n]:.2f}x at {n}" for n in clients)
        notes.append(
            f"- {section.name}: int8 quantised {quantised:.0f} MB of fp32 linear weights; its "
            f"worker holds **{saved:.0f} MB less** resident memory after the first decision "
            f"({saved / quantised:.0%} of them; anonymous {saved_anon:.0f} MB, "
            f"{saved_anon / quantised:.0%}), {fp32.rss_after_runs_mb - int8.rss_after_runs_mb:.0f}"
            f" MB less after the runs; int8 decisions/s against fp32: {speed}; max |dp| "
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
        axes[0].bar(xs, [s.sides[p].rss_mb for s in sections], width, label=p, color=colours[p])
        for c, n in enumerate(clients):
            speed = [s.sides[p].rps[n] / s.sides["fp32"].rps[n] for s in sections]
            xs_n = [i * (len(clients) + 1) + c + offset for i in range(len(sections))]
            axes[1].bar(xs_n, speed, width, color=colours[p], label=p if c == 0 else None)
    axes[0].set_xticks(range(len(sections)), names)
    axes[0].set_ylabel("worker RSS after the first decision, MB")
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
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-int8"))
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "int8.png")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.quality = 0.1, 4  # each client's first request only
    args.logs = args.cache / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    sections = []
    if "laya" in args.sections:
        from bench.laya import VARIANTS
        from decidealot.providers.laya.tiny import build_laya_checkpoint

        folder = args.cache / "laya-base-4"
        for variant in VARIANTS:
            size, shape = ("base", LAYA_SHAPE) if variant == "english" else ("tiny", None)
            if not (folder / variant / "rl_agent_config.json").exists():
                build_laya_checkpoint(folder / variant, variant, size=size, shape=shape)
        english = folder / "english"
        env = {"DECIDEALOT_VON_ENABLED": "false"}
        env |= {
            f"DECIDEALOT_LAYA_{v.upper().replace('-', '_')}_CHECKPOINT": str(folder / v)
            for v in VARIANTS
        }
        sections.append(
            run_section(
                "Laya base-4",
                "laya-english",
                env,
                english / "tokenizer" / "tokenizer.json",
                linear_mb(english / "encoder" / "config.json"),
                args,
            )
        )
    if "von" in args.sections:
        from bench.von import build_checkpoint

        checkpoint = build_checkpoint(args.cache / "von", "small", "plain")
        env = {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_VON_CHECKPOINT": str(checkpoint)}
        sections.append(
            run_section(
                "Von small",
                "von-1.1",
                env,
                checkpoint / "tokenizer.json",
                linear_mb(checkpoint / "config.json"),
                args,
            )
        )
    print(markdown(sections, args.clients))
    plot(sections, args.clients, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
