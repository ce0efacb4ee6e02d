"""DECIDEALOT_PRECISION=auto against fp32 and upstream `laya-serve`, side by side in one run.

Per checkpoint (Laya english, random weights at ModernBERT's initializer range): `base`
(ModernBERT-base's shape, 22 layers) and `base-4` (its width, 4 layers, as issue 27 measured),
four servers run at once on the same checkpoint, one torch thread per pass:

- `decidealot auto`: the default (bf16 on a CPU with amx_bf16 or avx512_bf16, else fp32);
- `decidealot fp32`;
- `laya serve fp32` and `laya serve bf16` (upstream, `LAYA_CPU_AMP=bf16`: CPU autocast).

Every point is closed-loop load with the same requests (bench/peers.py's `load_points`: the
servers take turns per point, in a rotating order); reported per server: decisions/s, p50, p99,
the CPU of its process tree per decision, the worker's (laya serve's) resident memory after the
runs, and max and mean |dp| against Decidealot fp32 over the same requests. What `auto` ran,
and why, is read from its `decidealot_precision_info` gauge; the CPU's model and bf16/int8
flags head the table.

    .venv/bin/python bench/bf16.py                       # both checkpoints, 8 and 32 clients
    .venv/bin/python bench/bf16.py --sections base-4 --seconds 5 --quality 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.int8 import worker_memory
from bench.laya import VARIANTS
from bench.loadgen import cpu_model, free_port, process_tree, python, server
from bench.peers import COMMON_ENV, answers, decidealot, http_peer, load_points
from bench.workload import sized_states
from decidealot import cpu

SHAPES = {"base": {}, "base-4": {"num_hidden_layers": 4}}
"""On top of ModernBERT-base's shape (`size="base"`)."""
OURS = ("decidealot auto", "decidealot fp32")
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


def servers(stack: ExitStack, folder: Path, logs: Path, name: str) -> Iterator[tuple[str, str]]:
    """(peer, base URL) of the four servers, each started in `stack`."""
    english = folder / "english"
    provider_env = {
        "DECIDEALOT_VON_ENABLED": "false",
        **{
            f"DECIDEALOT_LAYA_{v.upper().replace('-', '_')}_CHECKPOINT": str(folder / v)
            for v in VARIANTS
        },
    }
    for peer in OURS:
        precision = peer.rsplit(" ", 1)[1]
        port = free_port()
        yield (
            peer,
            stack.enter_context(
                decidealot(f"bf16-{name}-{precision}", port, precision, provider_env, logs)
            ),
        )
    for peer in THEIRS:
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


def run_section(name: str, args: argparse.Namespace) -> Section:
    folder = checkpoint(args.cache, name)
    tokenizer = folder / "english" / "tokenizer" / "tokenizer.json"
    states = [s.removeprefix("Ticket 0:") for s in sized_states(tokenizer, 256, _zero)]
    section = Section(name, {peer: Peer() for peer in (*OURS, *THEIRS)})
    models = dict.fromkeys(OURS, "laya-english") | dict.fromkeys(THEIRS, "english")
    with ExitStack() as stack:
        urls = dict(servers(stack, folder, args.logs, name))
        pids = {peer: _server_pid(url.rsplit(":", 1)[1]) for peer, url in urls.items()}
        for peer, url in urls.items():  # load each checkpoint before the clock starts
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
        for name, peer in section.peers.items():
            points = " | ".join(
                f"{peer.rps[n]:.2f} | {peer.p50[n]:.0f} | {peer.p99[n]:.0f} | {peer.cpu_ms[n]:.0f}"
                for n in clients
            )
            lines.append(
                f"| {section.name} | {name} | {points} | {peer.max_dp:.4f} | "
                f"{peer.mean_dp:.5f} | {peer.rss_mb:.0f} |"
            )
        auto, fp32 = section.peers["decidealot auto"], section.peers["decidealot fp32"]
        amp = section.peers["laya serve bf16"]
        speed = ", ".join(
            f"{auto.rps[n] / fp32.rps[n]:.2f}x fp32 and {auto.rps[n] / amp.rps[n]:.2f}x "
            f"laya serve bf16 at {n} clients"
            for n in clients
        )
        notes.append(
            f"- {section.name}: auto ran {section.auto}; its decisions/s: {speed}; |dp| over "
            f"{section.requests} requests against Decidealot fp32."
        )
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quality", type=int, default=40, help="requests compared for |dp|")
    parser.add_argument("--clients", type=lambda s: [int(n) for n in s.split(",")], default=[8, 32])
    parser.add_argument("--sections", default="base-4,base")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-bf16"))
    args = parser.parse_args()
    args.logs = args.cache / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    results = args.cache / "results.json"
    sections = [run_section(name, args) for name in args.sections.split(",")]
    results.write_text(json.dumps([asdict(s) for s in sections], indent=1))
    print(f"Command: `bench/bf16.py {' '.join(sys.argv[1:])}`\n")
    print(markdown(sections, args.clients))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
