"""The package's layers, read from the code: every import goes down (or sideways, without a
cycle), and torch stays in the worker.

`LAYERS` is the one statement of the architecture's import rules (docs/architecture.md points
here): each layer names its modules and the layers it may import. The walk reads every import
of every module, at module level or inside a function, from the source (AST), so a lazy import
cannot hide a dependency. Three checks, each also run on a planted violation so that it is known
to fail: no import into a layer that is not allowed, no import cycle between modules or between
subpackages, and no torch (or its kin) outside the worker process's layers.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.support.servers import ROOT

SOURCES = {
    "decidealot": ROOT / "decidealot",
    "decidealot.providers": ROOT / "providers",
    "decidealot.bundles": ROOT / "bundles",
}
"""Installed package name -> the folder it ships from (pyproject.toml's package-dir)."""

LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # layer: (its modules, as fnmatch patterns; the layers it may import besides its own)
    "base": (
        (
            "decidealot",
            "decidealot.bundles",
            "decidealot.config",
            "decidealot.contract",
            "decidealot.cpu",
            "decidealot.device",
            "decidealot.errors",
            "decidealot.jobs",
            "decidealot.logs",
            "decidealot.metrics",
            "decidealot.protocols",
            "decidealot.registry",
            "decidealot.tracing",
        ),
        (),
    ),
    "provider shared": (
        ("decidealot.providers", "decidealot.providers.*", "decidealot.providers.clm.render"),
        ("base",),
    ),
    "worker": (
        (
            "decidealot.providers.engine.core",
            "decidealot.providers.engine.planner",
            "decidealot.providers.engine.proc",
            "decidealot.providers.engine.__main__",
            "decidealot.providers.worker",
            "decidealot.providers.worker.*",
            "decidealot.providers.*.worker",
            "decidealot.providers.*.worker.*",
        ),
        ("base", "provider shared"),
    ),
    "provider gateway": (
        (
            "decidealot.providers.engine.client",
            "decidealot.providers.gateway*",
            "decidealot.providers.*.gateway*",
            "decidealot.providers.*.descriptor",
        ),
        ("base", "provider shared"),
    ),
    "tools": (
        (
            "decidealot.providers.tiny",
            "decidealot.providers.*.tiny",
            "decidealot.providers.clm.encoder_server",
            "decidealot.providers.engine.inprocess",
            "decidealot.providers.calibrate",
            "decidealot.providers.plots",
            "decidealot.providers.*.calibrate",
        ),
        ("base", "provider shared", "worker", "provider gateway"),
    ),
    "core": (
        (
            "decidealot.catalog",
            "decidealot.residency",
            "decidealot.executor",
            "decidealot.ledger",
            "decidealot.checkpoints*",
            "decidealot.preflight",
        ),
        ("base",),
    ),
    "contract": (("decidealot.validation*", "decidealot.schema"), ("base", "core")),
    "service": (("decidealot.service",), ("base", "core")),
    "transport": (
        ("decidealot.asgi*", "decidealot.http*", "decidealot.mcp*"),
        ("base", "core", "contract", "service"),
    ),
    "entry": (
        ("decidealot.cli", "decidealot.__main__", "decidealot.evaluate*"),
        ("base", "core", "contract", "service", "transport", "tools"),
    ),
}

WORKER_SIDE = ("worker", "tools")
"""The layers whose modules run in a worker (or a tool's own) process: only they may import
`HEAVY`. Everything else runs in the gateway, which never imports torch."""
HEAVY = ("torch", "transformers", "safetensors", "tokenizers", "sentence_transformers", "numpy")


def layer_of(module: str) -> str:
    """The layer `module` belongs to: its most specific pattern wins."""
    matches = [
        (len(pattern.replace("*", "")), name)
        for name, (patterns, _) in LAYERS.items()
        for pattern in patterns
        if fnmatch.fnmatchcase(module, pattern)
    ]
    if not matches:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return max(matches)[1]


def read_tree() -> dict[str, str]:
    """Module name -> source, for every module the package installs."""
    modules: dict[str, str] = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path.read_text()
    return modules


def imports(module: str, source: str, modules: Mapping[str, str]) -> Iterator[tuple[str, int]]:
    """(imported name, line) for every import in `source`: our modules as the most specific
    module named, anything else as its top-level name."""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    for base, names, level, line in _statements(source):
        if level:
            anchor = package.rsplit(".", level - 1)[0]
            base = f"{anchor}.{base}" if base else anchor
        for name in names:
            yield _ours(f"{base}.{name}" if base else name, modules), line


