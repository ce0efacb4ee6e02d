"""Every DECIDEALOT_* setting, parsed and checked once at startup.

A bad value raises `ConfigError` with one line naming the variable and what it accepts; the CLI
prints that line and exits non-zero. Nothing else in the service reads the environment, so a
`DECIDEALOT_*` name that `from_env` does not read is a typo and is refused the same way, with
the closest name it does read; so are settings that contradict each other. The one exception:
the OpenTelemetry SDK reads the OTEL_* variables checked here (see `decidealot.tracing`).
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

T = TypeVar("T")

Device = Literal["auto", "cpu", "cuda"]
LogFormat = Literal["json", "text"]
Precision = Literal["fp32", "int8", "bf16", "fp16"]

DEFAULT_TYPESAFE_BASE_URL = "https://api.typesafe.ai"
_PREFIX = "DECIDEALOT_"


PRECISION_DEVICES = {
    "fp32": ("cpu", "cuda"),
    "int8": ("cpu",),
    "bf16": ("cuda",),
    "fp16": ("cuda",),
}
"""`DECIDEALOT_PRECISION` values and the devices each runs on. fp32: exact parity with upstream;
int8: int8 encoder weights (providers/numerics.py); bf16, fp16: CUDA autocast, as upstream Laya
runs there."""


def precision_problem(precision: str, device: str) -> str | None:
    """Why `precision` cannot run on `device` (`auto` is checked once resolved), or None."""
    if precision not in PRECISION_DEVICES:
        return f"expected one of {', '.join(PRECISION_DEVICES)}, got {precision!r}"
    devices = PRECISION_DEVICES[precision]
    if device not in ("auto", *devices):
        return f"{precision} runs on {' or '.join(devices)} only, not on DECIDEALOT_DEVICE={device}"
    return None


class ConfigError(ValueError):
    """A setting has a value the service cannot run with; the message is one line."""


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """The service's whole configuration. Tests build one directly; `serve` uses `from_env`."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    log_level: str = "info"
    log_format: LogFormat = "json"

    # Request framing and batch limits.
    max_request_bytes: int = 2 * 1024 * 1024
    max_batch_requests: int = 0  # 0: no cap beyond max_request_bytes
    max_batch_concurrency: int = 0  # 0: no cap
    request_read_timeout_seconds: float = 30.0

    # Local runtime.
    model_dir: Path = Path("~/.cache/decidealot/models").expanduser()
    bundle_manifest_dir: Path | None = None  # None: the manifests shipped in bundles/
    max_resident_providers: int = 1
    provider_idle_unload_seconds: float = 900.0  # 0 disables idle unload
    provider_timeout_seconds: float = 120.0
    provider_start_timeout_seconds: float = 600.0
    device: Device = "auto"
    torch_threads: int = 0  # 0: torch's own default
    precision: Precision = "fp32"  # see decidealot.providers.worker.precision
    batch_token_budget: int = (
        0  # 0: by device, see decidealot.providers.gateway.process_runtime.token_budget
    )
    worker_passes: int = (
        0  # 0: by device, see decidealot.providers.gateway.process_runtime.concurrent_passes
    )
    worker_python: str | None = None  # None: the gateway's own interpreter
    max_request_tokens: int | None = (
        None  # None: by device, see decidealot.providers.gateway.process_runtime; 0: no bound
    )
    max_pending_requests: int = 64  # 0: no bound

    # Laya.
    laya_enabled: bool = True
    laya_english_checkpoint: Path | None = None
    laya_multilingual_checkpoint: Path | None = None
    laya_typed_decisions_checkpoint: Path | None = None

    # Von.
    von_enabled: bool = True
    von_checkpoint: Path | None = None

    # CLM.
    clm_embeddings_url: str | None = None
    clm_embeddings_model: str = "qwen3-8b"
    clm_embeddings_api_key: str | None = msgspec.field(default=None)
    clm_head: Path | None = None
    clm_max_text_bytes: int = 8192
    clm_cache_size: int = 4096
    clm_cache_ttl_seconds: float = 3600.0
    clm_parallel_with_local_models: bool = False
    clm_encoder_timeout_seconds: float = 30.0
    clm_encoder_retry_seconds: float = 10.0

    # Jev (hosted TypeSafe).
    typesafe_api_key: str | None = None
    jev_enabled: bool | None = None  # None: enabled exactly when a TypeSafe key is set
    typesafe_base_url: str = DEFAULT_TYPESAFE_BASE_URL
    typesafe_timeout_seconds: float = 10.0
    typesafe_retry_seconds: float = 30.0

    # MCP.
    mcp_allowed_hosts: tuple[str, ...] = ()

    # Tracing, from the standard OTEL_* variables.
    trace_exporters: tuple[str, ...] = ()  # (): off; ("otlp",): OTLP over HTTP

    def __repr__(self) -> str:  # keys never reach a log line or a traceback
        return f"Settings(host={self.host!r}, port={self.port}, providers={self.providers})"

    __str__ = __repr__

    @property
    def clm_enabled(self) -> bool:
        return self.clm_embeddings_url is not None

    @property
    def jev_active(self) -> bool:
        if self.typesafe_api_key is None:
            return False
        return self.jev_enabled is not False

    @property
    def providers(self) -> tuple[str, ...]:
        """Configured providers, in the order `/health` and `/v1/models` list them."""
        enabled = (
            ("laya", self.laya_enabled),
            ("von", self.von_enabled),
            ("clm", self.clm_enabled),
            ("jev", self.jev_active),
        )
        return tuple(name for name, on in enabled if on)

    @property
    def local_providers(self) -> tuple[str, ...]:
        return tuple(p for p in self.providers if p != "jev")


