"""Jev as the service knows it: TypeSafe's hosted models, their settings and how it is built."""

from __future__ import annotations

from typing import Annotated

from decidealot.config import ConfigError, Section, Settings, boolean, seconds, secret, setting, url
from decidealot.protocols import Provider
from decidealot.providers.jev.gateway.client import TypeSafeClient
from decidealot.providers.jev.gateway.provider import JevProvider
from decidealot.registry import ProviderDescriptor


class JevSettings(Section, frozen=True, kw_only=True):
    typesafe_api_key: Annotated[str | None, setting(secret)] = None
    jev_enabled: Annotated[bool | None, setting(boolean)] = None  # None: on when a key is set
    typesafe_base_url: Annotated[str, setting(url)] = "https://api.typesafe.ai"
    typesafe_timeout_seconds: Annotated[float, setting(seconds())] = 10.0
    typesafe_retry_seconds: Annotated[float, setting(seconds(allow_zero=True))] = 30.0


def _enabled(section: JevSettings) -> bool:
    return section.typesafe_api_key is not None and section.jev_enabled is not False


def _check(section: JevSettings) -> None:
    if section.jev_enabled and section.typesafe_api_key is None:
        raise ConfigError(
            "DECIDEALOT_JEV_ENABLED=true needs DECIDEALOT_TYPESAFE_API_KEY: "
            "Jev is TypeSafe's hosted API"
        )


def _build(settings: Settings, section: JevSettings) -> Provider:
    if not _enabled(section) or section.typesafe_api_key is None:
        raise ConfigError("DECIDEALOT_TYPESAFE_API_KEY: Jev needs a TypeSafe key")
    client = TypeSafeClient(
        base_url=section.typesafe_base_url,
        api_key=section.typesafe_api_key,
        timeout_seconds=section.typesafe_timeout_seconds,
        retry_seconds=section.typesafe_retry_seconds,
    )
    return JevProvider(client)


DESCRIPTOR = ProviderDescriptor(
    name="jev",
    order=40,
    settings=JevSettings,
    enabled=_enabled,
    switch_off="unset DECIDEALOT_TYPESAFE_API_KEY to turn Jev off",
    build=_build,
    local=False,
    check=_check,
)
