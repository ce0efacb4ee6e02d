"""bf16 on CPUs with bf16 units, `DECIDEALOT_PRECISION=auto`, and what each CPU may run.

The CPU is injected (`decidealot.cpu.flags` replaced by the flag list of one of three CPUs),
so every kind is covered on whatever CPU the suite runs on: an Intel Xeon with AMX, an AMD
Zen 4 (avx512_bf16 and avx512_vnni, no AMX) and an AMD Zen 3 (AVX2 only: no bf16 units, no
int8 dot products). bf16 kernels never crash on a CPU without bf16 units (torch emulates them,
slowly), so the numerics tests run everywhere, on the tiny checkpoints, in-process.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch

from decidealot import cpu, registry
from decidealot.config import ConfigError, precision_problem
from decidealot.device import check_precision
from decidealot.jobs import CheckpointLoad, EngineSpec
from decidealot.providers.engine.planner import run_together
from decidealot.providers.laya.worker.engine import LayaEngine
from decidealot.providers.von.worker.engine import VonEngine
from decidealot.providers.worker import bf16
from tests.support.checkpoints import TinyCheckpoints
from tests.support.cli import run_cli as cli
from tests.worker.test_precision import QUESTIONS, _differences, _jobs

AMX = frozenset(
    [
        "fpu",
        "sse2",
        "avx",
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512_vnni",
        "avx512_bf16",
        "amx_bf16",
        "amx_tile",
        "amx_int8",
    ]
)
"""An Intel Xeon (Sapphire Rapids) as /proc/cpuinfo lists it, in part."""
ZEN4 = frozenset(
    ["fpu", "sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"]
)
"""An AMD EPYC Zen 4: bf16 and int8 dot products in AVX-512, no AMX."""
ZEN3 = frozenset(["fpu", "sse2", "avx", "avx2", "fma"])
"""An AMD EPYC Zen 3: AVX2 only; bf16 and int8 would be emulated."""

SERVED_BF16_TOLERANCE = 0.02
"""Most a bf16 probability may differ from fp32's (issue 27's bound on a served answer)."""

LAYA = "decidealot.providers.laya.worker.engine:create"
VON = "decidealot.providers.von.worker.engine:create"

NARROW = {"initializer_range": 0.02}
"""The tiny Laya shape at ModernBERT's own initializer range, where bf16 passes the probe (the
wide 0.5 test checkpoints move it past the tolerance, and fall back to fp32)."""


@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Make `decidealot.cpu.flags` answer the given CPU's flags."""

    def use(flags: frozenset[str]) -> None:
        monkeypatch.setattr(cpu, "flags", lambda: flags)

    return use


def test_flags_are_read_from_the_kernels_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n")
    flags = cpu._read_flags(info)
    assert flags == {"fpu", "avx2", "avx512_bf16"}
    assert cpu.bf16_units(flags) == ("avx512_bf16",) and cpu.int8_units(flags) == ()
    assert cpu._read_flags(tmp_path / "absent") == frozenset()  # no units: fp32


@pytest.mark.parametrize(
    ("flags", "precision", "units"),
    [
        (ZEN3, "bf16", "amx_bf16, avx512_bf16"),
        (ZEN3, "int8", "amx_int8, avx512_vnni, avx_vnni"),
        (frozenset({"avx2", "avx512_bf16"}), "int8", "amx_int8, avx512_vnni, avx_vnni"),
    ],
    ids=["bf16-on-zen3", "int8-on-zen3", "int8-without-vnni"],
)
def test_a_precision_without_its_units_is_refused_naming_the_setting_and_flags(
    flags: frozenset[str], precision: str, units: str, on_cpu
) -> None:  # type: ignore[no-untyped-def]
    on_cpu(flags)
    settings = registry.settings(device="cpu", precision=precision)
    with pytest.raises(ConfigError) as raised:
        check_precision(settings)
    message = str(raised.value)
    assert message.startswith(f"DECIDEALOT_PRECISION: {precision} on this CPU")
    assert f"none of {units}" in message and "auto or fp32" in message


@pytest.mark.parametrize("flags", [AMX, ZEN4], ids=["amx", "zen4"])
@pytest.mark.parametrize("precision", ["auto", "fp32", "bf16", "int8"])
def test_a_cpu_with_the_units_runs_every_cpu_precision(
    flags: frozenset[str], precision: str, on_cpu
) -> None:  # type: ignore[no-untyped-def]
    on_cpu(flags)
    check_precision(registry.settings(device="cpu", precision=precision))


