"""Engine candidates for one padded CPU pass, side by side on the same passes, in one process.

The bench's ticket requests (bench/workload.py) are prepared by the real engine (Laya or Von),
their rows cut into the engine's own length-sorted passes, and every candidate runs those same
passes, taking turns per round. Reported per candidate: CPU milliseconds per request (process
time, best round), its speed against today's fp32 eager sdpa pass, and how far its option
logits and per-row softmax probabilities move from that pass. Also the share of padded tokens
in the passes (the most that removing padding could save).

    .venv/bin/python bench/candidates.py --model laya --size base
    .venv/bin/python bench/candidates.py --model von --size small --requests 16

Candidates: `eager_sdpa` (what ships in fp32), `eager_attention` (transformers' eager
attention), `compile` (torch.compile, inductor, dynamic shapes), `ort_fp32` (torch.onnx dynamo
export run by ONNX Runtime), `ort_int8` (that graph through ONNX Runtime's quantize_dynamic),
`torch_dynamic_int8` (torch.ao.quantization.quantize_dynamic of the encoder's linears),
`int8` (what ships for DECIDEALOT_PRECISION=int8, providers/worker/int8.py) and
`bf16_autocast_cpu` (CPU autocast to bfloat16). ONNX Runtime comes from the `bench` extra.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workload import QUESTIONS, sized_states
from decidealot.contract import SystemOneRequest
from decidealot.jobs import EngineSpec, Job

Inputs = dict[str, torch.Tensor]
Pass = Callable[[Inputs], torch.Tensor]
CANDIDATES = (
    "eager_sdpa",
    "eager_attention",
    "compile",
    "ort_fp32",
    "ort_int8",
    "torch_dynamic_int8",
    "int8",
    "bf16_autocast_cpu",
)


class VonPass(nn.Module):
    """Von's encoder and scorer as one module of tensors: logits at `marker_pos`."""

    def __init__(self, encoder: nn.Module, scorer: nn.Module) -> None:
        super().__init__()
        self.encoder, self.scorer = encoder, scorer

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, marker_pos: torch.Tensor
    ) -> torch.Tensor:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        hidden = states.last_hidden_state
        index = marker_pos[:, :, None].expand(-1, -1, hidden.size(-1))
        return self.scorer(torch.gather(hidden, 1, index))


def laya_load(folder: Path) -> Callable[[str], nn.Module]:
    from decidealot.providers.laya.worker.engine import LayaEngine

    def load(precision: str) -> nn.Module:
        spec = EngineSpec("", {"english": str(folder)}, options={"precision": precision})
        return LayaEngine(spec)._checkpoint("english").model

    return load


def von_load(folder: Path) -> Callable[[str], nn.Module]:
    from decidealot.providers.von.worker.engine import VonEngine

    def load(precision: str) -> nn.Module:
        spec = EngineSpec("", {"von-1.1": str(folder)}, options={"precision": precision})
        model = VonEngine(spec)._model("von-1.1")
        return VonPass(model.encoder, model.scorer).eval()

    return load


def laya_passes(folder: Path, requests: int) -> tuple[nn.Module, list[Inputs]]:
    from decidealot.providers.engine.planner import cut
    from decidealot.providers.laya.worker.engine import LayaEngine, pass_inputs

    engine = LayaEngine(EngineSpec(factory="", checkpoints={"english": str(folder)}))
    checkpoint = engine._checkpoint("english")
    states = sized_states(folder / "tokenizer" / "tokenizer.json", requests, _heading)
    rows = [row for job in _prepared(engine, "laya-english", "english", states) for row in job]
    rows.sort(key=lambda row: len(row.ids))
    feeds = []
    for start, stop in cut([len(row.ids) for row in rows], engine.shape):
        feeds.append(pass_inputs(rows[start:stop], checkpoint.pad_id))
    return checkpoint.model, feeds


def von_passes(folder: Path, requests: int) -> tuple[nn.Module, list[Inputs]]:
    from decidealot.providers.engine.planner import cut
    from decidealot.providers.von.worker.engine import VonEngine

    engine = VonEngine(EngineSpec(factory="", checkpoints={"von-1.1": str(folder)}))
    model = engine._model("von-1.1")
    states = sized_states(folder / "tokenizer.json", requests, _heading)
    prepared = _prepared(engine, "von", "von-1.1", states)
    rows = sorted((row for job in prepared for row in job if not row.shared), key=len_ids)
    feeds = []
    for start, stop in cut([len(row.ids) for row in rows], engine.shape):
        chosen = rows[start:stop]
        length, width = max(len(r.ids) for r in chosen), max(len(r.markers) for r in chosen)
        ids = torch.full((len(chosen), length), model.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chosen), length), dtype=torch.long)
        pos = torch.zeros((len(chosen), width), dtype=torch.long)
        for i, row in enumerate(chosen):
            ids[i, : len(row.ids)] = torch.tensor(row.ids)
            mask[i, : len(row.ids)] = 1
            pos[i, : len(row.markers)] = torch.tensor(row.markers)
            pos[i, len(row.markers) :] = row.markers[-1]
        feeds.append({"input_ids": ids, "attention_mask": mask, "marker_pos": pos})
    return VonPass(model.encoder, model.scorer).eval(), feeds


def len_ids(row: object) -> int:
    return len(row.ids)  # type: ignore[attr-defined]


def _heading(index: int) -> str:
    return f"Ticket {index}:"


def _prepared(engine: object, model: str, key: str, states: list[str]) -> list[list[object]]:
    out = []
    for state in states:
        body = {"model": model, "state": state, "questions": QUESTIONS}
        request = msgspec.convert(body, SystemOneRequest)
        job = engine.prepare(Job(checkpoint=key, state=request.state, questions=request.questions))  # type: ignore[attr-defined]
        out.append(job.rows)
    return out


