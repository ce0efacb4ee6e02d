"""Test launcher: the production server (`decidealot.http.server.serve`) over fake providers.

`python -m tests.server` reads the settings from the environment exactly like
`decidealot serve`, builds one fake per configured provider (tests/test_providers.py) and
serves on DECIDEALOT_HOST:DECIDEALOT_PORT. Fakes stay in tests/; nothing in the shipped
package knows about them.
"""

from __future__ import annotations

from decidealot import config, logs
from decidealot.http.server import run
from decidealot.service import Service
from tests.test_providers import build


def main() -> None:
    settings = config.from_env()
    logs.configure(settings.log_level, settings.log_format)
    run(Service(settings, build(settings)))


if __name__ == "__main__":
    main()
