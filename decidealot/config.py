"""The service's settings: how a `DECIDEALOT_*` variable is declared, parsed and checked.

A setting is a frozen msgspec struct's field annotated with `setting(parse)`, its variable
`DECIDEALOT_` + the name in capitals (the core's, and providers' in `Settings.sections`). Nothing
else reads the environment (but OpenTelemetry, OTEL_*), so an undeclared name is refused as a typo.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin

import msgspec

from decidealot import cpu

Parse = Callable[[str, str], object]  # `parse(variable, raw)`: the value, or `ConfigError`

Device = Literal["auto", "cpu", "cuda"]
LogFormat = Literal["auto", "json", "text"]
Precision = Literal["auto", "fp32", "bf16", "int8", "fp16"]
LongStates = Literal["cut", "refuse", "windows"]
LONG_STATES: tuple[LongStates, ...] = ("cut", "refuse", "windows")
Compile = Literal["auto", "off"]
COMPILE_MODES: tuple[Compile, ...] = ("auto", "off")  # `DECIDEALOT_COMPILE`

PREFIX = "DECIDEALOT_"


class ConfigError(ValueError):
    """A setting has a value the service cannot run with; the message is one line."""


def setting(parse: Parse) -> msgspec.Meta:
    """Marks a struct field as a setting read by `parse` (use in `Annotated[type, ...]`)."""
    return msgspec.Meta(extra={"parse": parse})


def variable(field: str) -> str:
    return PREFIX + field.upper()


# -- parsers ---------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def integer(*, low: int, high: int | None = None) -> Callable[[str, str], int]:
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise ConfigError(f"{name}: expected an integer {bound}, got {value}")
        return value

    return parse


def seconds(*, allow_zero: bool = False) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            what = "0 or more" if allow_zero else "greater than 0"
            raise ConfigError(f"{name}: expected a finite number of seconds {what}, got {raw!r}")
        return value

    return parse


def text(name: str, raw: str) -> str:
    return raw.strip()


def url(name: str, raw: str) -> str:
    value = raw.strip().rstrip("/")
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ConfigError(f"{name}: expected an http:// or https:// URL, got {raw!r}")
    return value


def _existing(kind: str, exists: Callable[[Path], bool]) -> Callable[[str, str], Path]:
    def parse(name: str, raw: str) -> Path:
        path = Path(raw).expanduser()
        if not exists(path):
            raise ConfigError(f"{name}: expected an existing {kind}, got {raw!r}")
        return path.resolve()

    return parse


directory = _existing("directory", Path.is_dir)
file = _existing("file", Path.is_file)


def secret(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or not value.isprintable() or any(c.isspace() for c in value):
        raise ConfigError(f"{name}: expected printable characters with no whitespace")
    return value


def secrets(name: str, raw: str) -> tuple[str, ...]:
    """Several keys, one per line or comma-separated, so a key rotates with no client refused."""
    keys = tuple(dict.fromkeys(key.strip() for key in re.split(r"[,\n]", raw) if key.strip()))
    if not keys:
        raise ConfigError(f"{name}: expected one or more keys, one per line or comma-separated")
    for key in keys:
        secret(name, key)
    return keys


SECRETS: tuple[Parse, ...] = (secret, secrets)  # masked in a repr, readable from a `_FILE` twin
FILE_SUFFIX = "_FILE"


def choice(options: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ConfigError(f"{name}: expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def _hosts(name: str, raw: str) -> tuple[str, ...]:
    hosts = tuple(h.strip() for h in raw.split(",") if h.strip())
    if not hosts:
        raise ConfigError(f"{name}: expected a comma-separated list of host[:port] names")
    return hosts


_PATH_SEGMENT = re.compile(r"(/[A-Za-z0-9._~!$&'()*+,;=:@%-]+)+")
_ORIGIN = re.compile(r"https?://[^/?#\s]+")


def _root_path(name: str, raw: str) -> str:
    """A path prefix such as `/decide` ("/" alone: none); a trailing slash is dropped."""
    value = raw.strip().rstrip("/")
    if value and not _PATH_SEGMENT.fullmatch(value):
        raise ConfigError(
            f"{name}: expected a path that starts with / (such as /decide), got {raw!r}"
        )
    return value


def _origins(name: str, raw: str) -> tuple[str, ...]:
    origins = tuple(dict.fromkeys(o.strip().rstrip("/") for o in raw.split(",") if o.strip()))
    if not origins:
        raise ConfigError(f"{name}: expected comma-separated origins such as https://app.example")
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"{name}: expected origins as scheme://host[:port] (such as "
                f"https://app.example) or *, got {origin!r}"
            )
    return origins


def _token_budget(name: str, raw: str) -> int:
    value = integer(low=0)(name, raw)
    if 0 < value < 512:
        raise ConfigError(
            f"{name}: expected 0 (by device) or an integer of at least 512, got {value}"
        )
    return value


def _header_timeout(name: str, raw: str) -> float:
    """Whole milliseconds from 0.1 s to an hour: granian counts it in milliseconds."""
    value = seconds()(name, raw)
    if not 0.1 <= value <= 3600:
        raise ConfigError(f"{name}: expected seconds from 0.1 to 3600, got {raw!r}")
    return value


def _model_dir(name: str, raw: str) -> Path:
    return Path(raw).expanduser().resolve()


PRECISION_DEVICES = {
    "auto": ("cpu", "cuda"),
    "fp32": ("cpu", "cuda"),
    "bf16": ("cpu", "cuda"),
    "int8": ("cpu",),
    "fp16": ("cuda",),
}
"""`DECIDEALOT_PRECISION` values and the devices each runs on (docs/configuration.md#precision)."""


def precision_problem(
    precision: str, device: str, cpu_flags: frozenset[str] | None = None
) -> str | None:
    """Why `precision` cannot run on `device` (`auto` is checked once resolved), or None.
    Given the CPU's flags (`decidealot.cpu.flags`), a CPU precision needs its units there."""
    if precision not in PRECISION_DEVICES:
        return f"expected one of {', '.join(PRECISION_DEVICES)}, got {precision!r}"
    devices = PRECISION_DEVICES[precision]
    if device not in ("auto", *devices):
        return f"{precision} runs on {' or '.join(devices)} only, not on DECIDEALOT_DEVICE={device}"
    if device == "cpu" and cpu_flags is not None:
        missing = cpu.missing_units(precision, cpu_flags)
        if missing is not None:
            return f"{missing}; set DECIDEALOT_PRECISION=auto or fp32"
    return None


# -- the core's settings ---------------------------------------------------------------------


class Section(msgspec.Struct, frozen=True, kw_only=True):
    """Its repr never shows a secret setting's value, so keys never reach a log or a traceback."""

    def __repr__(self) -> str:
        shown = []
        for field in msgspec.structs.fields(self):
            value = getattr(self, field.name)
            if field.name != "sections":
                masked = value is not None and _parser(field.type) in SECRETS
                shown.append(f"{field.name}={'***' if masked else repr(value)}")
        return f"{type(self).__name__}({', '.join(shown)})"

    __str__ = __repr__


class Settings(Section, frozen=True, kw_only=True):
    """The core's settings, and each provider's in `sections` (`registry.settings` fills them)."""

    host: Annotated[str, setting(text)] = "127.0.0.1"
    port: Annotated[int, setting(integer(low=1, high=65535))] = 8080
    api_key: Annotated[tuple[str, ...] | None, setting(secrets)] = None
    """The keys any of which opens every route but /health and /docs (rotation: several)."""
    log_level: Annotated[str, setting(choice(("debug", "info", "warning", "error")))] = "info"
    log_format: Annotated[LogFormat, setting(choice(("auto", "json", "text")))] = "auto"
    root_path: Annotated[str, setting(_root_path)] = ""
    """The prefix a reverse proxy serves under ("": none); routes answer with it and without."""
    cors_origins: Annotated[tuple[str, ...], setting(_origins)] = ()
    """Browser origins allowed to call the API ((): CORS off, no CORS headers at all)."""

    # Request framing and batch limits.
    max_request_bytes: Annotated[int, setting(integer(low=1024))] = 2 * 1024 * 1024
    max_batch_requests: Annotated[int, setting(integer(low=1))] = 0  # 0: no cap beyond bytes
    max_batch_concurrency: Annotated[int, setting(integer(low=1))] = 0  # 0: no cap
    request_read_timeout_seconds: Annotated[float, setting(seconds())] = 30.0

    # Connections (docs/api.md#connections).
    max_connections: Annotated[int, setting(integer(low=16, high=1_000_000))] = 4096
    """Open connections the server holds at once; the open-file soft limit is raised to match."""
    header_read_timeout_seconds: Annotated[float, setting(_header_timeout)] = 5.0
    """The time a connection gets to send a request's whole head, counted from its accept or
    from the end of its previous response: a slow header's limit and the keep-alive idle one."""
    probe_port: Annotated[int, setting(integer(low=0, high=65535))] = 0
    """A second port serving only /health and /metrics, for probes and scrapes (0: none)."""

    # Local runtime.
    model_dir: Annotated[Path, setting(_model_dir)] = Path(
        "~/.cache/decidealot/models"
    ).expanduser()
    bundle_manifest_dir: Annotated[Path | None, setting(directory)] = None  # None: shipped ones
    max_resident_providers: Annotated[int, setting(integer(low=1, high=16))] = 1
    provider_idle_unload_seconds: Annotated[float, setting(seconds(allow_zero=True))] = 900.0
    provider_timeout_seconds: Annotated[float, setting(seconds())] = 120.0
    provider_start_timeout_seconds: Annotated[float, setting(seconds())] = 600.0
    drain_seconds: Annotated[float, setting(seconds(allow_zero=True))] = 120.0
    """How long SIGTERM lets admitted requests run before it answers the rest 503."""
    device: Annotated[Device, setting(choice(("auto", "cpu", "cuda")))] = "auto"
    torch_threads: Annotated[int, setting(integer(low=0, high=1024))] = 0  # 0: torch's default
    precision: Annotated[Precision, setting(choice(tuple(PRECISION_DEVICES)))] = "auto"
    batch_token_budget: Annotated[int, setting(_token_budget)] = 0  # 0: by device
    worker_passes: Annotated[int, setting(integer(low=0, high=64))] = 0  # 0: by device
    worker_python: Annotated[Path | None, setting(file)] = None  # None: the gateway's own
    max_request_tokens: Annotated[int | None, setting(integer(low=0))] = None  # None: by device
    max_pending_requests: Annotated[int, setting(integer(low=0))] = 64  # 0: no bound
    long_states: Annotated[LongStates, setting(choice(LONG_STATES))] = "cut"
    """What a local model does with a state longer than it reads (docs/models.md)."""
    compile: Annotated[Compile, setting(choice(COMPILE_MODES))] = "auto"
    """Laya's and Von's passes through `torch.compile` where it pays (reduced precision), or
    never (`off`); docs/configuration.md#compiled-passes."""

    # MCP.
    mcp_allowed_hosts: Annotated[tuple[str, ...], setting(_hosts)] = ()

    # Tracing, from the standard OTEL_* variables.
    trace_exporters: tuple[str, ...] = ()  # (): off; ("otlp",): OTLP over HTTP

    sections: dict[str, msgspec.Struct] = {}  # each provider's settings, by its name


def read_section(
    struct: type[msgspec.Struct], env: Mapping[str, str], known: set[str]
) -> dict[str, object]:
    """The settings of `struct` set in `env`, parsed (its variables go into `known`); a secret
    may instead be in the file its `_FILE` twin names, so the key never sits in the environment."""
    values: dict[str, object] = {}
    for field in msgspec.structs.fields(struct):
        parse = _parser(field.type)
        if parse is None:
            continue
        name = variable(field.name)
        known.add(name)
        raw = env.get(name)
        if parse in SECRETS:
            twin = name + FILE_SUFFIX
            known.add(twin)
            path = env.get(twin)
            if path is not None and path.strip():
                if raw is not None and raw.strip():
                    raise ConfigError(f"{name} and {twin} are both set: set one of them")
                name, raw = twin, _secret_file(twin, path)
        if raw is not None and raw.strip():
            values[field.name] = parse(name, raw)
    return values


def _secret_file(name: str, raw: str) -> str:
    """The text of the file setting `name` names (the path is not secret; its text is)."""
    path = Path(raw.strip()).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {str(path)!r} is not UTF-8 text") from None
    if not text.strip():
        raise ConfigError(f"{name}: {str(path)!r} is empty")
    return text


def _parser(annotation: object) -> Parse | None:
    metas = get_args(annotation)[1:] if get_origin(annotation) is Annotated else ()
    extras = [meta.extra for meta in metas if isinstance(meta, msgspec.Meta) and meta.extra]
    return next((extra["parse"] for extra in extras if "parse" in extra), None)


def read_core(env: Mapping[str, str], known: set[str]) -> dict[str, object]:
    """The core's settings in `env` (the OTEL_* ones too), checked against each other."""
    values = read_section(Settings, env, known)
    problem = precision_problem(
        str(values.get("precision", "auto")), str(values.get("device", "auto"))
    )
    if problem is not None:
        raise ConfigError(f"DECIDEALOT_PRECISION: {problem}")
    ports = msgspec.structs.replace(Settings(), **values)  # unset ones at their defaults
    check_ports(ports.port, ports.probe_port)
    values["trace_exporters"] = trace_exporters(env)
    return values


def check_ports(port: int, probe_port: int) -> None:
    if probe_port and probe_port == port:
        raise ConfigError(
            f"DECIDEALOT_PROBE_PORT: expected a port other than the API's ({port}), or 0 for none"
        )


def refuse_unknown(env: Mapping[str, str], known: set[str]) -> None:
    """A `DECIDEALOT_*` variable no struct declares is a typo: refused, naming the closest."""
    refused = [
        f"{name}: not a Decidealot setting; the closest one is "
        + difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.0)[0]
        for name, raw in sorted(env.items())
        if name.startswith(PREFIX) and raw.strip() and name not in known
    ]
    if refused:
        raise ConfigError("; ".join(refused))


