"""Every peer side by side in one run: Decidealot fp32 and int8 against `laya serve`, laya's
ONNXAgent (in-process) and `von serve`, on base-sized checkpoints at one torch thread per pass.

Laya (random `base` english checkpoint, bench/laya.py): `decidealot serve` with
DECIDEALOT_PRECISION=fp32 and =int8, `laya-serve`, and laya 0.4.15's `ONNXAgent` in a child
process of its own (no HTTP: `system_one` called by 1, 8 or 32 threads in a closed loop), on a
graph this bench exports from upstream's own model with torch.onnx (dynamo exporter; the wheel
ships no exporter). Von (random `small` checkpoint, bench/von.py): `decidealot serve` fp32 and
int8 against `von serve`. Every point is closed-loop load at 1, 8 and 32 clients; the peers of a
section take turns per point, in an order that rotates, so background load hits all of them
alike. Reported: decisions/s, p50/p99 and the CPU time of each server's process tree per
decision (for ONNXAgent, its process's). Then int8 against fp32 over the same requests of all
three question types: max and mean |dp|, share of equal choices, mean |d score|.

    .venv/bin/python bench/peers.py                      # about 12 minutes on 2 cores
    .venv/bin/python bench/peers.py --sections laya --laya-size tiny --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import (
    LoadResult,
    drive_raw,
    free_port,
    python,
    server,
    server_root,
    tree_cpu_seconds,
    upstream_package,
)
from bench.workload import QUESTIONS, sized_states

COMMON_ENV = {
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
ONNX_AGENT = "laya ONNXAgent"
JSON = {"content-type": "application/json"}


def body(model: str, state: str) -> bytes:
    return json.dumps({"model": model, "state": state, "questions": QUESTIONS}).encode()


def decidealot_command(port: int) -> list[str]:
    return [python(), "-m", "decidealot", "serve", "--port", str(port)]


@contextmanager
def decidealot(
    name: str, port: int, precision: str, provider_env: dict[str, str], logs: Path
) -> Iterator[str]:
    env = {
        **COMMON_ENV,
        "DECIDEALOT_DEVICE": "cpu",
        "DECIDEALOT_TORCH_THREADS": "1",
        "DECIDEALOT_PRECISION": precision,
        "DECIDEALOT_PROVIDER_TIMEOUT_SECONDS": "900",
        "DECIDEALOT_MODEL_DIR": str(logs / f"models-{precision}"),
        **provider_env,
    }
    with server(decidealot_command(port), port=port, env=env, log_path=logs / f"{name}.log") as url:
        yield url


def export_upstream_graph(checkpoint: Path, target: Path) -> Path:
    """Upstream's own model (`laya.load(...).model`) exported with torch.onnx (dynamo), with
    the five inputs and two outputs `ONNXAgent` feeds and reads; cached at `target`."""
    if target.exists():
        return target
    import torch

    agent = upstream_package("laya").load(str(checkpoint), device="cpu")
    model = agent.model.eval()
    rows, length, options = 3, 160, 4
    example = {
        "input_ids": torch.randint(5, 300, (rows, length)),
        "attention_mask": torch.ones(rows, length, dtype=torch.long),
        "marker_pos": torch.arange(rows * options).view(rows, options) + 1,
        "marker_mask": torch.ones(rows, options, dtype=torch.bool),
        "qtype": torch.arange(rows) % 3,
    }
    example["attention_mask"][0, length // 2 :] = 0
    dims = {name: torch.export.Dim(name) for name in ("rows", "length", "options")}
    shapes = {
        "input_ids": {0: dims["rows"], 1: dims["length"]},
        "attention_mask": {0: dims["rows"], 1: dims["length"]},
        "marker_pos": {0: dims["rows"], 1: dims["options"]},
        "marker_mask": {0: dims["rows"], 1: dims["options"]},
        "qtype": {0: dims["rows"]},
    }
    with torch.no_grad():
        program = torch.onnx.export(
            model,
            kwargs=example,
            input_names=list(example),
            output_names=["logits", "act_logits"],
            dynamic_shapes=shapes,
            dynamo=True,
            verbose=False,
        )
    program.save(str(target))
    return target


def onnx_agent_child(args: argparse.Namespace) -> None:
    """Child mode: ONNXAgent answering states from `args.states` on `args.clients` threads for
    `args.seconds`; prints one JSON line (requests, seconds, latencies, own CPU seconds)."""
    onnx_agent = upstream_package("laya.onnx_agent")
    agent = onnx_agent.ONNXAgent(str(args.checkpoint), onnx_path=str(args.graph))
    states = json.loads(Path(args.states).read_text())
    if args.answer_first:
        print(json.dumps(agent.system_one(states[0], QUESTIONS), default=str))
        return
    agent.system_one(states[0], QUESTIONS)  # warm
    latencies: list[float] = []
    counter = iter(range(10**9))
    lock = threading.Lock()
    stop_at = time.perf_counter() + args.seconds

    def client() -> None:
        while time.perf_counter() < stop_at:
            with lock:
                index = next(counter)
            began = time.perf_counter()
            agent.system_one(f"Ticket {index}:" + states[index % len(states)], QUESTIONS)
            latencies.append(time.perf_counter() - began)

    cpu_before = _own_cpu()
    began = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    ms = sorted(1000 * x for x in latencies)
    print(
        json.dumps(
            {
                "requests": len(ms),
                "seconds": elapsed,
                "p50": ms[len(ms) // 2],
                "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
                "cpu": _own_cpu() - cpu_before,
            }
        )
    )


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_onnx_agent(
    checkpoint: Path, graph: Path, states_file: Path, clients: int, seconds: float
) -> tuple[LoadResult, float]:
    """One ONNXAgent point in a fresh child process; (result, CPU ms per decision)."""
    import subprocess

    command = [python(), __file__, "--onnx-agent-child", "--checkpoint", str(checkpoint)]
    command += ["--graph", str(graph), "--states", str(states_file)]
    command += ["--clients", str(clients), "--seconds", str(seconds)]
    env = {**os.environ, **COMMON_ENV}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    result = LoadResult(
        ONNX_AGENT, clients, data["requests"], 0, data["seconds"], data["p50"], data["p99"]
    )
    return result, 1000 * data["cpu"] / max(1, data["requests"])


def load_points(
    peers: dict[str, Callable[[int, float, int], tuple[LoadResult, float]]],
    clients: list[int],
    seconds: float,
) -> tuple[list[LoadResult], dict[tuple[str, int], float]]:
    """Every client count on every peer; the order rotates per point."""
    results: list[LoadResult] = []
    cpu_ms: dict[tuple[str, int], float] = {}
    names = list(peers)
    for turn, n in enumerate(clients):
        order = names[turn % len(names) :] + names[: turn % len(names)]
        for name in order:
            result, cpu = peers[name](n, seconds, 1000 * turn)
            cpu_ms[(name, n)] = cpu
            results.append(result)
            print(
                f"  {name:>18} {n:>2} clients: {result.rps:7.2f} dec/s  "
                f"p50 {result.p50_ms:8.1f} ms  p99 {result.p99_ms:8.1f} ms  "
                f"cpu {cpu:8.1f} ms/dec ({result.requests} requests, {result.errors} errors)",
                file=sys.stderr,
            )
    return results, cpu_ms


def http_peer(
    name: str, url: str, model: str, pid: int, states: list[str]
) -> Callable[[int, float, int], tuple[LoadResult, float]]:
    def point(clients: int, seconds: float, offset: int) -> tuple[LoadResult, float]:
        def bodies(i: int) -> bytes:
            index = offset + i
            return body(model, f"Ticket {index}:" + states[index % len(states)])

        drive_raw(name, url, bodies, clients=clients, seconds=0, warmup=1)
        before = tree_cpu_seconds(pid)
        result = drive_raw(name, url, bodies, clients=clients, seconds=seconds, warmup=0)
        return result, 1000 * (tree_cpu_seconds(pid) - before) / max(1, result.requests)

    return point


def table(results: list[LoadResult], cpu_ms: dict[tuple[str, int], float], baseline: str) -> str:
    by_key = {(r.name, r.clients): r for r in results}
    lines = [
        "| peer | clients | decisions | errors | dec/s | p50 ms | p99 ms | server CPU ms/dec "
        f"| dec/s vs {baseline} | CPU per decision vs {baseline} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = list(dict.fromkeys(r.name for r in results))
    for n in sorted({r.clients for r in results}):
        base = by_key[(baseline, n)]
        for name in names:
            r = by_key[(name, n)]
            speed = r.rps / base.rps if base.rps else float("nan")
            cpu = cpu_ms[(baseline, n)] / cpu_ms[(name, n)]
            lines.append(
                f"| {name} | {n} | {r.requests} | {r.errors} | {r.rps:.2f} | {r.p50_ms:.0f} | "
                f"{r.p99_ms:.0f} | {cpu_ms[(name, n)]:.1f} | **{speed:.2f}x** | {cpu:.2f}x |"
            )
    return "\n".join(lines)


def answers(url: str, model: str, states: list[str]) -> list[dict[str, dict[str, object]]]:
    with httpx.Client(timeout=900.0) as client:
        out = []
        for state in states:
            response = client.post(url, content=body(model, state), headers=JSON)
            response.raise_for_status()
            out.append(response.json()["answers"])
    return out


def quality(fp32: list[dict], int8: list[dict]) -> str:
    """int8 against fp32 on the same requests: |dp| over every probability (noul: P(true)),
    equal choices, |d score|."""
    moved: list[float] = []
    choices = same = 0
    scores: list[float] = []
    for ours, theirs in zip(fp32, int8, strict=True):
        for name, answer in ours.items():
            other = theirs[name]
            if "noul" in answer:
                moved.append(abs(answer["noul"] - other["noul"]))
                continue
            probs = answer["probabilities"]
            moved += [abs(p - other["probabilities"][k]) for k, p in probs.items()]
            if "choice" in answer:
                choices += 1
                same += answer["choice"] == other["choice"]
            if "score" in answer:
                scores.append(abs(answer["score"] - other["score"]))
    return (
        f"{len(fp32)} requests ({3 * len(fp32)} answers: choice, score, noul): max |dp| "
        f"{max(moved):.4f}, mean |dp| {statistics.fmean(moved):.4f}, equal choices "
        f"{same}/{choices} ({same / choices:.1%}), mean |d score| {statistics.fmean(scores):.4f}"
    )


def laya_section(args: argparse.Namespace, logs: Path) -> list[str]:
    from bench.laya import build_checkpoints

    folder = build_checkpoints(args.cache / "laya", args.laya_size)
    english = folder / "english"
    tokenizer = english / "tokenizer" / "tokenizer.json"
    states = [s.removeprefix("Ticket 0:") for s in sized_states(tokenizer, 512, _zero)]
    states_file = logs / "laya-states.json"
    states_file.write_text(json.dumps(states))
    graph = export_upstream_graph(english, args.cache / f"laya-{args.laya_size}-upstream.onnx")
    provider_env = {
        "DECIDEALOT_VON_ENABLED": "false",
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": str(english),
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT": str(folder / "multilingual"),
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT": str(folder / "typed-decisions"),
    }
    ports = {name: free_port() for name in ("fp32", "int8", "laya")}
    laya_env = {
        **COMMON_ENV,
        "LAYA_HOST": "127.0.0.1",
        "LAYA_PORT": str(ports["laya"]),
        "LAYA_DEVICE": "cpu",
        "LAYA_THREADS": "1",
        "LAYA_MODELS": "english",
        "LAYA_EXTRA_MODELS": json.dumps({"english": str(english)}),
        "LAYA_MAX_CONCURRENT": "64",
    }
    with ExitStack() as stack:
        urls = {
            "decidealot fp32": stack.enter_context(
                decidealot("decidealot-fp32", ports["fp32"], "fp32", provider_env, logs)
            ),
            "decidealot int8": stack.enter_context(
                decidealot("decidealot-int8", ports["int8"], "int8", provider_env, logs)
            ),
            "laya serve": stack.enter_context(
                server(
                    [str(Path(python()).with_name("laya-serve"))],
                    port=ports["laya"],
                    env=laya_env,
                    log_path=logs / "laya-serve.log",
                )
            ),
        }
        models = {"decidealot fp32": "laya-english", "decidealot int8": "laya-english"}
        models["laya serve"] = "english"
        pids = {
            "decidealot fp32": server_root(str(ports["fp32"])),
            "decidealot int8": server_root(str(ports["int8"])),
            "laya serve": server_root("laya-serve"),
        }
        sample = states[:1]
        check = {
            name: answers(url + "/v1/systemone", models[name], sample) for name, url in urls.items()
        }
        _agree(check["decidealot fp32"][0], check["laya serve"][0], 1e-3, "laya serve")
        peers = {
            name: http_peer(name, url + "/v1/systemone", models[name], pids[name], states)
            for name, url in urls.items()
        }
        peers[ONNX_AGENT] = lambda n, s, _offset: run_onnx_agent(english, graph, states_file, n, s)
        results, cpu_ms = load_points(peers, args.clients, args.seconds)
        quality_states = [f"Quality {i}:" + states[i] for i in range(args.laya_quality)]
        fp32 = answers(urls["decidealot fp32"] + "/v1/systemone", "laya-english", quality_states)
        int8 = answers(urls["decidealot int8"] + "/v1/systemone", "laya-english", quality_states)
    return [
        f"\n### Laya `{args.laya_size}` english checkpoint ({args.seconds:g} s per point)\n",
        table(results, cpu_ms, "laya serve"),
        "",
        "int8 against fp32 (Laya): " + quality(fp32, int8),
    ]


def von_section(args: argparse.Namespace, logs: Path) -> list[str]:
    from bench.von import build_checkpoint

    checkpoint = build_checkpoint(args.cache / "von", args.von_size, "plain")
    states = [
        s.removeprefix("Ticket 0:") for s in sized_states(checkpoint / "tokenizer.json", 512, _zero)
    ]
    provider_env = {
        "DECIDEALOT_LAYA_ENABLED": "false",
        "DECIDEALOT_VON_CHECKPOINT": str(checkpoint),
    }
    ports = {name: free_port() for name in ("fp32", "int8", "von")}
    von_command = [str(Path(python()).with_name("von")), "serve", "--host", "127.0.0.1"]
    von_command += ["--port", str(ports["von"]), "--device", "cpu", "--no-chains"]
    von_command += ["--noul-decision", "raw"]
    von_env = {
        **COMMON_ENV,
        "VON_CHECKPOINT_DIR": str(checkpoint),
        "VON_CHAINS_DIR": "off",
        "VON_DEVICE": "cpu",
        "VON_NOUL_DECISION": "raw",
    }
    with ExitStack() as stack:
        urls = {
            "decidealot fp32": stack.enter_context(
                decidealot("von-decidealot-fp32", ports["fp32"], "fp32", provider_env, logs)
            ),
            "decidealot int8": stack.enter_context(
                decidealot("von-decidealot-int8", ports["int8"], "int8", provider_env, logs)
            ),
            "von serve": stack.enter_context(
                server(von_command, port=ports["von"], env=von_env, log_path=logs / "von.log")
            ),
        }
        pids = {
            "decidealot fp32": server_root(str(ports["fp32"])),
            "decidealot int8": server_root(str(ports["int8"])),
            "von serve": server_root("bin/von"),
        }
        check = {
            name: answers(url + "/v1/systemone", "von-1.1", states[:1])
            for name, url in urls.items()
        }
        _agree(check["decidealot fp32"][0], check["von serve"][0], 1e-4, "von serve")
        peers = {
            name: http_peer(name, url + "/v1/systemone", "von-1.1", pids[name], states)
            for name, url in urls.items()
        }
        results, cpu_ms = load_points(peers, args.clients, args.seconds)
        quality_states = [f"Quality {i}:" + states[i] for i in range(args.von_quality)]
        fp32 = answers(urls["decidealot fp32"] + "/v1/systemone", "von-1.1", quality_states)
        int8 = answers(urls["decidealot int8"] + "/v1/systemone", "von-1.1", quality_states)
    return [
        f"\n### Von `{args.von_size}` checkpoint, plain attention ({args.seconds:g} s per point)\n",
        table(results, cpu_ms, "von serve"),
        "",
        "int8 against fp32 (Von): " + quality(fp32, int8),
    ]


def _zero(_: int) -> str:
    return "Ticket 0:"


def _agree(ours: dict, theirs: dict, tolerance: float, peer: str) -> None:
    """Decidealot fp32 and the peer give the same probabilities on the sample request."""
    for name, answer in ours.items():
        other = theirs[name]
        a = answer.get("probabilities", {"p": answer.get("noul")})
        b = other.get("probabilities", {"p": other.get("noul_raw", other.get("noul"))})
        if any(abs(float(a[k]) - float(b[k])) > tolerance for k in a):
            raise SystemExit(f"decidealot fp32 and {peer} disagree on {name}: {a} {b}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", type=lambda s: [int(n) for n in s.split(",")], default=[1, 8, 32]
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--laya-quality", type=int, default=210, help="Laya requests compared int8 / fp32"
    )
    parser.add_argument(
        "--von-quality", type=int, default=210, help="Von requests compared int8 / fp32"
    )
    parser.add_argument("--laya-size", default="base")
    parser.add_argument("--von-size", default="small")
    parser.add_argument("--sections", default="laya,von")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/decidealot-bench-peers"))
    parser.add_argument("--onnx-agent-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--answer-first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--graph", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--states", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.onnx_agent_child:
        args.clients = args.clients if isinstance(args.clients, int) else args.clients[0]
        onnx_agent_child(args)
        return 0
    args.cache.mkdir(parents=True, exist_ok=True)
    logs = args.cache / "logs"
    logs.mkdir(exist_ok=True)
    report = [
        f"Command: `bench/peers.py {' '.join(sys.argv[1:])}`. One torch thread per pass for "
        f"every peer (OMP_NUM_THREADS=1), CPU, {os.cpu_count()} CPUs.",
    ]
    for section in args.sections.split(","):
        report += laya_section(args, logs) if section == "laya" else von_section(args, logs)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
