"""The registry: the providers the entry points name, their settings sections, and the
protocols the core holds them to (the fakes included)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

import msgspec
import pytest

from decidealot import registry
from decidealot.config import ConfigError
from decidealot.contract import ChoiceQuestion
from decidealot.protocols import HostedProvider, LocalProvider, Provider
from tests.support.fakes import _answer, build


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    registry.registered.cache_clear()
    yield
    registry.registered.cache_clear()


def test_the_project_registers_its_four_providers_in_listing_order() -> None:
    assert [d.name for d in registry.registered()] == ["laya", "von", "clm", "jev"]
    assert [d.local for d in registry.registered()] == [True, True, True, False]
    assert registry.descriptor("von").bundles[0].variable == "DECIDEALOT_VON_CHECKPOINT"
    with pytest.raises(KeyError):
        registry.descriptor("nope")


def test_settings_route_each_field_to_its_section() -> None:
    settings = registry.settings(max_resident_providers=2, laya_enabled=False, clm_cache_size=7)
    assert settings.max_resident_providers == 2
    assert registry.descriptor("laya").of(settings).laya_enabled is False
    assert registry.descriptor("clm").of(settings).clm_cache_size == 7
    replaced = registry.replace(settings, von_enabled=False)
    assert [d.name for d in registry.enabled(replaced)] == []
    assert [d.name for d in registry.enabled(settings)] == ["von"]
    with pytest.raises(TypeError, match="not settings: nope"):
        registry.settings(nope=1)


def test_a_section_of_another_type_is_refused() -> None:
    laya = registry.descriptor("laya")
    wrong = msgspec.structs.replace(
        registry.settings(), sections={"laya": registry.descriptor("von").settings()}
    )
    with pytest.raises(TypeError, match="is not a LayaSettings"):
        laya.of(wrong)


def test_no_repr_shows_a_key() -> None:
    settings = registry.from_env(
        {
            "DECIDEALOT_API_KEY": "sk-gateway",
            "DECIDEALOT_TYPESAFE_API_KEY": "sk-typesafe",
            "DECIDEALOT_CLM_EMBEDDINGS_URL": "http://127.0.0.1:9/v1",
            "DECIDEALOT_CLM_EMBEDDINGS_API_KEY": "sk-encoder",
        }
    )
    shown = repr(settings) + "".join(repr(section) for section in settings.sections.values())
    assert "sk-" not in shown and shown.count("***") == 3


def test_a_broken_entry_point_stops_startup_naming_it(
    fresh_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = importlib.metadata.EntryPoint("fifth", "nowhere.at.all:DESCRIPTOR", "x")
    monkeypatch.setattr(registry, "_entry_points", lambda: [broken])
    with pytest.raises(ConfigError, match=r"provider 'fifth' \(nowhere.at.all:DESCRIPTOR\)"):
        registry.registered()
    impostor = importlib.metadata.EntryPoint("fifth", "decidealot.config:Settings", "x")
    monkeypatch.setattr(registry, "_entry_points", lambda: [impostor])
    with pytest.raises(ConfigError, match="is not its descriptor"):
        registry.registered()


def test_the_first_registration_of_a_name_wins(
    fresh_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As imports do: a second copy of a distribution's metadata later on the path does not
    replace the first."""
    von = importlib.metadata.EntryPoint("von", "decidealot.providers.von.descriptor:DESCRIPTOR", "")
    later = importlib.metadata.EntryPoint("von", "nowhere:DESCRIPTOR", "")
    monkeypatch.setattr(registry, "_entry_points", lambda: [von, later])
    assert [d.name for d in registry.registered()] == ["von"]


def test_fakes_follow_the_provider_protocol() -> None:
    settings = registry.settings(typesafe_api_key="k")
    fakes = build(settings)
    assert [f.name for f in fakes] == ["laya", "von", "jev"]
    assert all(isinstance(f, Provider) for f in fakes)
    assert all(isinstance(f, LocalProvider) for f in fakes)
    assert isinstance(fakes[-1], HostedProvider) and not fakes[-1].local
    assert msgspec.json.encode(_answer(ChoiceQuestion({"a": None, "b": "x"})))
