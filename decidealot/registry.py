"""The registered providers (entry points of group `decidealot.providers`): what each declares in
its descriptor, and the settings read with them. The rest of the service names no provider."""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from decidealot import config
from decidealot.config import ConfigError, Settings
from decidealot.contract import ModelInfo
from decidealot.protocols import Provider

ENTRY_POINTS = "decidealot.providers"

S = TypeVar("S", bound=msgspec.Struct)


FileCheck = Callable[[Path], "str | None"]
"""Reads one file of a checkpoint the way its engine will: what is wrong with it, or None."""

_MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors format's own bound on its JSON header


def json_object_problem(path: Path) -> str | None:
    """A JSON file the engine reads as an object (configs, tokenizers, calibration)."""
    try:
        value = msgspec.json.decode(path.read_bytes())
    except msgspec.DecodeError as exc:
        return f"is not valid JSON ({exc})"
    return None if isinstance(value, dict) else "is not a JSON object"


def safetensors_header(path: Path) -> str | None:
    """A safetensors file: its 8-byte length, its JSON header, and data for every tensor the
    header places. Read by hand: `safetensors.safe_open` imports numpy or torch even to list a
    header, and the gateway imports neither."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        prefix = stream.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(_MAX_SAFETENSORS_HEADER, size - 8):
            return "has no safetensors header (its first 8 bytes give no length that fits)"
        raw = stream.read(length)
    try:
        header = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return f"has a safetensors header that does not parse ({exc})"
    if not isinstance(header, dict):
        return "has a safetensors header that is not a JSON object"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__"
        and isinstance(entry, dict)
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and isinstance(entry["data_offsets"][1], int)
    ]
    if len(ends) != len(header) - ("__metadata__" in header):
        return "has a safetensors header with a tensor entry lacking its data offsets"
    if ends and max(ends) > size - 8 - length:
        return f"is cut short: its header places {max(ends)} bytes of tensors, it holds fewer"
    return None


@dataclass(frozen=True)
class Bundle:
    """One downloadable checkpoint of a local provider."""

    name: str  # its manifest is `<name>.json`; it installs to DECIDEALOT_MODEL_DIR/<name>
    setting: str  # the provider's setting that replaces the download with a local checkpoint
    entry: str = ""  # what the provider loads in the installed folder: "" the folder, else a file
    entry_is: str = "checkpoint file"  # what messages call that one file
    files: tuple[str, ...] = ()  # files a checkpoint directory must hold: the ones the engine reads
    checks: Mapping[str, FileCheck] = field(default_factory=dict, hash=False)
    """Startup's reading of a file, by name in `files` (or `entry`): one the engine cannot parse
    stops startup as a missing one does."""
    manifests: Traversable | None = None  # where its manifest lies; None: `decidealot.bundles`

    @property
    def variable(self) -> str:
        return config.variable(self.setting)


@dataclass(frozen=True)
class Calibration:
    """A setting naming a calibration file, in the checkpoint's upstream format, that replaces
    the temperatures one bundle's checkpoint ships."""

    setting: str
    bundle: str  # the bundle whose checkpoint it calibrates
    key: str  # that checkpoint's key in the provider's engine (`EngineSpec.checkpoints`)
    check: FileCheck  # a file it finds wrong stops startup, naming the setting and the file
    warnings: Callable[[Path, Path], list[str]]
    """(file, checkpoint directory) -> what upstream warns of when it loads that file there."""
    selectors: tuple[str, ...]  # those naming this checkpoint alone (`calibrate --model`)


@dataclass(frozen=True)
class Tiny:
    """How to write random checkpoints of a provider's bundles (`decidealot checkpoints tiny`)."""

    writer: str
    """`module:function` writing them (bundle name -> path in a folder); named: it imports torch."""
    needs: str | None = None  # what else the provider needs to run (its lines then commented out)


