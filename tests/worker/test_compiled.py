"""Compiled passes (`DECIDEALOT_COMPILE`, providers/worker/compiled.py), in-process.

bf16 is forced (this suite's CPU may have no bf16 units: torch emulates them, slowly, which
the tiny checkpoints afford). Each engine's compile is what its worker's compile thread runs
(`compile_next`); one compile per engine kind per module (tens of seconds on two cores), in a
cache folder of the module's own, so the first compile of each finds nothing cached.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from decidealot import registry
from decidealot.config import ConfigError
from decidealot.jobs import CheckpointLoad, EngineSpec
from decidealot.providers.laya.worker.engine import LayaEngine
from decidealot.providers.von.worker.engine import VonEngine
from decidealot.providers.worker import compiled
from tests.support.checkpoints import TinyCheckpoints
from tests.worker.test_bf16 import LAYA, NARROW, VON, _decisions
from tests.worker.test_precision import QUESTIONS, _differences, _jobs

Built = tuple[Any, list[CheckpointLoad]]

needs_cxx = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX") or "g++") is None,
    reason="no C++ compiler (CXX, else g++): inductor cannot compile CPU kernels here",
)


def _engine(kind: str, path: Path, cache: Path, **options: str) -> Built:
    """A Laya (`english`) or Von engine preloading `path` in bf16, and its reported loads."""
    factory, engine_type, key = {
        "laya": (LAYA, LayaEngine, "english"),
        "von": (VON, VonEngine, "von-1.1"),
    }[kind]
    spec = EngineSpec(
        factory,
        {key: str(path)},
        preload=[key],
        options={"precision": "bf16", "compile": "auto", "compile_cache": str(cache), **options},
    )
    loads: list[CheckpointLoad] = []
    return engine_type(spec, loads.append), loads


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compiled")


@pytest.fixture(scope="module")
def laya_path(tiny: TinyCheckpoints) -> Path:
    return tiny.laya("english", shape=NARROW)  # bf16 passes its probe


@pytest.fixture(scope="module")
def compiled_laya(laya_path: Path, cache: Path) -> Built:
    engine, loads = _engine("laya", laya_path, cache)
    assert engine.compile_next() and not engine.compile_next()  # one checkpoint, once
    return engine, loads


def _shapes_recompile(engine: Any, key: str) -> int:
    """Graphs torch compiles anew when the jobs' passes (new shapes: rows, tokens, markers)
    run through the compiled module itself, which may compile (served, it never does): 0 when
    the warm-up's graphs cover them."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    for job in _jobs(key):
        prepared = engine.prepare(job)
        model = engine._model(key) if isinstance(engine, VonEngine) else prepared.group
        assert model.passes.compiled
        model.option_logits(prepared.rows, model.passes.compiled_form)
    return counters["stats"]["unique_graphs"] - before


def assert_answers_as_eager(engine: Any, kind: str, path: Path, cache: Path) -> None:
    """Every question's answers move (the compiled pass runs) but within bf16's probe
    tolerance of an eager engine's, and the jobs' shapes compile nothing new."""
    key = {"laya": "english", "von": "von-1.1"}[kind]
    eager, _ = _engine(kind, path, cache, compile="off")
    worst = _differences(_decisions(eager, key), _decisions(engine, key))
    assert set(worst) == set(QUESTIONS)
    assert 0 < max(worst.values()) <= compiled.TOLERANCE, worst
    assert _shapes_recompile(engine, key) == 0


@needs_cxx
@pytest.mark.slow  # a compile: tens of seconds
def test_a_compiled_laya_pass_answers_as_eager_within_the_probe_tolerance(
    compiled_laya: Built, laya_path: Path, cache: Path
) -> None:
    """Swapped in after its check, reported once more; answers move (it really runs) but stay
    within bf16's probe tolerance of eager's; two graphs (several rows, one row) cover every
    shape the jobs bring, so none compiles again."""
    engine, loads = compiled_laya
    first, last = loads
    assert (first.passes, first.compile_state) == ("eager", "compiling")
    assert (last.passes, last.compile_state) == ("compiled", "compiled")
    assert (last.compiled_graphs, last.cached_graphs) == (2, 0)
    assert "0 of 2 graphs from the cache" in last.compile_reason
    (folder,) = cache.iterdir()
    assert folder.name.startswith("torch-" + torch.__version__.replace("+", "-"))
    assert_answers_as_eager(engine, "laya", laya_path, cache)


@needs_cxx
@pytest.mark.slow  # a compile: tens of seconds
def test_a_compiled_von_pass_answers_as_eager_within_the_probe_tolerance(
    tiny: TinyCheckpoints, cache: Path
) -> None:
    path = tiny.von(independent_options=True)  # Von's per-option masks and positions
    engine, loads = _engine("von", path, cache)
    assert engine.compile_next()
    assert (loads[-1].passes, loads[-1].compiled_graphs) == ("compiled", 2), loads[-1]
    assert_answers_as_eager(engine, "von", path, cache)


