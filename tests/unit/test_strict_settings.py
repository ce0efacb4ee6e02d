"""Strict settings: a `DECIDEALOT_*` name nobody reads (a typo) and settings that contradict each
other are refused with one line naming the variable and what it should be.

The messages are `registry.from_env`'s, checked here in-process; that `serve`, `prepare` and
`mcp` each stop on them before doing anything, with that one line and exit status 2, is checked
once per command over the real command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decidealot import config, registry
from tests.support.cli import NO_LOCAL, run_cli
from tests.support.servers import ROOT

COMMANDS = ("serve", "prepare", "mcp")


def refusal(env: dict[str, str]) -> str:
    """The one-line `ConfigError` the settings in `env` are refused with."""
    with pytest.raises(config.ConfigError) as refused:
        registry.from_env(env)
    message = str(refused.value)
    assert "\n" not in message
    return message


def known_variables() -> set[str]:
    """Every DECIDEALOT_* name `registry.from_env` reads, gathered as it gathers them."""
    known: set[str] = set()
    for struct in (config.Settings, *(d.settings for d in registry.registered())):
        config.read_section(struct, {}, known)
    return known


def test_a_typo_names_the_closest_setting() -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_MAX_RESIDENT": "2"})
    assert "DECIDEALOT_MAX_RESIDENT:" in line
    assert line.endswith("the closest one is DECIDEALOT_MAX_RESIDENT_PROVIDERS")


def test_a_typo_of_a_key_never_echoes_its_value() -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_TYPESAFE_APIKEY": "sk-do-not-print"})
    assert "sk-do-not-print" not in line
    assert "DECIDEALOT_TYPESAFE_APIKEY:" in line
    assert line.endswith("DECIDEALOT_TYPESAFE_API_KEY")


def test_every_unknown_name_is_in_the_one_line() -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_PROT": "8081", "DECIDEALOT_LOGLEVEL": "debug"})
    closest = "not a Decidealot setting; the closest one is"
    assert f"DECIDEALOT_LOGLEVEL: {closest} DECIDEALOT_LOG_LEVEL; " in line
    assert line.endswith(f"DECIDEALOT_PROT: {closest} DECIDEALOT_PORT")


def test_jev_enabled_without_a_typesafe_key() -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_JEV_ENABLED": "true"})
    assert "DECIDEALOT_JEV_ENABLED=true needs DECIDEALOT_TYPESAFE_API_KEY" in line


def test_a_checkpoint_for_a_disabled_provider(tmp_path: Path) -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_VON_CHECKPOINT": str(tmp_path)})
    assert line.endswith("DECIDEALOT_VON_CHECKPOINT is set but DECIDEALOT_VON_ENABLED=false")
    line = refusal({"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT": "."})
    assert line.endswith(
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT is set but DECIDEALOT_LAYA_ENABLED=false"
    )


def test_a_clm_head_without_an_encoder(tmp_path: Path) -> None:
    head = tmp_path / "head.pt"
    head.write_bytes(b"")
    line = refusal(NO_LOCAL | {"DECIDEALOT_CLM_HEAD": str(head)})
    assert "DECIDEALOT_CLM_HEAD is set but CLM is off" in line
    assert "DECIDEALOT_CLM_EMBEDDINGS_URL" in line


def test_an_empty_unknown_name_counts_as_unset() -> None:
    registry.from_env(NO_LOCAL | {"DECIDEALOT_MAX_RESIDENT": ""})


def test_a_jev_key_may_be_switched_off() -> None:
    env = {"DECIDEALOT_TYPESAFE_API_KEY": "k", "DECIDEALOT_JEV_ENABLED": "0"}
    assert "jev" not in [d.name for d in registry.enabled(registry.from_env(env))]
    env = {"DECIDEALOT_TYPESAFE_API_KEY": "k"}
    assert "jev" in [d.name for d in registry.enabled(registry.from_env(env))]


def test_every_settings_field_has_its_variable() -> None:
    """Every field of the core's settings and of every provider's section is a setting, read
    from the variable its name spells (tracing's, from OTEL_*, excepted)."""
    structs = [config.Settings, *(d.settings for d in registry.registered())]
    fields = {
        config.variable(name)
        for struct in structs
        for name in struct.__struct_fields__
        if name not in ("sections", "trace_exporters")
    }
    assert known_variables() == fields | set(SECRET_FILES)


SECRET_FILES = {
    "DECIDEALOT_API_KEY_FILE": (None, "api_key"),
    "DECIDEALOT_CLM_EMBEDDINGS_API_KEY_FILE": ("clm", "clm_embeddings_api_key"),
    "DECIDEALOT_TYPESAFE_API_KEY_FILE": ("jev", "typesafe_api_key"),
}
"""Every secret setting's `_FILE` twin, and the section (None: the core) and field it fills."""


@pytest.mark.parametrize(("twin", "where"), SECRET_FILES.items())
def test_every_secret_reads_from_its_file_twin(
    twin: str, where: tuple[str | None, str], tmp_path: Path
) -> None:
    (tmp_path / "key").write_text("s3cret-from-a-file\n")
    env = {twin: str(tmp_path / "key"), "DECIDEALOT_CLM_EMBEDDINGS_URL": "http://127.0.0.1:9"}
    read = registry.from_env(env)
    section, field = where
    value = getattr(read if section is None else read.sections[section], field)
    assert value in ("s3cret-from-a-file", ("s3cret-from-a-file",))
    assert "s3cret" not in repr(read)


def test_the_api_key_takes_several_keys(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("new-key\r\n\nold-key\nnew-key\n")
    from_file = registry.from_env({"DECIDEALOT_API_KEY_FILE": str(tmp_path / "keys")})
    assert from_file.api_key == ("new-key", "old-key")
    listed = registry.from_env({"DECIDEALOT_API_KEY": " new-key, old-key ,"})
    assert listed.api_key == ("new-key", "old-key")
    assert "key" not in repr(listed).replace("api_key", "")
    assert refusal({"DECIDEALOT_API_KEY": ",, ,"}) == (
        "DECIDEALOT_API_KEY: expected one or more keys, one per line or comma-separated"
    )
    assert refusal({"DECIDEALOT_API_KEY": "a-key,b key"}) == (
        "DECIDEALOT_API_KEY: expected printable characters with no whitespace"
    )


@pytest.mark.parametrize("twin", SECRET_FILES)
def test_a_secret_and_its_twin_are_refused_together(twin: str, tmp_path: Path) -> None:
    (tmp_path / "key").write_text("from-a-file")
    secret = twin.removesuffix("_FILE")
    env = {secret: "in-the-environment", twin: str(tmp_path / "key")}
    env["DECIDEALOT_CLM_EMBEDDINGS_URL"] = "http://127.0.0.1:9"
    assert refusal(env) == f"{secret} and {twin} are both set: set one of them"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read {path!r}: Is a directory"),
        ("", "{path!r} is empty"),
        (" \n", "{path!r} is empty"),
        (b"\xff\xfe", "{path!r} is not UTF-8 text"),
        ("a key\n", "expected printable characters with no whitespace"),
    ],
)
def test_a_key_file_that_cannot_be_used_is_refused_naming_it(
    content: str | bytes | None, problem: str, tmp_path: Path
) -> None:
    path = tmp_path if content is None else tmp_path / "key"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    message = refusal({"DECIDEALOT_TYPESAFE_API_KEY_FILE": str(path)})
    assert message == "DECIDEALOT_TYPESAFE_API_KEY_FILE: " + problem.format(path=str(path))
    assert "a key" not in message


