"""Strict settings over the real commands: a `DECIDEALOT_*` name nobody reads (a typo) and
settings that contradict each other stop `serve`, `prepare` and `mcp` before they do anything,
with one line naming the variable and what it should be."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from decidealot import config
from tests.test_cli import NO_LOCAL, cli

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("serve", "prepare", "mcp")


def refused(command: str, env: dict[str, str]) -> str:
    """The one stderr line of `command` started with `env`, which must exit 2."""
    result = cli(command, **env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_typo_names_the_closest_setting(command: str) -> None:
    line = refused(command, NO_LOCAL | {"DECIDEALOT_MAX_RESIDENT": "2"})
    assert "DECIDEALOT_MAX_RESIDENT:" in line
    assert line.endswith("the closest one is DECIDEALOT_MAX_RESIDENT_PROVIDERS")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_typo_of_a_key_never_echoes_its_value(command: str) -> None:
    line = refused(command, NO_LOCAL | {"DECIDEALOT_TYPESAFE_APIKEY": "sk-do-not-print"})
    assert "sk-do-not-print" not in line
    assert "DECIDEALOT_TYPESAFE_APIKEY:" in line
    assert line.endswith("DECIDEALOT_TYPESAFE_API_KEY")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_unknown_name_is_in_the_one_line(command: str) -> None:
    env = NO_LOCAL | {"DECIDEALOT_PROT": "8081", "DECIDEALOT_LOGLEVEL": "debug"}
    line = refused(command, env)
    closest = "not a Decidealot setting; the closest one is"
    assert f"DECIDEALOT_LOGLEVEL: {closest} DECIDEALOT_LOG_LEVEL; " in line
    assert line.endswith(f"DECIDEALOT_PROT: {closest} DECIDEALOT_PORT")


@pytest.mark.parametrize("command", COMMANDS)
def test_jev_enabled_without_a_typesafe_key(command: str) -> None:
    line = refused(command, NO_LOCAL | {"DECIDEALOT_JEV_ENABLED": "true"})
    assert "DECIDEALOT_JEV_ENABLED=true needs DECIDEALOT_TYPESAFE_API_KEY" in line


@pytest.mark.parametrize("command", COMMANDS)
def test_a_checkpoint_for_a_disabled_provider(command: str, tmp_path: Path) -> None:
    line = refused(command, NO_LOCAL | {"DECIDEALOT_VON_CHECKPOINT": str(tmp_path)})
    assert line.endswith("DECIDEALOT_VON_CHECKPOINT is set but DECIDEALOT_VON_ENABLED=false")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_clm_head_without_an_encoder(command: str, tmp_path: Path) -> None:
    head = tmp_path / "head.pt"
    head.write_bytes(b"")
    line = refused(command, NO_LOCAL | {"DECIDEALOT_CLM_HEAD": str(head)})
    assert "DECIDEALOT_CLM_HEAD is set but CLM is off" in line
    assert "DECIDEALOT_CLM_EMBEDDINGS_URL" in line


def test_an_empty_unknown_name_counts_as_unset() -> None:
    result = cli("models", **NO_LOCAL, DECIDEALOT_MAX_RESIDENT="")
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_jev_key_may_be_switched_off() -> None:
    settings = config.from_env({"DECIDEALOT_TYPESAFE_API_KEY": "k", "DECIDEALOT_JEV_ENABLED": "0"})
    assert not settings.jev_active


def test_every_settings_field_has_its_read_line() -> None:
    fields = {
        "DECIDEALOT_" + f.name.upper()
        for f in msgspec.structs.fields(config.Settings)
        if f.name not in config.FROM_OTEL
    }
    assert config.known_variables() == fields


def test_every_setting_is_spelled_in_full_in_the_docs() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"DECIDEALOT_[A-Z0-9_]*[A-Z0-9]", docs))
    assert sorted(config.known_variables() - documented) == []