@needs_cxx
@pytest.mark.slow  # a compile (from the module's cache)
def test_a_compiled_pass_that_fails_its_check_leaves_eager_serving(
    compiled_laya: Built, laya_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "TOLERANCE", -1.0)  # any move at all fails it
    engine, loads = _engine("laya", laya_path, cache)
    assert engine.compile_next()
    assert (loads[-1].passes, loads[-1].compile_state) == ("eager", "probe_failed")
    assert "moved warm-up probabilities by" in loads[-1].compile_reason
    eager, _ = _engine("laya", laya_path, cache, compile="off")
    assert _decisions(engine, "english") == _decisions(eager, "english")  # eager, bit for bit


def test_a_compile_that_raises_leaves_eager_serving_and_says_why(
    laya_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    intervals = []

    def refuse(*args: object, **kwargs: object) -> None:
        intervals.append(sys.getswitchinterval())
        raise RuntimeError("inductor refused")

    monkeypatch.setattr(torch, "compile", refuse)
    engine, loads = _engine("laya", laya_path, cache)
    before = sys.getswitchinterval()
    with caplog.at_level(logging.WARNING, "decidealot.worker"):
        assert engine.compile_next()
    # the compile ran with short switches, so a pass got the lock back at once; then as before
    assert intervals == [pytest.approx(compiled.SWITCH_SECONDS)]
    assert sys.getswitchinterval() == before
    assert (loads[-1].passes, loads[-1].compile_state) == ("eager", "failed")
    assert "RuntimeError" in loads[-1].compile_reason
    assert "compiling a pass raised RuntimeError" in caplog.text
    assert "inductor refused" not in caplog.text  # types and places, never messages


@pytest.mark.parametrize(
    ("options", "state", "reason"),
    [
        ({"compile": "off"}, "off", "DECIDEALOT_COMPILE=off"),
        ({"precision": "fp32"}, "eager_precision", "fp32 stays eager"),
    ],
    ids=["off", "fp32"],
)
def test_off_and_fp32_stay_eager_and_say_why(
    laya_path: Path, cache: Path, options: dict[str, str], state: str, reason: str
) -> None:
    engine, (load,) = _engine("laya", laya_path, cache, **options)
    assert (load.passes, load.compile_state) == ("eager", state)
    assert load.compile_reason.startswith(reason)
    assert not engine.compile_next()  # nothing waits for a compile


def test_without_a_cxx_compiler_passes_run_eager_and_it_is_said_once(
    laya_path: Path,
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No `CXX`, and no g++ on PATH: what inductor finds is nothing."""
    import torch._inductor.config as inductor
    from torch._inductor import cpp_builder

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(inductor.cpp, "cxx", (None, "g++"))  # as read with CXX unset
    monkeypatch.setattr(compiled, "_compiler", [])  # not looked up yet in this process
    cpp_builder.cpp_compiler_search.cache_clear()  # nor by inductor
    try:
        with caplog.at_level(logging.WARNING, "decidealot.worker"):
            for _ in range(2):
                engine, loads = _engine("laya", laya_path, cache)
                assert engine.compile_next()
                assert (loads[-1].passes, loads[-1].compile_state) == ("eager", "no_compiler")
    finally:
        cpp_builder.cpp_compiler_search.cache_clear()
    assert caplog.text.count("no C++ compiler found") == 1


def test_an_unwritable_cache_folder_means_no_cache_logged_once(
    laya_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "models" / "compiled"
    root.parent.mkdir()
    root.write_text("a file where the folder would be")  # unwritable as a folder, even to root
    with caplog.at_level(logging.WARNING, "decidealot.worker"):
        for _ in range(2):
            assert compiled.cache_folder(str(root), str(laya_path), "cpu") is None
    assert caplog.text.count("compiled passes are not cached") == 1


def test_the_cache_folder_is_keyed_by_torch_cpu_and_checkpoint(
    laya_path: Path, tiny: TinyCheckpoints, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    here = compiled.cache_folder(root, str(laya_path), "cpu")
    assert here == compiled.cache_folder(root, str(laya_path), "cpu")  # stable
    other = tiny.laya("english", shape=NARROW, seed=1)
    assert compiled.cache_folder(root, str(other), "cpu") != here
    monkeypatch.setattr(compiled.cpu, "flags", lambda: frozenset({"avx512_bf16"}))
    assert compiled.cache_folder(root, str(laya_path), "cpu") != here
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert compiled.cache_folder(root, str(laya_path), "cpu") != here


def test_the_setting_is_auto_by_default_and_a_bad_value_is_refused_naming_it() -> None:
    assert registry.from_env({}).compile == "auto"
    assert registry.from_env({"DECIDEALOT_COMPILE": "off"}).compile == "off"
    with pytest.raises(ConfigError, match="DECIDEALOT_COMPILE: expected one of auto, off"):
        registry.from_env({"DECIDEALOT_COMPILE": "always"})