def _torch(module: nn.Module, autocast: bool = False) -> Pass:
    def run(inputs: Inputs) -> torch.Tensor:
        with torch.inference_mode():
            if autocast:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return module(**inputs).float()
            return module(**inputs).float()

    return run


def _export(module: nn.Module, example: Inputs, scratch: Path) -> Path:
    """torch.onnx (dynamo) export with every input's dimensions dynamic."""
    names = {0: "rows", 1: "length"}
    dims: dict[str, torch.export.Dim] = {}
    shapes = {}
    for name, tensor in example.items():
        axes = {}
        for axis in range(tensor.dim()):
            label = names[axis] if name in ("input_ids", "attention_mask") or axis == 0 else "k"
            axes[axis] = dims.setdefault(label, torch.export.Dim(label))
        shapes[name] = axes
    path = scratch / "fp32.onnx"
    program = torch.onnx.export(
        module, kwargs=dict(example), dynamo=True, dynamic_shapes=shapes, verbose=False
    )
    program.save(str(path))
    return path


def _ort(path: Path) -> Pass:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(inputs: Inputs) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {n: inputs[n].numpy() for n in names})[0])

    return run


def build(
    name: str,
    model: nn.Module,
    load: Callable[[str], nn.Module],
    feeds: list[Inputs],
    scratch: Path,
) -> Pass:
    """Candidate `name`'s pass; `load(precision)` loads the checkpoint as the engine does."""
    if name == "eager_sdpa":
        return _torch(model)
    if name == "eager_attention":
        other = copy.deepcopy(model)
        other.encoder.set_attn_implementation("eager")
        return _torch(other)
    if name == "compile":
        return _torch(torch.compile(copy.deepcopy(model), dynamic=True))
    if name in ("ort_fp32", "ort_int8"):
        fp32 = scratch / "fp32.onnx"
        if not fp32.exists():
            _export(model, feeds[-1], scratch)
        if name == "ort_fp32":
            return _ort(fp32)
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(fp32, scratch / "int8.onnx", weight_type=QuantType.QInt8)
        return _ort(scratch / "int8.onnx")
    if name == "torch_dynamic_int8":
        other = copy.deepcopy(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            other.encoder = torch.ao.quantization.quantize_dynamic(
                other.encoder, {nn.Linear}, dtype=torch.qint8
            )
        return _torch(other)
    if name == "int8":
        return _torch(load("int8"))
    if name == "bf16_autocast_cpu":
        return _torch(model, autocast=True)
    raise ValueError(f"unknown candidate {name!r}; expected one of {CANDIDATES}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("laya", "von"), default="laya")
    parser.add_argument("--size", default="base", help="laya: tiny, base; von: tiny, small")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--cache", type=Path, default=None, help="checkpoint cache directory")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model == "laya":
        from bench.laya import build_checkpoints

        cache = args.cache or Path("/tmp/decidealot-bench-laya")
        folder = build_checkpoints(cache, args.size) / "english"
        model, feeds = laya_passes(folder, args.requests)
        load = laya_load(folder)
    else:
        from bench.von import build_checkpoint

        cache = args.cache or Path("/tmp/decidealot-bench-von")
        folder = build_checkpoint(cache, args.size, "plain")
        model, feeds = von_passes(folder, args.requests)
        load = von_load(folder)
    real = sum(int(f["attention_mask"].sum()) for f in feeds)
    padded = sum(f["attention_mask"].numel() for f in feeds)
    print(
        f"{args.model} {args.size}: {args.requests} requests, {len(feeds)} passes, "
        f"{real} tokens, {padded - real} of them padding ({(padded - real) / padded:.1%})"
    )
    names = args.candidates.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        runs: dict[str, Pass] = {}
        for name in names:
            began = time.perf_counter()
            runs[name] = build(name, model, load, feeds, Path(scratch))
            runs[name](feeds[0])  # warm (compile compiles here)
            print(f"{name}: ready in {time.perf_counter() - began:.1f} s", file=sys.stderr)
        reference = [_torch(model)(f) for f in feeds]
        moved: dict[str, tuple[float, float]] = {}
        for name, run in runs.items():
            logit, prob = 0.0, 0.0
            for feed, ref in zip(feeds, reference, strict=True):
                got = run(feed)
                valid = feed.get("marker_mask", torch.ones_like(ref, dtype=torch.bool))
                ref_p = ref.masked_fill(~valid, -1e4).softmax(-1)
                got_p = got.masked_fill(~valid, -1e4).softmax(-1)
                logit = max(logit, float(((got - ref) * valid).abs().max()))
                prob = max(prob, float((got_p - ref_p).abs().max()))
            moved[name] = (logit, prob)
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                began = time.process_time()
                for feed in feeds:
                    run(feed)
                cpu[name].append(1000 * (time.process_time() - began) / args.requests)
    base = min(cpu.get("eager_sdpa", [float("nan")]))
    print(
        "\n| candidate | CPU ms/request (best round) | rounds | speed vs eager_sdpa "
        "| max abs d logit | max abs d p |"
    )
    print("|---|---:|---|---:|---:|---:|")
    for name, times in cpu.items():
        rounds = ", ".join(f"{t:.0f}" for t in times)
        logit, prob = moved[name]
        print(
            f"| {name} | {min(times):.1f} | {rounds} | **{base / min(times):.2f}x** "
            f"| {logit:.1e} | {prob:.1e} |"
        )


if __name__ == "__main__":
    main()