# -- parsing ---------------------------------------------------------------------------------

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def _int(name: str, raw: str, *, low: int, high: int | None = None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{name}: expected an integer {bound}, got {value}")
    return value


def _seconds(name: str, raw: str, *, allow_zero: bool = False) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        what = "0 or more" if allow_zero else "greater than 0"
        raise ConfigError(f"{name}: expected a finite number of seconds {what}, got {raw!r}")
    return value


def _url(name: str, raw: str) -> str:
    value = raw.strip().rstrip("/")
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ConfigError(f"{name}: expected an http:// or https:// URL, got {raw!r}")
    return value


def _dir(name: str, raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{name}: expected an existing directory, got {raw!r}")
    return path.resolve()


def _file(name: str, raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ConfigError(f"{name}: expected an existing file, got {raw!r}")
    return path.resolve()


def _secret(name: str, raw: str) -> str:
    value = raw.strip()
    if not value or not value.isprintable() or any(c.isspace() for c in value):
        raise ConfigError(f"{name}: expected printable characters with no whitespace")
    return value


def _choice(options: tuple[str, ...]) -> Callable[[str, str], str]:
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


def _token_budget(name: str, raw: str) -> int:
    value = _int(name, raw, low=0)
    if 0 < value < 512:
        raise ConfigError(
            f"{name}: expected 0 (by device) or an integer of at least 512, got {value}"
        )
    return value


def _port(name: str, raw: str) -> int:
    return _int(name, raw, low=1, high=65535)


FROM_OTEL = frozenset({"trace_exporters"})
"""Settings fields read from the standard OTEL_* variables rather than a DECIDEALOT_* one."""
_OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_OTEL_SDK_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _trace_exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """Tracing is off unless OTEL_TRACES_EXPORTER names otlp or an OTLP endpoint is set
    (and OTEL_SDK_DISABLED is not true); only OTLP over HTTP (http/protobuf) is supported."""

    def value(name: str) -> str | None:
        raw = env.get(name)
        return raw.strip() if raw is not None and raw.strip() else None

    disabled = value("OTEL_SDK_DISABLED")
    if disabled is not None and _bool("OTEL_SDK_DISABLED", disabled):
        return ()
    named = value("OTEL_TRACES_EXPORTER")
    endpoints = [(name, raw) for name in _OTLP_ENDPOINTS if (raw := value(name)) is not None]
    if named is not None:
        exporters = tuple(dict.fromkeys(e.strip().lower() for e in named.split(",")))
        if not set(exporters) <= {"otlp", "none"} or len(exporters) > 1:
            raise ConfigError(f"OTEL_TRACES_EXPORTER: expected otlp or none, got {named!r}")
        if exporters == ("none",):
            return ()
        switch = "OTEL_TRACES_EXPORTER"
    elif endpoints:
        switch = endpoints[0][0]
    else:
        return ()
    for name, raw in endpoints:
        _url(name, raw)
    for name in _OTLP_PROTOCOLS:
        protocol = value(name)
        if protocol is not None:
            if protocol.lower() != "http/protobuf":
                raise ConfigError(f"{name}: expected http/protobuf, got {protocol!r}")
            break
    if not all(map(_importable, _OTEL_SDK_MODULES)):
        raise ConfigError(
            f"{switch}: tracing needs the OpenTelemetry SDK; install decidealot[otel]"
        )
    return ("otlp",)


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every DECIDEALOT_* variable once; empty values count as unset. Unknown names and
    contradictions are refused so that a typo never silently leaves a default in place."""
    env = os.environ if environ is None else environ
    known: set[str] = set()
    settings = _parse(env, known)
    unknown = sorted(name for name, raw in env.items() if _is_unknown(name, raw, known))
    if unknown:
        raise ConfigError("; ".join(_unknown(name, known) for name in unknown))
    _check_consistent(settings)
    return settings


def known_variables() -> frozenset[str]:
    """Every DECIDEALOT_* name `from_env` reads: the names its `read` lines spell."""
    known: set[str] = set()
    _parse({}, known)
    return frozenset(known)


def _is_unknown(name: str, raw: str, known: set[str]) -> bool:
    return name.startswith(_PREFIX) and bool(raw.strip()) and name not in known


def _unknown(name: str, known: set[str]) -> str:
    closest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.0)[0]
    return f"{name}: not a Decidealot setting; the closest one is {closest}"


def _check_consistent(settings: Settings) -> None:
    """Settings that each parse but ask for something the others rule out."""
    if settings.jev_enabled and settings.typesafe_api_key is None:
        raise ConfigError(
            "DECIDEALOT_JEV_ENABLED=true needs DECIDEALOT_TYPESAFE_API_KEY: "
            "Jev is TypeSafe's hosted API"
        )
    checkpoints = (
        ("laya", settings.laya_enabled, "laya_english_checkpoint"),
        ("laya", settings.laya_enabled, "laya_multilingual_checkpoint"),
        ("laya", settings.laya_enabled, "laya_typed_decisions_checkpoint"),
        ("von", settings.von_enabled, "von_checkpoint"),
    )
    for provider, enabled, field in checkpoints:
        if not enabled and getattr(settings, field) is not None:
            raise ConfigError(
                f"{_PREFIX}{field.upper()} is set but {_PREFIX}{provider.upper()}_ENABLED=false"
            )
    if not settings.clm_enabled:
        for field in ("clm_head", "clm_embeddings_api_key"):
            if getattr(settings, field) is not None:
                raise ConfigError(
                    f"{_PREFIX}{field.upper()} is set but CLM is off: "
                    f"it needs {_PREFIX}CLM_EMBEDDINGS_URL"
                )


def _parse(env: Mapping[str, str], known: set[str]) -> Settings:
    """Parse the settings present in `env`; every name a `read` line spells goes into `known`."""
    values: dict[str, object] = {}

    def read(field: str, parse: Callable[[str, str], T]) -> None:
        name = _PREFIX + field.upper()
        known.add(name)
        raw = env.get(name)
        if raw is not None and raw.strip():
            values[field] = parse(name, raw)

    read("host", lambda n, r: r.strip())
    read("port", _port)
    read("api_key", _secret)
    read("log_level", _choice(("debug", "info", "warning", "error")))
    read("log_format", _choice(("json", "text")))
    read("max_request_bytes", lambda n, r: _int(n, r, low=1024))
    read("max_batch_requests", lambda n, r: _int(n, r, low=1))
    read("max_batch_concurrency", lambda n, r: _int(n, r, low=1))
    read("request_read_timeout_seconds", _seconds)
    read("model_dir", lambda n, r: Path(r).expanduser().resolve())
    read("bundle_manifest_dir", _dir)
    read("max_resident_providers", lambda n, r: _int(n, r, low=1, high=16))
    read("provider_idle_unload_seconds", lambda n, r: _seconds(n, r, allow_zero=True))
    read("provider_timeout_seconds", _seconds)
    read("provider_start_timeout_seconds", _seconds)
    read("device", _choice(("auto", "cpu", "cuda")))
    read("torch_threads", lambda n, r: _int(n, r, low=0, high=1024))
    read("precision", _choice(tuple(PRECISION_DEVICES)))
    read("batch_token_budget", _token_budget)
    read("worker_passes", lambda n, r: _int(n, r, low=0, high=64))
    read("worker_python", _file)
    read("max_request_tokens", lambda n, r: _int(n, r, low=0))
    read("max_pending_requests", lambda n, r: _int(n, r, low=0))
    read("laya_enabled", _bool)
    read("laya_english_checkpoint", _dir)
    read("laya_multilingual_checkpoint", _dir)
    read("laya_typed_decisions_checkpoint", _dir)
    read("von_enabled", _bool)
    read("von_checkpoint", _dir)
    read("clm_embeddings_url", _url)
    read("clm_embeddings_model", lambda n, r: r.strip())
    read("clm_embeddings_api_key", _secret)
    read("clm_head", _file)
    read("clm_max_text_bytes", lambda n, r: _int(n, r, low=1))
    read("clm_cache_size", lambda n, r: _int(n, r, low=0))
    read("clm_cache_ttl_seconds", _seconds)
    read("clm_parallel_with_local_models", _bool)
    read("clm_encoder_timeout_seconds", _seconds)
    read("clm_encoder_retry_seconds", lambda n, r: _seconds(n, r, allow_zero=True))
    read("typesafe_api_key", _secret)
    read("jev_enabled", _bool)
    read("typesafe_base_url", _url)
    read("typesafe_timeout_seconds", _seconds)
    read("typesafe_retry_seconds", lambda n, r: _seconds(n, r, allow_zero=True))
    read("mcp_allowed_hosts", _hosts)
    problem = precision_problem(
        str(values.get("precision", "fp32")), str(values.get("device", "auto"))
    )
    if problem is not None:
        raise ConfigError(f"DECIDEALOT_PRECISION: {problem}")
    values["trace_exporters"] = _trace_exporters(env)
    return Settings(**values)  # type: ignore[arg-type]