@pytest.mark.parametrize(
    ("raw", "value"),
    [("/decide", "/decide"), ("/decide/", "/decide"), ("/a/b-c_d.e", "/a/b-c_d.e"), ("/", "")],
)
def test_the_root_path_is_a_prefix_without_its_trailing_slash(raw: str, value: str) -> None:
    settings = registry.from_env(NO_LOCAL | {"DECIDEALOT_ROOT_PATH": raw})
    assert settings.root_path == value


@pytest.mark.parametrize("raw", ["decide", "https://host/decide", "/de cide", "/a?b", "/a//b"])
def test_a_root_path_that_is_no_path_is_refused(raw: str) -> None:
    line = refusal(NO_LOCAL | {"DECIDEALOT_ROOT_PATH": raw})
    assert line.startswith("DECIDEALOT_ROOT_PATH: expected a path that starts with /")


def test_cors_is_off_unless_origins_are_listed() -> None:
    assert registry.from_env(NO_LOCAL).cors_origins == ()
    listed = "https://app.example, http://localhost:5173/,https://app.example"
    settings = registry.from_env(NO_LOCAL | {"DECIDEALOT_CORS_ORIGINS": listed})
    assert settings.cors_origins == ("https://app.example", "http://localhost:5173")


@pytest.mark.parametrize("raw", ["app.example", "https://app.example/path", "ftp://x", ","])
def test_an_origin_that_is_no_origin_is_refused(raw: str) -> None:
    assert refusal(NO_LOCAL | {"DECIDEALOT_CORS_ORIGINS": raw}).startswith(
        "DECIDEALOT_CORS_ORIGINS: expected "
    )


def test_every_setting_is_spelled_in_full_in_the_docs() -> None:
    docs = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"DECIDEALOT_[A-Z0-9_]*[A-Z0-9]", docs))
    assert sorted(known_variables() - documented) == []


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_stops_on_a_refused_setting_with_its_one_line(command: str) -> None:
    """Over the real command: exit 2, the one line `from_env` refuses with, no traceback, no
    key echoed, before anything starts."""
    env = NO_LOCAL | {"DECIDEALOT_TYPESAFE_APIKEY": "sk-do-not-print"}
    result = run_cli(command, **env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    prefix = "decidealot mcp" if command == "mcp" else "decidealot"
    assert lines == [f"{prefix}: {refusal(env)}"], result.stderr[-2000:]