@functools.cache
def _statements(source: str) -> tuple[tuple[str, tuple[str, ...], int, int], ...]:
    """Every import statement of `source` as (module or "", names, level, line); parsed once."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.append(("", tuple(alias.name for alias in node.names), 0, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            found.append((node.module or "", names, node.level, node.lineno))
    return tuple(found)


def _ours(name: str, modules: Mapping[str, str]) -> str:
    """The most specific of our modules that `name` (a module, or a name in one) lies in;
    for anyone else's, its top-level package."""
    candidate = name
    while candidate:
        if candidate in modules:
            return candidate
        candidate = candidate.rpartition(".")[0]
    return name.split(".")[0]


def _is_package(module: str, modules: Mapping[str, str]) -> bool:
    return any(other.startswith(module + ".") for other in modules)


def graph(modules: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Module -> {our module it imports: the first line doing so}."""
    edges: dict[str, dict[str, int]] = {}
    for module, source in modules.items():
        targets: dict[str, int] = {}
        for name, line in imports(module, source, modules):
            if name in modules and name != module:
                targets.setdefault(name, line)
        edges[module] = targets
    return edges


def layer_violations(modules: Mapping[str, str]) -> list[str]:
    problems = []
    for module, targets in graph(modules).items():
        here = layer_of(module)
        allowed = {here, *LAYERS[here][1]}
        for target, line in targets.items():
            there = layer_of(target)
            if there not in allowed:
                problems.append(f"{module}:{line} imports {target} ({here} -> {there})")
    return problems


def heavy_violations(modules: Mapping[str, str]) -> list[str]:
    problems = []
    for module, source in modules.items():
        if layer_of(module) in WORKER_SIDE:
            continue
        for name, line in imports(module, source, modules):
            if name in HEAVY:
                problems.append(f"{module}:{line} imports {name} in the gateway")
    return problems


def cycles(edges: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def subpackage_of(module: str, modules: Mapping[str, str]) -> str:
    """The subpackage a module belongs to (a top-level module of a package is its own)."""
    return module if _is_package(module, modules) else module.rpartition(".")[0] or module


def cycle_violations(modules: Mapping[str, str]) -> list[str]:
    edges = graph(modules)
    problems = [f"modules import each other: {' <-> '.join(c)}" for c in cycles(edges)]
    packages: dict[str, dict[str, int]] = {}
    for module, targets in edges.items():
        source = subpackage_of(module, modules)
        for target in targets:
            into = subpackage_of(target, modules)
            if (
                into != source
                and not into.startswith(source + ".")
                and not source.startswith(into + ".")
            ):
                packages.setdefault(source, {})[into] = 0
    problems += [f"packages import each other: {' <-> '.join(c)}" for c in cycles(packages)]
    return problems


def violations(modules: Mapping[str, str]) -> list[str]:
    return layer_violations(modules) + heavy_violations(modules) + cycle_violations(modules)


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return read_tree()


def test_every_module_is_in_a_layer(tree: dict[str, str]) -> None:
    for module in tree:
        layer_of(module)


def test_the_package_keeps_its_layers(tree: dict[str, str]) -> None:
    assert violations(tree) == []


def test_a_planted_upward_import_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    module = "decidealot.providers.laya.gateway.router"
    planted[module] += "\nfrom decidealot.executor import Executor\n"
    found = layer_violations(planted)
    assert len(found) == 1
    assert found[0].startswith(f"{module}:") and "(provider gateway -> core)" in found[0]


def test_a_lazy_upward_import_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    planted["decidealot.residency"] += (
        "\ndef _later():\n    from decidealot.service import Service\n"
    )
    assert [p.split(" imports ")[1] for p in layer_violations(planted)] == [
        "decidealot.service (core -> service)"
    ]


def test_a_planted_cycle_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    planted["decidealot.contract"] += "\nfrom decidealot import registry\n"  # registry -> contract
    found = cycle_violations(planted)
    assert any("decidealot.contract" in p and "decidealot.registry" in p for p in found), found
    assert layer_violations(planted) == []  # both base: only the cycle gives it away


def test_a_cycle_between_subpackages_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    planted["decidealot.asgi.body"] += "\ndef _later():\n    from decidealot.mcp import strict\n"
    found = cycle_violations(planted)
    assert "packages import each other: decidealot.asgi <-> decidealot.mcp" in found


def test_torch_in_the_gateway_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    router = "decidealot.providers.laya.gateway.router"
    planted[router] += "\ndef _later():\n    import torch\n"
    line = planted[router].count("\n")
    assert heavy_violations(planted) == [f"{router}:{line} imports torch in the gateway"]


def test_the_layer_table_is_what_docs_point_at() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert "tests/unit/test_layers.py" in doc
    for layer in LAYERS:
        assert f"| {layer} |" in doc, layer


def test_the_sources_are_the_installed_packages() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package, folder in SOURCES.items():
        assert f'"{package}" = "{folder.name}"' in pyproject
    assert Path(ROOT / "bundles" / "__init__.py").exists()
