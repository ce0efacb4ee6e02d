"""Test launcher: the production server (`decidealot.http.server.serve`) over fake providers.

`python -m tests.support.launcher` reads the settings from the environment exactly like
`decidealot serve`, builds one fake per configured provider (tests/support/fakes.py) and
serves on DECIDEALOT_HOST:DECIDEALOT_PORT. Fakes stay in tests/; nothing in the shipped
package knows about them.
"""

from __future__ import annotations

import os

from decidealot import config, logs, registry
from decidealot.http.server import run
from decidealot.service import Service
from tests.support.fakes import build


def settings_from_env() -> config.Settings:
    """What `decidealot serve` reads, less the DECIDEALOT_TEST_* variables the fakes read
    themselves (the strict settings would refuse them as unknown)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_TEST_")}
    return registry.from_env(env)


def main() -> None:
    settings = settings_from_env()
    logs.configure(settings.log_level, settings.log_format)
    run(Service(settings, build(settings)))


if __name__ == "__main__":
    main()
