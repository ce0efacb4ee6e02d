"""What a wheel of the project installs: one top-level package, every module under one name.

The repository keeps `providers/` and `bundles/` beside `decidealot/`; pyproject.toml ships them
as `decidealot.providers` and `decidealot.bundles`. A wheel built from a copy of the sources is
installed into an empty folder, and that folder alone (the interpreter started with -P, so the
checkout is not on the path) serves the registry, the manifests and the worker module.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.servers import ROOT

SOURCES = ("decidealot", "providers", "bundles")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, copy / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for source in SOURCES:
        shutil.copytree(ROOT / source, copy / source, ignore=skip)
    out = tmp_path_factory.mktemp("wheel")
    build = f"from setuptools import build_meta as b; print(b.build_wheel({str(out)!r}))"
    result = subprocess.run(
        [sys.executable, "-c", build], cwd=copy, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out / result.stdout.strip().splitlines()[-1]


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"decidealot", "decidealot-0.1.0.dist-info"}, tops


def test_every_package_folder_ships_under_its_installed_name(wheel: Path) -> None:
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    for source, installed in (
        ("decidealot", "decidealot"),
        ("providers", "decidealot/providers"),
        ("bundles", "decidealot/bundles"),
    ):
        for path in (ROOT / source).rglob("*.py"):
            name = f"{installed}/{path.relative_to(ROOT / source).as_posix()}"
            assert name in shipped, f"{path.relative_to(ROOT)} is not in the wheel"
    manifests = {p.name for p in (ROOT / "bundles").glob("*.json")}
    assert {f"decidealot/bundles/{m}" for m in manifests} <= set(zipfile.ZipFile(wheel).namelist())


def test_the_installed_package_alone_serves_the_registry_and_the_worker(
    wheel: Path, tmp_path: Path
) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
        check=True,
        timeout=300,
    )
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import decidealot, decidealot.providers\n"
        "from decidealot import registry\n"
        "from decidealot.checkpoints.paths import SHIPPED_MANIFESTS, every_bundle\n"
        "assert decidealot.__file__.startswith(sys.argv[1]), decidealot.__file__\n"
        "assert decidealot.providers.__file__.startswith(sys.argv[1])\n"
        "print(','.join(d.name for d in registry.registered()))\n"
        "assert all((SHIPPED_MANIFESTS / f'{p.name}.json').is_file() for p in every_bundle())\n"
    )
    listed = subprocess.run(
        [sys.executable, "-P", "-c", probe, str(target)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert listed.stdout.strip() == "laya,von,clm,jev"
    worker = subprocess.run(
        [sys.executable, "-P", "-m", "decidealot.providers.engine"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        input=b"",
        capture_output=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]  # the end of stdin ends it cleanly
