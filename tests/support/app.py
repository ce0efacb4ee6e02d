"""The production app in-process over the fake providers: Litestar's test client, no socket.

`in_process` builds the app as `decidealot serve` does (`create_app(Service(...))`, the gateway
layer included) over one fake per configured provider (tests/support/fakes.py), with settings
read by `registry.from_env` from a mapping, and runs its lifespan (startup, shutdown) for the
`with` block. `app_fixture` makes a module fixture of it. Tests whose point is a real socket or
process (a client hanging up, SIGTERM, granian) start a server with tests/support/servers.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from litestar.types import ASGIApp

from decidealot import registry
from decidealot.http.app import create_app
from decidealot.service import Service
from tests.support import fakes
from tests.support.servers import GATEWAY

__all__ = ["GATEWAY", "InProcessApp", "app_fixture", "in_process"]


@dataclass
class InProcessApp:
    """The app under Litestar's `TestClient` (requests go straight to the ASGI app; the client
    is safe to use from several threads at once), its service and the fakes' event file."""

    client: TestClient[ASGIApp]
    service: Service
    events_file: Path

    def events(self) -> list[dict[str, Any]]:
        """The fakes' calls so far (provider, selector, tag, start, end), in order."""
        return fakes.read_events(self.events_file)


@contextmanager
def in_process(
    folder: Path, *, hosted: tuple[str, ...] = ("jev-latest", "jev-1.13.0", "von"), **env: str
) -> Iterator[InProcessApp]:
    """The app with the DECIDEALOT_* settings `env` (nothing else: the process's environment
    is not read) and the fake TypeSafe catalog `hosted`, started; the fakes' files in `folder`.
    The fakes read DECIDEALOT_TEST_EVENTS and DECIDEALOT_TEST_JEV_CATALOG from os.environ when
    called, so both are set for the block and restored after it."""
    folder.mkdir(parents=True, exist_ok=True)
    events, catalog = folder / "events.jsonl", folder / "jev.json"
    catalog.write_text(json.dumps(list(hosted)))
    settings = registry.from_env({"DECIDEALOT_MODEL_DIR": str(folder / "models"), **env})
    service = Service(settings, fakes.build(settings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DECIDEALOT_TEST_EVENTS", str(events))
        patch.setenv("DECIDEALOT_TEST_JEV_CATALOG", str(catalog))
        with TestClient(create_app(service)) as client:
            yield InProcessApp(client, service, events)


def app_fixture(name: str, **env: str) -> Callable[..., Iterator[InProcessApp]]:
    """A module-scoped fixture called `name`: `in_process(..., **env)` for one test module
    (assign it to `name` there: `gateway = app_fixture("gateway", **GATEWAY)`)."""

    @pytest.fixture(scope="module", name=name)
    def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
        with in_process(tmp_path_factory.mktemp(name), **env) as app:
            yield app

    return started
