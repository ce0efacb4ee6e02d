"""`decidealot serve | prepare | mcp | encoder | models`.

Every subcommand reads the settings once, from the environment; a bad value exits with status 2
and one line naming the variable. Subcommands import their heavy parts lazily.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import msgspec

from decidealot import config, logs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decidealot", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="prepare bundles, then serve HTTP on granian")
    serve.add_argument("--host", help="bind address (DECIDEALOT_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (DECIDEALOT_PORT, default 8080)")
    commands.add_parser("prepare", help="download and verify every enabled local bundle")
    commands.add_parser("models", help="print the local model catalog as JSON lines")
    commands.add_parser("mcp", help="run the MCP server (arguments pass through)", add_help=False)
    commands.add_parser(
        "encoder", help="run CLM's local encoder (arguments pass through)", add_help=False
    )
    return parser


def _settings(host: str | None, port: int | None) -> config.Settings:
    """The environment's settings, with `serve`'s flags taking precedence."""
    settings = config.from_env()
    if port is not None:
        if not 1 <= port <= 65535:
            raise config.ConfigError(f"--port: expected an integer from 1 to 65535, got {port}")
        settings = msgspec.structs.replace(settings, port=port)
    if host:
        settings = msgspec.structs.replace(settings, host=host.strip())
    return settings


def _serve(settings: config.Settings) -> int:
    if settings.local_providers:
        from decidealot.bundles import BundleError, prepare

        try:
            prepare(settings, progress=sys.stderr.isatty())
        except BundleError as exc:
            print(f"decidealot: {exc}", file=sys.stderr)
            return 1
    from decidealot.http.server import run
    from decidealot.service import Service

    run(Service(settings))


def _models(settings: config.Settings) -> int:
    from decidealot.service import local_selectors

    for provider in settings.local_providers:
        for info in local_selectors(provider):
            print(msgspec.json.encode(info).decode())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] in (["mcp"], ["encoder"]):
        passthrough = args_list[1:]
        if args_list[0] == "encoder":
            return int(importlib.import_module("providers.clm.encoder_server").main(passthrough))
        return int(importlib.import_module("decidealot.mcp").main(passthrough))
    args = _parser().parse_args(args_list)
    try:
        settings = _settings(getattr(args, "host", None), getattr(args, "port", None))
    except config.ConfigError as exc:
        print(f"decidealot: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "prepare":
        return int(importlib.import_module("decidealot.bundles").run_prepare(settings))
    return _models(settings)