@dataclass(frozen=True)
class ProviderDescriptor(Generic[S]):
    name: str  # `/health` and unload reports name it; its variables usually start with it
    order: int  # its place in listings; a local name still wins a collision with a hosted one
    settings: type[S]  # a frozen struct whose fields are annotated with `config.setting`
    enabled: Callable[[S], bool]
    switch_off: str  # how a user turns it off, for messages that offer it as a fix
    build: Callable[[Settings, S], Provider]  # the provider; checkpoint settings all filled
    off: str = ""
    """How messages say it is off ("DECIDEALOT_LAYA_ENABLED=false"): a setting that matters only
    while it is on (a bundle's, `only_while_on`) is refused when set: `<var> is set but <off>`."""
    only_while_on: tuple[str, ...] = ()  # more settings that mean nothing while it is off
    local: bool = True  # decisions run on this host, in a worker, and take a residency slot
    selectors: tuple[ModelInfo, ...] = ()
    """The model names a local provider serves (a hosted one lists its own at run time)."""
    bundles: tuple[Bundle, ...] = ()
    lane_group: str | None = None  # on CPU, one group may hold the shared lane; None: its own
    free_of_lane: Callable[[S], bool] = lambda section: False
    """True where its settings take it off every lane (it then overlaps other models)."""
    check: Callable[[S], None] = lambda section: None
    """Raises `ConfigError` for other settings that each parse but contradict each other."""
    tiny: Tiny | None = None
    calibrations: tuple[Calibration, ...] = ()
    calibrator: str = ""
    """`module:function` fitting a calibration file on labelled rows; named, as `Tiny.writer`."""

    def of(self, settings: Settings) -> S:
        section = settings.sections.get(self.name)
        if section is None:
            return self.settings()
        if not isinstance(section, self.settings):
            raise TypeError(f"settings section {self.name!r} is not a {self.settings.__name__}")
        return section

    def calibration_files(self, section: S) -> dict[str, str]:
        """Checkpoint key -> the calibration file `section` sets (unset: shipped temperatures)."""
        files = {c.key: getattr(section, c.setting) for c in self.calibrations}
        return {key: str(path) for key, path in files.items() if path is not None}

    def refuse_contradictions(self, section: S) -> None:
        if not self.enabled(section):
            settings = (
                *(b.setting for b in self.bundles),
                *(c.setting for c in self.calibrations),
                *self.only_while_on,
            )
            for field in settings:
                if getattr(section, field) is not None:
                    raise ConfigError(f"{config.variable(field)} is set but {self.off}")
        self.check(section)

    def lane_for(self, section: S, device: str) -> tuple[str | None, str]:
        """The residency lane and group of this local provider on `device`: on CUDA its own
        group on lane "cuda" (one provider's passes at a time on the device); on CPU providers of
        one `lane_group` share lane "local" together (with two slots they overlap)."""
        if self.free_of_lane(section):
            return None, self.name
        if device == "cuda":
            return "cuda", self.name
        return "local", self.lane_group or self.name


Descriptor = ProviderDescriptor[Any]  # any provider's: each one's settings type is its own


@functools.cache
def registered() -> tuple[Descriptor, ...]:
    found: dict[str, Descriptor] = {}
    for point in _entry_points():
        if point.name in found:
            continue  # the first distribution on the path wins, as imports do
        try:
            descriptor = point.load()
        except Exception as exc:
            raise ConfigError(
                f"provider {point.name!r} ({point.value}) cannot be loaded: {type(exc).__name__}"
            ) from exc
        if not isinstance(descriptor, ProviderDescriptor) or descriptor.name != point.name:
            raise ConfigError(f"provider {point.name!r} ({point.value}) is not its descriptor")
        found[point.name] = descriptor
    return tuple(sorted(found.values(), key=lambda d: (d.order, d.name)))


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    """The group's entry points of every distribution on the path, in path order: unlike with
    `importlib.metadata.entry_points`, a stale second copy of a distribution's metadata (an
    in-tree build's `decidealot.egg-info`) does not hide the one that declares the group."""
    return [
        point
        for distribution in importlib.metadata.distributions()
        for point in distribution.entry_points
        if point.group == ENTRY_POINTS
    ]


def descriptor(name: str) -> Descriptor:
    """KeyError when no provider `name` is registered."""
    return {each.name: each for each in registered()}[name]


def enabled(settings: Settings) -> tuple[Descriptor, ...]:
    return tuple(d for d in registered() if d.enabled(d.of(settings)))


def enabled_local(settings: Settings) -> tuple[Descriptor, ...]:
    return tuple(d for d in enabled(settings) if d.local)


# -- settings --------------------------------------------------------------------------------


def from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Read every DECIDEALOT_* variable once; empty values count as unset. Unknown names and
    contradictions are refused so that a typo never silently leaves a default in place."""
    env = os.environ if environ is None else environ
    known: set[str] = set()
    core = config.read_core(env, known)
    sections = {
        d.name: d.settings(**config.read_section(d.settings, env, known)) for d in registered()
    }
    config.refuse_unknown(env, known)
    for each in registered():
        each.refuse_contradictions(sections[each.name])
    return Settings(**core, sections=sections)  # type: ignore[arg-type]


def settings(**values: object) -> Settings:
    """Settings from field values, core and providers' alike (defaults for the rest)."""
    return replace(Settings(), **values)


def replace(current: Settings, **values: object) -> Settings:
    """`current` with the given fields, core and providers' alike, replaced."""
    core_fields = set(Settings.__struct_fields__) - {"sections"}
    core = {k: v for k, v in values.items() if k in core_fields}
    rest = {k: v for k, v in values.items() if k not in core_fields}
    sections = dict(current.sections)
    for each in registered():
        own = {k: v for k, v in rest.items() if k in each.settings.__struct_fields__}
        sections[each.name] = msgspec.structs.replace(each.of(current), **own)
        for name in own:
            del rest[name]
    if rest:
        raise TypeError(f"not settings: {', '.join(sorted(rest))}")
    return msgspec.structs.replace(current, **core, sections=sections)