# -- tracing, from the standard OTEL_* variables ---------------------------------------------

_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTEL_SDK_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def trace_exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """Tracing is off unless OTEL_TRACES_EXPORTER names otlp or an OTLP endpoint is set
    (and OTEL_SDK_DISABLED is not true); only OTLP over HTTP (http/protobuf) is supported."""

    def value(name: str) -> str | None:
        return (env.get(name) or "").strip() or None

    disabled = value("OTEL_SDK_DISABLED")
    if disabled is not None and boolean("OTEL_SDK_DISABLED", disabled):
        return ()
    named = value("OTEL_TRACES_EXPORTER")
    endpoints = [(name, raw) for name in _OTLP_ENDPOINTS if (raw := value(name)) is not None]
    if named is not None:
        exporters = tuple(dict.fromkeys(e.strip().lower() for e in named.split(",")))
        if exporters not in (("otlp",), ("none",)):
            raise ConfigError(f"OTEL_TRACES_EXPORTER: expected otlp or none, got {named!r}")
        if exporters == ("none",):
            return ()
        switch = "OTEL_TRACES_EXPORTER"
    elif endpoints:
        switch = endpoints[0][0]
    else:
        return ()
    for name, raw in endpoints:
        url(name, raw)
    for name in _OTLP_PROTOCOLS:
        protocol = value(name)
        if protocol is not None:
            if protocol.lower() != "http/protobuf":
                raise ConfigError(f"{name}: expected http/protobuf, got {protocol!r}")
            break
    try:
        installed = all(importlib.util.find_spec(module) for module in _OTEL_SDK_MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        installed = False
    if not installed:
        raise ConfigError(
            f"{switch}: tracing needs the OpenTelemetry SDK; install decidealot[otel]"
        )
    return ("otlp",)
