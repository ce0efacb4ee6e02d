"""`decidealot serve | prepare | mcp | encoder | models | calibrate | evaluate | checkpoints`.
Each reads the settings once, from the environment (a bad value: status 2 and one line naming
the variable), and imports its heavy parts lazily."""

from __future__ import annotations

import argparse
import errno
import os
import pkgutil
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from decidealot import config, logs, registry
from decidealot.evaluate import options as evaluate_options

TINY_NOTE = (
    "random weights, so answers carry no meaning; for smoke tests, client CI and trying the API "
    "offline"
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decidealot", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="check device and checkpoints, prepare bundles, then serve HTTP on granian"
    )
    serve.add_argument("--host", help="bind address (DECIDEALOT_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (DECIDEALOT_PORT, default 8080)")
    commands.add_parser(
        "prepare", help="download and verify every enabled local bundle, check every checkpoint"
    )
    commands.add_parser("models", help="print the local model catalog as JSON lines")
    checkpoints = commands.add_parser("checkpoints", help="write checkpoints for trying offline")
    kinds = checkpoints.add_subparsers(dest="kind", required=True)
    tiny = kinds.add_parser("tiny", help=f"random checkpoints of every local model ({TINY_NOTE})")
    tiny.add_argument("directory", help="where to write them (created)")
    calibrate = commands.add_parser(
        "calibrate",
        help="fit a checkpoint's confidence on labelled rows, in its upstream package's format",
        description="Fit a local checkpoint's temperatures on labelled rows (JSON lines in "
        "von calibrate's format) with its upstream package's method, write the calibration "
        "file in that package's format, and report log-loss, Brier score and ECE before and "
        "after on held-out rows. Runs the model in this process; no server.",
    )
    calibrate.add_argument("labels", help="JSON lines: {state, question, gold} per row")
    calibrate.add_argument(
        "--model", required=True, help="the checkpoint: a selector naming one (laya-english, von)"
    )
    calibrate.add_argument(
        "--out", help="where to write the file (default: calibration-<checkpoint>.json here)"
    )
    calibrate.add_argument("--plot", help="draw a reliability diagram (before, after) as a PNG")
    calibrate.add_argument("--folds", type=int, default=5, help="held-out folds (default 5)")
    calibrate.add_argument("--seed", type=int, default=0, help="fold split and fit seed")
    evaluate_options.add_parser(commands)
    commands.add_parser("mcp", help="run the MCP server (arguments pass through)", add_help=False)
    commands.add_parser(
        "encoder", help="run CLM's local encoder (arguments pass through)", add_help=False
    )
    return parser


def _settings(host: str | None, port: int | None) -> config.Settings:
    """The environment's settings, with `serve`'s flags taking precedence."""
    settings = registry.from_env()
    if port is not None:
        if not 1 <= port <= 65535:
            raise config.ConfigError(f"--port: expected an integer from 1 to 65535, got {port}")
        settings = msgspec.structs.replace(settings, port=port)
    if host:
        settings = msgspec.structs.replace(settings, host=host.strip())
    config.check_ports(settings.port, settings.probe_port)
    return settings


