"""One name, one meaning: no class name, and no public module-level function name, is defined in
two modules of the package for two different things.

Two classes of one name make every reader (and every `import`) ask which one is meant; a frame
and a planner's pass, a metrics protocol and the residency it describes, were such pairs. The
walk reads every class statement of every module (nested ones included) from the source (AST),
the same tree `test_layers` reads. `SAME_ROLE` names the few pairs that are one thing in
parallel places, each with the reason; the check also runs on a planted duplicate so that it is
known to fail.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Mapping

import pytest

from tests.unit.test_layers import read_tree

SAME_ROLE: dict[str, tuple[frozenset[str], str]] = {
    "CalibrationError": (
        frozenset(
            {"decidealot.providers.laya.calibration", "decidealot.providers.von.calibration"}
        ),
        "each provider's refusal of a calibration file, one per provider folder",
    ),
    "Record": (
        frozenset({"decidealot.providers.laya.calibrate", "decidealot.providers.von.calibrate"}),
        "each provider's upstream fitting record, one per provider folder",
    ),
}
"""Class name -> (the modules allowed to define it, why it is one role there). A name defined in
exactly those modules passes; any other module that defines it fails the test."""


PROVIDER = re.compile(r"^decidealot\.providers\.(?:laya|von|clm|jev)\.")

SAME_ROLE_FUNCTIONS: dict[str, tuple[frozenset[str], str]] = {
    "main": (
        frozenset(
            {
                "decidealot.cli",
                "decidealot.mcp.stdio",
                "decidealot.providers.clm.encoder_server",
                "decidealot.providers.engine.proc",
            }
        ),
        "each program's entry point",
    ),
}
"""Function name -> (the modules allowed to define it, why). Besides these, one name in parallel
provider folders (the same module path under providers/<p>/, e.g. each engine's `create`) is
one role by construction."""


def function_names(source: str) -> set[str]:
    """The public functions a module defines at its top level."""
    return {
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    }


def duplicate_functions(modules: Mapping[str, str]) -> list[str]:
    """'name: module, module' for each public function name defined in more than one module,
    less one role in parallel provider folders and what `SAME_ROLE_FUNCTIONS` allows."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(modules.items()):
        for name in function_names(source):
            where[name].append(module)
    found = []
    for name, defined in sorted(where.items()):
        parallel = len({PROVIDER.sub("decidealot.providers.<p>.", m) for m in defined}) == 1
        allowed = SAME_ROLE_FUNCTIONS.get(name, (frozenset(), ""))[0]
        if len(defined) > 1 and not parallel and set(defined) != allowed:
            found.append(f"{name}: {', '.join(defined)}")
    return found


def class_names(source: str) -> set[str]:
    """Every class a module defines, at any depth."""
    return {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}


def duplicates(modules: Mapping[str, str]) -> list[str]:
    """'Name: module, module' for each class name defined in more than one module, less those
    `SAME_ROLE` allows."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(modules.items()):
        for name in class_names(source):
            where[name].append(module)
    found = []
    for name, defined in sorted(where.items()):
        allowed = SAME_ROLE.get(name, (frozenset(), ""))[0]
        if len(defined) > 1 and set(defined) != allowed:
            found.append(f"{name}: {', '.join(defined)}")
    return found


@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return read_tree()


def test_no_class_name_means_two_things(tree: dict[str, str]) -> None:
    found = duplicates(tree)
    assert not found, "class names defined in more than one module:\n" + "\n".join(found)


def test_a_planted_duplicate_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    planted["decidealot.executor"] += "\nclass Settings:\n    pass\n"  # decidealot.config's
    assert "Settings: decidealot.config, decidealot.executor" in duplicates(planted)


def test_every_allowed_pair_still_exists(tree: dict[str, str]) -> None:
    """An allow-list entry outlives its reason silently; each must still name real classes."""
    for name, (modules, reason) in SAME_ROLE.items():
        assert reason and len(modules) > 1, name
        for module in modules:
            assert name in class_names(tree[module]), f"{name} is no longer in {module}"


def test_no_public_function_name_means_two_things(tree: dict[str, str]) -> None:
    found = duplicate_functions(tree)
    assert not found, "public functions defined in more than one module:\n" + "\n".join(found)


def test_a_planted_function_duplicate_is_caught(tree: dict[str, str]) -> None:
    planted = dict(tree)
    planted["decidealot.executor"] += "\ndef settings() -> None:\n    pass\n"  # registry's
    assert "settings: decidealot.executor, decidealot.registry" in duplicate_functions(planted)


def test_every_allowed_function_still_exists(tree: dict[str, str]) -> None:
    for name, (modules, reason) in SAME_ROLE_FUNCTIONS.items():
        assert reason and len(modules) > 1, name
        for module in modules:
            assert name in function_names(tree[module]), f"{name} is no longer in {module}"
