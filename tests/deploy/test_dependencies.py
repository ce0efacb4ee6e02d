"""Installs are reproducible: what the code imports is declared, what is declared is locked, the
lock leaves torch to its own wheel index, and the package builds without deprecation warnings."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("decidealot", "providers", "bundles")
LOCK = ROOT / "requirements.lock"
# Declared but imported only through another dependency; each says why it is declared anyway.
NOT_IMPORTED: dict[str, str] = {}
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def _project() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]


def _requirements(*, extras: bool = True, test: bool = True) -> list[Requirement]:
    project = _project()
    lines = list(project["dependencies"])  # type: ignore[call-overload]
    if extras:
        for extra, group in project["optional-dependencies"].items():  # type: ignore[attr-defined]
            if test or extra != "test":
                lines += group
    return [Requirement(line) for line in lines]


def _imports() -> dict[str, set[str]]:
    """Top-level modules the shipped code imports (lazily too), with the files importing them."""
    found: dict[str, set[str]] = {}
    for source in SOURCES:
        for path in (ROOT / source).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in SOURCES:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if match := _PIN.match(line):
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_every_imported_module_is_a_declared_dependency() -> None:
    provided = importlib.metadata.packages_distributions()
    declared = {canonicalize_name(r.name) for r in _requirements(test=False)}
    undeclared = {}
    for module, files in sorted(_imports().items()):
        dists = {canonicalize_name(d) for d in provided.get(module, [])}
        assert dists, f"{module} (imported by {sorted(files)}) is not installed"
        if not dists & declared:
            undeclared[module] = sorted(files)
    assert undeclared == {}


def test_every_runtime_dependency_is_imported() -> None:
    provided = importlib.metadata.packages_distributions()
    imported = {canonicalize_name(d) for m in _imports() for d in provided.get(m, [])}
    declared = {canonicalize_name(r.name) for r in _requirements(extras=False)}
    assert sorted(declared - imported - set(NOT_IMPORTED)) == []
    assert sorted(set(NOT_IMPORTED) & imported) == []  # an entry that became an import


def test_every_declared_requirement_is_locked() -> None:
    pins = _pins()
    ci = [
        Requirement(line)
        for line in (ROOT / ".ci" / "requirements-ci.in").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    stale = []
    for requirement in _requirements() + ci:
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        if requirement.marker and not requirement.marker.evaluate({"python_version": "3.11"}):
            continue
        pin = pins.get(name)
        if pin is None or not requirement.specifier.contains(pin, prereleases=True):
            stale.append(f"{requirement} (locked: {pin})")
    assert stale == [], "run .ci/lock"


def test_the_lock_leaves_torch_to_its_wheel_index() -> None:
    with_torch = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")
    assert sorted(name for name in _pins() if with_torch.match(name)) == []
    for script in (".ci/install", ".ci/lock"):
        assert "TORCH_VERSION:-2.13.0" in (ROOT / script).read_text(), script


def test_the_lock_check_names_what_the_lock_does_not_pin(tmp_path: Path) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("msgspec==0.0.1\n    # via decidealot\n")
    torch = importlib.metadata.version("torch").split("+")[0]
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "locked.py"), str(lock), torch],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    installed = importlib.metadata.version("msgspec")
    assert f"msgspec {installed} is installed; the lock pins 0.0.1" in result.stderr
    assert f"litestar {importlib.metadata.version('litestar')} is installed but not locked" in (
        result.stderr
    )
    assert "torch" not in result.stderr


def test_the_package_builds_with_an_spdx_license_and_no_deprecation(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    skip = shutil.ignore_patterns("__pycache__")
    for source in SOURCES:
        shutil.copytree(ROOT / source, tmp_path / source, ignore=skip)
    probe = "from setuptools import build_meta as b; print(b.prepare_metadata_for_build_wheel('.'))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Deprecat" not in result.stderr, result.stderr[-2000:]
    metadata = (tmp_path / result.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