def _failed(exc: Exception) -> int:
    """Tell `exc` in one line; the exit status: 2 for a refused setting, 1 for the rest."""
    print(f"decidealot: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, config.ConfigError) else 1


def _serve_or_prepare(settings: config.Settings, command: str) -> int:
    """The checks before listening (`prepare` re-hashes every installed file), then `serve`
    serves; `prepare` prints where each checkpoint is."""
    from decidealot import preflight

    try:
        progress = sys.stderr.isatty()
        preflight.ready_to_serve(settings, progress=progress, rehash=command == "prepare")
    except preflight.ERRORS as exc:
        return _failed(exc)
    if command == "prepare":
        from decidealot.checkpoints.paths import enabled_bundles

        for placed in enabled_bundles(settings):
            print(f"{placed.name}: {placed.path(settings)}")
        return 0
    from decidealot.http.server import run
    from decidealot.service import Service

    run(Service(settings))
    return 0


def _tiny_checkpoints(directory: str) -> int:
    """`decidealot checkpoints tiny DIR`: random checkpoints of every local model, and the
    variables that use them, as shell lines (`eval "$(decidealot checkpoints tiny DIR)"`)."""
    from decidealot.providers.tiny import write_checkpoints

    root = Path(directory).expanduser().resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
        written = write_checkpoints(root)
    except OSError as exc:
        fix = ""
        if exc.errno in (errno.EACCES, errno.EPERM):
            from decidealot.checkpoints.paths import ownership_fix

            fix = f". Fix: {ownership_fix(root)}"
        print(
            f"decidealot: cannot write checkpoints to {root}: {exc.strerror}{fix}", file=sys.stderr
        )
        return 1
    print(f"# Random checkpoints of every local model in {root}: {TINY_NOTE}")
    for descriptor, paths in written:
        assert descriptor.tiny is not None
        needs = descriptor.tiny.needs
        if needs:
            print(f"# {needs}:")
        variables = {bundle.name: bundle.variable for bundle in descriptor.bundles}
        for name, path in paths.items():
            print(f"{'# ' if needs else ''}export {variables[name]}={shlex.quote(str(path))}")
    return 0


def _calibration_target(
    settings: config.Settings, selector: str
) -> tuple[registry.Descriptor, registry.Calibration]:
    """The enabled local checkpoint `selector` names alone, and its calibration setting."""
    offered = []
    for descriptor in registry.enabled_local(settings):
        for calibration in descriptor.calibrations:
            if selector in calibration.selectors:
                return descriptor, calibration
            offered += calibration.selectors
        if selector in {info.name for info in descriptor.selectors}:
            raise config.ConfigError(
                f"--model {selector}: it routes each request to one of several checkpoints; "
                f"a calibration is fitted for one: {', '.join(offered)}"
            )
    raise config.ConfigError(
        f"--model {selector}: not an enabled local checkpoint that takes a calibration file "
        f"(these do: {', '.join(offered) or 'none is enabled'})"
    )


def _calibrate(settings: config.Settings, args: argparse.Namespace) -> int:
    from decidealot import preflight
    from decidealot.device import resolve_device
    from decidealot.validation.labels import LabelError, read_labels

    try:
        if args.folds < 2:
            raise config.ConfigError("--folds: expected an integer of at least 2")
        descriptor, calibration = _calibration_target(settings, args.model)
        labels = read_labels(Path(args.labels))
        preflight.check_device(settings)
        checkpoint = preflight.checked_checkpoint(settings, calibration.bundle)
        preflight.raise_all(preflight.calibration_problems(settings))
    except (*preflight.ERRORS, LabelError) as exc:
        return _failed(exc)
    from decidealot.providers.calibrate import Setup, plot, report, write_fitted

    out = Path(args.out or f"calibration-{calibration.bundle}.json").expanduser().resolve()
    current = descriptor.calibration_files(descriptor.of(settings)).get(calibration.key)

    def progress(done: int, total: int) -> None:
        if total > 1:
            print(f"decidealot calibrate: {done}/{total} rows", file=sys.stderr, flush=True)

    setup = Setup(
        checkpoint=checkpoint,
        key=calibration.key,
        current=None if current is None else Path(current),
        labels=labels,
        labels_path=Path(args.labels),
        device=resolve_device(settings),
        precision=settings.precision,
        torch_threads=settings.torch_threads,
        folds=args.folds,
        seed=args.seed,
        progress=progress,
    )
    try:
        outcome = pkgutil.resolve_name(descriptor.calibrator)(setup)
    except ValueError as exc:
        return _failed(exc)
    write_fitted(out, outcome.body)
    for line in report(outcome, out):
        print(line)
    if args.plot and outcome.gold:
        plot(Path(args.plot), outcome)
        print(f"drew {args.plot}")
    print(f"use it: export {config.variable(calibration.setting)}={shlex.quote(str(out))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. A reader that leaves early (`decidealot checkpoints tiny DIR | head`)
    ends it quietly with status 1, as Python's own guidance has it, not with a traceback."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # inside the try: what is still buffered may meet the closed pipe
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 1
    return status


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] in (["mcp"], ["encoder"]):
        passthrough = args_list[1:]
        if args_list[0] == "encoder":
            from decidealot.providers.clm.encoder_server import main as encoder

            return int(encoder(passthrough))
        from decidealot.mcp.stdio import main as mcp

        return int(mcp(passthrough))
    args = _parser().parse_args(args_list)
    if args.command == "checkpoints":
        return _tiny_checkpoints(args.directory)
    try:
        settings = _settings(getattr(args, "host", None), getattr(args, "port", None))
    except config.ConfigError as exc:
        return _failed(exc)
    logs.configure(settings.log_level, settings.log_format)
    if args.command in ("serve", "prepare"):
        return _serve_or_prepare(settings, args.command)
    if args.command == "calibrate":
        return _calibrate(settings, args)
    if args.command == "evaluate":
        from decidealot.evaluate.command import evaluate_command

        return evaluate_command(settings, args)
    for descriptor in registry.enabled_local(settings):  # models
        for info in descriptor.selectors:
            print(msgspec.json.encode(info).decode())
    return 0