def test_auto_and_fp32_run_anywhere_and_cuda_precisions_are_not_checked_against_the_cpu(
    on_cpu,
) -> None:  # type: ignore[no-untyped-def]
    on_cpu(ZEN3)
    for precision in ("auto", "fp32"):
        check_precision(registry.settings(device="cpu", precision=precision))
    assert precision_problem("bf16", "cuda", ZEN3) is None


@pytest.mark.parametrize(
    ("device", "flags", "chosen", "why"),
    [
        ("cpu", AMX, "bf16", "auto on a CPU with amx_bf16, avx512_bf16"),
        ("cpu", ZEN4, "bf16", "auto on a CPU with avx512_bf16"),
        ("cpu", ZEN3, "fp32", "auto on a CPU with none of amx_bf16, avx512_bf16"),
        ("cuda", ZEN3, "bf16", "auto on cuda: bf16, as upstream runs on a GPU"),
    ],
    ids=["amx", "zen4", "zen3", "cuda"],
)
def test_auto_chooses_from_the_device_and_the_cpus_flags(
    device: str, flags: frozenset[str], chosen: str, why: str
) -> None:
    assert cpu.auto_precision(device, flags, "bf16") == (chosen, why)


@pytest.mark.slow  # a real command: the full suite, not the quick loop
def test_serve_refuses_bf16_on_a_cpu_without_bf16_units_before_listening() -> None:
    """`decidealot serve` itself, on a CPU that reads as a Zen 3: exit status 2 and one line
    naming the setting and the flags, before any socket is bound (no port is given, the
    default one would be taken otherwise)."""
    code = (
        "import sys; from decidealot import cpu; "
        f"cpu.flags = lambda: frozenset({sorted(ZEN3)!r}); "
        "from decidealot.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    result = cli("serve", code=code, DECIDEALOT_PRECISION="bf16", DECIDEALOT_DEVICE="cpu")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "DECIDEALOT_PRECISION: bf16 on this CPU" in line
    assert "none of amx_bf16, avx512_bf16" in line


def test_auto_is_the_default_and_its_value_is_accepted() -> None:
    assert registry.from_env({}).precision == "auto"
    assert registry.from_env({"DECIDEALOT_PRECISION": "bf16", "DECIDEALOT_DEVICE": "cpu"})


def _spec(factory: str, key: str, path: Path, precision: str | None) -> EngineSpec:
    options = {} if precision is None else {"precision": precision}
    return EngineSpec(factory, {key: str(path)}, preload=[key], options=options)


def _decisions(engine: LayaEngine | VonEngine, key: str) -> list:  # type: ignore[type-arg]
    return run_together(engine, [engine.prepare(job) for job in _jobs(key)])  # type: ignore[arg-type]


def _built(
    engine_type: type[LayaEngine] | type[VonEngine], spec: EngineSpec
) -> tuple[LayaEngine | VonEngine, tuple[str, str, str]]:
    """The engine, and what it reported of the one checkpoint it preloads."""
    loads: list[CheckpointLoad] = []
    engine = engine_type(spec, loads.append)
    (load,) = loads
    return engine, (load.requested, load.precision, load.reason)


@pytest.fixture(scope="module")
def narrow_laya(tiny: TinyCheckpoints) -> Path:
    return tiny.laya("english", shape=NARROW)


def test_auto_on_a_cpu_without_bf16_units_answers_exactly_as_fp32(
    tiny: TinyCheckpoints, narrow_laya: Path, on_cpu
) -> None:  # type: ignore[no-untyped-def]
    """Zen 3: `auto` (here the engine's default, no option given) is fp32, bit for bit."""
    on_cpu(ZEN3)
    for factory, engine_type, key, path in (
        (LAYA, LayaEngine, "english", narrow_laya),
        (VON, VonEngine, "von-1.1", tiny.von(independent_options=True)),
    ):
        auto, auto_load = _built(engine_type, _spec(factory, key, path, None))
        fp32, fp32_load = _built(engine_type, _spec(factory, key, path, "fp32"))
        assert _decisions(auto, key) == _decisions(fp32, key)
        assert auto_load == ("auto", "fp32", "auto on a CPU with none of amx_bf16, avx512_bf16")
        assert fp32_load == ("fp32", "fp32", "requested")


@pytest.mark.parametrize("flags", [AMX, ZEN4], ids=["amx", "zen4"])
def test_auto_runs_bf16_within_tolerance_of_fp32_on_a_cpu_with_bf16_units(
    tiny: TinyCheckpoints, narrow_laya: Path, flags: frozenset[str], on_cpu
) -> None:  # type: ignore[no-untyped-def]
    """Every question type within 0.02 of fp32, while really running bf16 (answers move),
    for Laya and Von in both attention modes; the report says what `auto` chose and why."""
    on_cpu(flags)
    units = ", ".join(cpu.bf16_units(flags))
    cases = [(LAYA, LayaEngine, "english", narrow_laya)] + [
        (VON, VonEngine, "von-1.1", tiny.von(independent_options=mode)) for mode in (False, True)
    ]
    for factory, engine_type, key, path in cases:
        auto, auto_load = _built(engine_type, _spec(factory, key, path, "auto"))
        fp32 = engine_type(_spec(factory, key, path, "fp32"))
        worst = _differences(_decisions(fp32, key), _decisions(auto, key))
        assert set(worst) == set(QUESTIONS)
        assert 1e-6 < max(worst.values()) <= SERVED_BF16_TOLERANCE, (key, worst)
        assert auto_load == ("auto", "bf16", f"auto on a CPU with {units}")


def test_the_probe_falls_back_to_fp32_where_bf16_moves_a_checkpoint_too_far(
    tiny: TinyCheckpoints, on_cpu
) -> None:  # type: ignore[no-untyped-def]
    """The wide (0.5) random Laya checkpoint moves the probe past the tolerance under bf16:
    it runs fp32, answering exactly as fp32 does, and the report says why."""
    on_cpu(ZEN4)
    path = tiny.laya("english")
    auto, (requested, precision, reason) = _built(LayaEngine, _spec(LAYA, "english", path, "auto"))
    fp32 = LayaEngine(_spec(LAYA, "english", path, "fp32"))
    assert _decisions(auto, "english") == _decisions(fp32, "english")
    assert (requested, precision) == ("auto", "fp32")
    assert reason.startswith("auto on a CPU with avx512_bf16; the load probe moved")
    assert f"more than {bf16.PROBE_TOLERANCE} under bf16" in reason


def _encoder_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def test_bf16_casts_the_weights_once_at_load_and_halves_them(
    tiny: TinyCheckpoints, narrow_laya: Path, on_cpu
) -> None:  # type: ignore[no-untyped-def]
    """The encoder's linear layers and embeddings hold bf16 weights after load (a pass casts
    no weight), its norms fp32; its bytes are about half of fp32's."""
    on_cpu(ZEN4)
    from decidealot.providers.laya.worker.model import load_checkpoint
    from decidealot.providers.von.worker.model import VonModel

    cpu_device = torch.device("cpu")
    laya = {p: load_checkpoint(narrow_laya, cpu_device, p).model for p in ("fp32", "bf16")}
    von_path = tiny.von(independent_options=False)
    von = {p: VonModel(von_path, cpu_device, p) for p in ("fp32", "bf16")}
    pairs = [
        (laya[p].encoder for p in ("fp32", "bf16")),
        (von[p].encoder for p in ("fp32", "bf16")),
    ]
    for fp32, lowered in pairs:
        linears = [m for m in lowered.modules() if isinstance(m, bf16.Bf16Linear)]
        assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
        assert not any(isinstance(m, torch.nn.Linear) for m in lowered.modules())
        norms = [m for m in lowered.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert all(m.weight.dtype == torch.float32 for m in norms)
        assert lowered.embeddings.tok_embeddings.weight.dtype == torch.bfloat16
        assert _encoder_bytes(lowered) <= 0.55 * _encoder_bytes(fp32)
    # the readout stays fp32: Laya's scorer, Von's scorer
    assert laya["bf16"].scorer[1].weight.dtype == torch.float32
    assert von["bf16"].scorer.dense.weight.dtype == torch.float32


def test_bf16_answers_come_back_as_fp32_numbers(narrow_laya: Path, on_cpu) -> None:  # type: ignore[no-untyped-def]
    """Readout and softmax in fp32: the probabilities of a bf16 answer are not bf16's 8-bit
    values (their sum is 1 to fp32's rounding, not bf16's)."""
    on_cpu(ZEN4)
    engine = LayaEngine(_spec(LAYA, "english", narrow_laya, "bf16"))
    (decision, *_) = _decisions(engine, "english")
    answer = msgspec.to_builtins(decision.answers["team"])
    assert abs(sum(answer["probabilities"].values()) - 1.0) < 1e-5
