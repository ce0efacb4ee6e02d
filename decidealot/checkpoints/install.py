"""Local model bundles: pinned manifests, download, verification and atomic install.

Runs before the service listens (`serve`) and on its own (`prepare`). It prepares files only: it
never loads a model and never imports torch. Each bundle is fetched with huggingface_hub into a
staging folder inside the model directory, every file is checked against its pinned size and
sha256 (or, where no digest is pinned, against the hub's own digest at the pinned revision), and
only then is the bundle renamed into place with an install record written last. A later start
trusts that record after a quick size check and makes no request at all.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2
import msgspec
from filelock import FileLock
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tqdm import tqdm

from decidealot import bundles as manifests_package
from decidealot.config import Settings

log = logging.getLogger("decidealot.checkpoints.install")

RECORD_NAME = ".decidealot-bundle.json"
STAGING_DIR = ".staging"
DEFAULT_MANIFEST_DIR = Path(manifests_package.__file__).resolve().parent
_HASH_CHUNK = 1 << 20
_PROGRESS_LOG_SECONDS = 10.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")

DigestSource = Literal["manifest", "hub-lfs-sha256", "hub-git-sha1"]


class BundleError(Exception):
    """A bundle cannot be prepared; the message is one line naming the bundle, file and fix."""


# -- manifests and install records ------------------------------------------------------------


class ManifestFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One file of a bundle; `size`/`sha256` are None where no pin is known."""

    path: str
    size: int | None
    sha256: str | None
    optional: bool = False  # may be absent at the revision (a 404 then is not an error)


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    repo: str
    revision: str
    files: tuple[ManifestFile, ...]
    subfolder: str = ""
    note: str = ""


class RecordFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    path: str
    size: int
    sha256: str
    digest_source: DigestSource


class InstallRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Written last into an installed bundle: what was verified, against which pins."""

    bundle: str
    repo: str
    revision: str
    subfolder: str
    files: tuple[RecordFile, ...]


@dataclass(frozen=True)
class Slot:
    """Where a bundle plugs into the settings."""

    override: str  # Settings attribute holding a local checkpoint that replaces the bundle
    entry: str  # path inside the installed folder that providers load ("" = the folder)
    enabled: Callable[[Settings], bool]
    kind: Literal["laya", "von", "clm"]  # which engine reads it (and so which files it needs)
    switch_off: str  # how a user turns the provider (and so the bundle) off

    @property
    def variable(self) -> str:
        return "DECIDEALOT_" + self.override.upper()

    @property
    def replacement(self) -> str:
        """What replaces the download: a local checkpoint, or the provider turned off."""
        what = "file" if self.entry else "directory"
        return f"set {self.variable} to a local checkpoint {what}, or {self.switch_off}"


_LAYA_OFF = "DECIDEALOT_LAYA_ENABLED=false to turn Laya off"
_SLOTS: dict[str, Slot] = {
    "laya-english": Slot(
        "laya_english_checkpoint", "", lambda s: s.laya_enabled, "laya", _LAYA_OFF
    ),
    "laya-multilingual": Slot(
        "laya_multilingual_checkpoint", "", lambda s: s.laya_enabled, "laya", _LAYA_OFF
    ),
    "laya-typed-decisions": Slot(
        "laya_typed_decisions_checkpoint", "", lambda s: s.laya_enabled, "laya", _LAYA_OFF
    ),
    "von-1.1": Slot(
        "von_checkpoint",
        "",
        lambda s: s.von_enabled,
        "von",
        "DECIDEALOT_VON_ENABLED=false to turn Von off",
    ),
    "clm-0.1-8b": Slot(
        "clm_head",
        "CLM_v0.1-8B.pt",
        lambda s: s.clm_enabled,
        "clm",
        "unset DECIDEALOT_CLM_EMBEDDINGS_URL to turn CLM off",
    ),
}
BUNDLE_NAMES: tuple[str, ...] = tuple(_SLOTS)

TINY_HINT = (
    "`decidealot checkpoints tiny DIR` writes random checkpoints (answers carry no meaning) "
    "and prints the variables that use them, for trying the API offline"
)


def enabled_slots(settings: Settings) -> dict[str, Slot]:
    """The bundles this configuration serves, downloaded or replaced by a local checkpoint."""
    return {name: place for name, place in _SLOTS.items() if place.enabled(settings)}


def slot(name: str) -> Slot:
    try:
        return _SLOTS[name]
    except KeyError:
        raise ValueError(f"unknown bundle {name!r}; known: {', '.join(BUNDLE_NAMES)}") from None


def manifest_dir(settings: Settings) -> Path:
    return settings.bundle_manifest_dir or DEFAULT_MANIFEST_DIR


def load_manifest(settings: Settings, name: str) -> Manifest:
    slot(name)
    path = manifest_dir(settings) / f"{name}.json"
    fix = "restore the repository's bundles/ folder or point DECIDEALOT_BUNDLE_MANIFEST_DIR at it"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BundleError(f"bundle {name}: manifest {path} not found. Fix: {fix}") from None
    except OSError as exc:
        what = exc.strerror or type(exc).__name__
        raise BundleError(
            f"bundle {name}: cannot read manifest {path} ({what}). Fix: {fix}"
        ) from exc
    try:
        manifest = msgspec.json.decode(raw, type=Manifest)
    except msgspec.DecodeError as exc:
        raise BundleError(f"bundle {name}: manifest {path} is invalid: {exc}. Fix: {fix}") from None
    problem = _manifest_problem(manifest, name)
    if problem:
        raise BundleError(f"bundle {name}: manifest {path} is invalid: {problem}. Fix: {fix}")
    return manifest


def _manifest_problem(manifest: Manifest, name: str) -> str | None:
    if manifest.name != name:
        return f"its name is {manifest.name!r}, expected {name!r}"
    if not _GIT_SHA1.fullmatch(manifest.revision):
        return "revision must be a full 40-character commit sha, never a branch or tag"
    if not manifest.files:
        return "it lists no files"
    seen: set[str] = set()
    for file in manifest.files:
        parts = file.path.split("/")
        if file.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return f"file path {file.path!r} must be relative with no '.' or '..' parts"
        if file.path == RECORD_NAME or file.path in seen:
            return f"file path {file.path!r} is reserved or listed twice"
        seen.add(file.path)
        if file.size is not None and file.size < 0:
            return f"file {file.path}: size must be 0 or more"
        if file.sha256 is not None and not _SHA256.fullmatch(file.sha256):
            return f"file {file.path}: sha256 must be 64 lowercase hex digits or null"
    return None


def checkpoint_path(settings: Settings, bundle_name: str) -> Path:
    """The path a provider loads: the local override when set, else the installed bundle."""
    place = slot(bundle_name)
    override: Path | None = getattr(settings, place.override)
    if override is not None:
        return override
    installed = settings.model_dir / bundle_name
    return installed / place.entry if place.entry else installed


def with_checkpoints(settings: Settings) -> Settings:
    """`settings` with every checkpoint setting filled (its override, else the installed
    bundle's path), so providers read paths from settings and never look at bundles."""
    paths = {place.override: checkpoint_path(settings, name) for name, place in _SLOTS.items()}
    return msgspec.structs.replace(settings, **paths)


def enabled_bundles(settings: Settings) -> list[Manifest]:
    """Manifests of the bundles this configuration needs downloaded (overrides excluded)."""
    return [
        load_manifest(settings, name)
        for name, place in enabled_slots(settings).items()
        if getattr(settings, place.override) is None
    ]


# -- checking an installed bundle ------------------------------------------------------------


def _read_record(folder: Path) -> InstallRecord | None:
    try:
        return msgspec.json.decode((folder / RECORD_NAME).read_bytes(), type=InstallRecord)
    except (OSError, msgspec.DecodeError):
        return None


def _installed_problem(manifest: Manifest, folder: Path, *, rehash: bool) -> str | None:
    """Why `folder` is not a verified install of `manifest`, or None when it is."""
    record = _read_record(folder)
    if record is None:
        return "no readable install record"
    if (record.bundle, record.repo, record.revision, record.subfolder) != (
        manifest.name,
        manifest.repo,
        manifest.revision,
        manifest.subfolder,
    ):
        return f"installed from {record.repo}@{record.revision[:12]}, manifest pins another"
    recorded = {f.path: f for f in record.files}
    for file in manifest.files:
        entry = recorded.get(file.path)
        if entry is None:
            if file.optional:
                continue
            return f"{file.path} is missing from the install record"
        if file.size is not None and entry.size != file.size:
            return f"{file.path} was installed with another size than the manifest pins"
        if file.sha256 is not None and entry.sha256 != file.sha256:
            return f"{file.path} was installed with another sha256 than the manifest pins"
    for entry in record.files:
        path = folder / entry.path
        try:
            size = path.stat().st_size
        except OSError:
            return f"{entry.path} is missing"
        if size != entry.size:
            return f"{entry.path} has {size} bytes, the install record says {entry.size}"
        if rehash and _digests(path, git_blob=False)[0] != entry.sha256:
            return f"{entry.path} no longer matches its recorded sha256"
    return None


def _digests(path: Path, *, git_blob: bool) -> tuple[str, str | None]:
    """sha256 of a file, and its git blob sha1 (the hub's ETag of non-LFS files) if asked."""
    sha256 = hashlib.sha256()
    sha1 = None
    if git_blob:
        sha1 = hashlib.sha1(usedforsecurity=False)
        sha1.update(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            sha256.update(chunk)
            if sha1 is not None:
                sha1.update(chunk)
    return sha256.hexdigest(), (sha1.hexdigest() if sha1 is not None else None)


# -- progress --------------------------------------------------------------------------------


class _LogProgress(tqdm):
    """A tqdm that logs a line every few seconds (and at the end) instead of drawing a bar."""

    monitor_interval = 0  # no tqdm monitor thread

    def __init__(self, *args: Any, label: str, **kwargs: Any):
        kwargs.update(desc=label, mininterval=_PROGRESS_LOG_SECONDS, file=io.StringIO())
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if self.total:
            done, total = _mb(self.n), _mb(self.total)
            percent = 100.0 * self.n / self.total
            log.info("downloading %s: %s of %s (%.0f%%)", self.desc, done, total, percent)
        else:
            log.info("downloading %s: %s", self.desc, _mb(self.n))
        return True


def _terminal_bar(label: str) -> Callable[..., tqdm]:
    def bar(**kwargs: Any) -> tqdm:
        kwargs["desc"] = label
        return tqdm(unit_divisor=1024, **kwargs)

    return bar


def _progress_class(label: str, bar: bool) -> Callable[..., tqdm]:
    """A tqdm factory for huggingface_hub: a bar on a terminal, log lines otherwise."""
    return _terminal_bar(label) if bar else functools.partial(_LogProgress, label=label)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# -- preparing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Remote:
    """What the hub says about one file at the pinned revision."""

    file: ManifestFile
    size: int | None
    etag: str | None
    absent: bool = False  # optional file that the revision does not have


class _Installer:
    """Downloads, verifies and installs one bundle into the model directory."""

    def __init__(self, manifest: Manifest, model_dir: Path, *, bar: bool):
        self.manifest = manifest
        self.model_dir = model_dir
        self.bar = bar
        self.target = model_dir / manifest.name
        self.staging_root = model_dir / STAGING_DIR
        self.staging = self.staging_root / manifest.name
        self.ready = self.staging_root / f"{manifest.name}.ready"
        self.old = self.staging_root / f"{manifest.name}.old"
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")

    # messages

    def fail(self, what: str, fix: str, file: str | None = None) -> BundleError:
        where = f"bundle {self.manifest.name}" + (f": {file}" if file else "")
        return BundleError(f"{where}: {what}. Fix: {fix}")

    def os_error(self, exc: OSError, file: str | None = None) -> BundleError:
        place = exc.filename or self.model_dir
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return self.fail(
                f"cannot write {place} ({os.strerror(exc.errno)})",
                "make DECIDEALOT_MODEL_DIR writable by the service's user "
                f"(uid {os.getuid()}) or point it at a writable directory",
                file,
            )
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return self.fail(
                f"no space left on the device holding {self.model_dir}",
                "free disk space or point DECIDEALOT_MODEL_DIR at a larger volume, then start "
                "again (verified files are kept)",
                file,
            )
        return self.fail(
            f"file system error at {place}: {exc.strerror or exc}",
            f"check that {self.model_dir} is a healthy, writable directory and start again",
            file,
        )

    def hub_error(self, exc: Exception, file: str) -> BundleError:
        repo, rev = self.manifest.repo, self.manifest.revision
        if isinstance(exc, GatedRepoError):
            return self.fail(
                f"{repo} is gated and this token has no access",
                "accept the model's terms on the hub and set HF_TOKEN to a token of that account",
                file,
            )
        if isinstance(exc, RepositoryNotFoundError):
            return self.fail(
                f"repository {repo} not found at {self.endpoint} (or private)",
                "check HF_ENDPOINT; for a private mirror set HF_TOKEN to a token with read access",
                file,
            )
        if isinstance(exc, RevisionNotFoundError):
            return self.fail(
                f"revision {rev} not found in {repo} at {self.endpoint}",
                "the pinned commit must exist on the endpoint; check HF_ENDPOINT or sync the "
                "mirror",
                file,
            )
        if isinstance(exc, RemoteEntryNotFoundError):
            return self.fail(
                f"not found in {repo} at revision {rev} (HTTP 404)",
                "the endpoint does not serve the pinned file; check HF_ENDPOINT or sync the "
                "mirror, or fix the bundle manifest",
                file,
            )
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else "error"
            if status in (401, 403):
                fix = "set HF_TOKEN to a token with read access to the repository"
            else:
                fix = "retry later; the hub or the mirror at HF_ENDPOINT is failing"
            return self.fail(f"the hub answered HTTP {status} for {repo}", fix, file)
        if isinstance(exc, OfflineModeIsEnabled):
            return self.offline()
        if isinstance(exc, httpx2.TimeoutException):
            return self.fail(
                f"timed out talking to {self.endpoint}",
                "check the network; raise HF_HUB_DOWNLOAD_TIMEOUT / HF_HUB_ETAG_TIMEOUT on a slow "
                "link, then start again (verified files are kept)",
                file,
            )
        if isinstance(exc, (httpx2.TransportError, FileMetadataError, LocalEntryNotFoundError)):
            return self.fail(
                f"cannot reach the hub at {self.endpoint} ({type(exc).__name__})",
                "check network access, proxy settings (HTTPS_PROXY) and HF_ENDPOINT, install "
                "the bundle with `decidealot prepare` on a connected machine and copy "
                f"DECIDEALOT_MODEL_DIR, or {slot(self.manifest.name).replacement}",
                file,
            )
        if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
            return self.fail(
                "the transfer ended early (fewer bytes than the hub announced); nothing was "
                "installed",
                "start again to retry the download; if it keeps failing check the network, proxy "
                "or HF_ENDPOINT",
                file,
            )
        if isinstance(exc, OSError):
            return self.os_error(exc, file)
        return self.fail(
            f"download failed ({type(exc).__name__})",
            "start again; if it persists check HF_ENDPOINT and the network",
            file,
        )

    def offline(self) -> BundleError:
        return self.fail(
            f"not installed in {self.model_dir} and HF_HUB_OFFLINE is set",
            "unset HF_HUB_OFFLINE for the first start, copy in a model directory prepared with "
            f"`decidealot prepare`, or {slot(self.manifest.name).replacement}",
        )

    # steps

    def install(self, *, rehash: bool) -> None:
        problem = self.problem(rehash=rehash)
        if problem is None:
            log.info("bundle %s ready at %s", self.manifest.name, self.target)
            return
        if constants.is_offline_mode():
            raise self.offline()
        try:
            self.staging_root.mkdir(parents=True, exist_ok=True)
            with FileLock(str(self.staging_root / f"{self.manifest.name}.lock")):
                # Another process may have installed it while this one waited for the lock.
                problem = self.problem(rehash=rehash)
                if problem is None:
                    return
                log.info("bundle %s: %s; preparing it", self.manifest.name, problem)
                if self.recover_ready():
                    return
                self.download_and_install()
        except OSError as exc:
            raise self.os_error(exc) from None

    def problem(self, *, rehash: bool) -> str | None:
        if not self.target.exists():
            return "not installed"
        if _read_record(self.target) is None:
            raise self.fail(
                f"{self.target} exists but holds no install record, so it was not installed by "
                "Decidealot",
                "move it away to let Decidealot install the bundle, or use it as is by setting "
                f"{slot(self.manifest.name).variable}={self.target}",
            )
        return _installed_problem(self.manifest, self.target, rehash=rehash)

    def recover_ready(self) -> bool:
        """Finish an install that stopped between verifying and renaming into place."""
        if not self.ready.is_dir() or self.target.exists():
            return False
        if _installed_problem(self.manifest, self.ready, rehash=True) is not None:
            return False
        os.replace(self.ready, self.target)
        log.info("bundle %s installed at %s", self.manifest.name, self.target)
        return True

    def download_and_install(self) -> None:
        _remove_stale_partials(self.staging)
        remotes = [self.remote(file) for file in self.manifest.files]
        present = [r for r in remotes if not r.absent]
        self.check_space(present)
        total = sum(r.size or 0 for r in present)
        log.info(
            "bundle %s: fetching %d files (%s) from %s@%s",
            self.manifest.name,
            len(present),
            _mb(total),
            self.manifest.repo,
            self.manifest.revision[:12],
        )
        verified = [self.fetch_and_verify(remote) for remote in present]
        self.commit(verified)

    def remote(self, file: ManifestFile) -> _Remote:
        """Ask the hub what it serves at the pinned revision before downloading anything."""
        m = self.manifest
        url = hf_hub_url(
            m.repo,
            file.path,
            subfolder=m.subfolder or None,
            revision=m.revision,
            endpoint=self.endpoint,
        )
        try:
            meta = get_hf_file_metadata(url, endpoint=self.endpoint)
        except RemoteEntryNotFoundError as exc:
            if file.optional:
                return _Remote(file, None, None, absent=True)
            raise self.hub_error(exc, file.path) from None
        except Exception as exc:
            raise self.hub_error(exc, file.path) from None
        if meta.commit_hash != m.revision:
            raise self.fail(
                f"the endpoint served commit {meta.commit_hash} instead of the pinned {m.revision}",
                "check HF_ENDPOINT: the mirror must serve the pinned revision",
                file.path,
            )
        if file.size is not None and meta.size is not None and meta.size != file.size:
            raise self.fail(
                f"the hub announces {meta.size} bytes but the manifest pins {file.size}",
                "the endpoint serves another file than the pinned one; check HF_ENDPOINT or fix "
                "the manifest",
                file.path,
            )
        etag = (meta.etag or "").lower() or None
        if file.sha256 is not None and etag and _SHA256.fullmatch(etag) and etag != file.sha256:
            raise self.fail(
                f"the hub announces sha256 {etag} but the manifest pins {file.sha256}",
                "the endpoint serves another file than the pinned one; check HF_ENDPOINT or fix "
                "the manifest",
                file.path,
            )
        return _Remote(file, file.size if file.size is not None else meta.size, etag)

    def check_space(self, remotes: Iterable[_Remote]) -> None:
        needed = sum(r.size or 0 for r in remotes if not self.staged(r.file.path).is_file())
        free = shutil.disk_usage(self.model_dir).free
        if needed > free:
            raise self.fail(
                f"needs {_mb(needed)} free in {self.model_dir}, only {_mb(free)} available",
                "free disk space or point DECIDEALOT_MODEL_DIR at a larger volume",
            )

    def staged(self, path: str) -> Path:
        sub = self.manifest.subfolder
        return self.staging / sub / path if sub else self.staging / path

    def fetch_and_verify(self, remote: _Remote) -> RecordFile:
        m, file = self.manifest, remote.file
        label = f"{m.name}/{file.path}"
        try:
            local = Path(
                hf_hub_download(
                    m.repo,
                    file.path,
                    subfolder=m.subfolder or None,
                    revision=m.revision,
                    local_dir=self.staging,
                    endpoint=self.endpoint,
                    tqdm_class=_progress_class(label, self.bar),
                )
            )
        except Exception as exc:
            raise self.hub_error(exc, file.path) from None
        try:
            return self.verify(remote, local)
        except BundleError:
            local.unlink(missing_ok=True)  # never reuse a file that failed verification
            raise

    def verify(self, remote: _Remote, local: Path) -> RecordFile:
        file = remote.file
        size = local.stat().st_size
        retry = "start again to download it afresh; if it persists check HF_ENDPOINT and proxies"
        if remote.size is not None and size != remote.size:
            raise self.fail(
                f"downloaded {size} bytes, expected {remote.size}; the file was discarded",
                retry,
                file.path,
            )
        etag = remote.etag
        git_blob = file.sha256 is None and etag is not None and bool(_GIT_SHA1.fullmatch(etag))
        sha256, sha1 = _digests(local, git_blob=git_blob)
        source: DigestSource
        if file.sha256 is not None:
            expected, actual, source = file.sha256, sha256, "manifest"
        elif etag is not None and _SHA256.fullmatch(etag):
            expected, actual, source = etag, sha256, "hub-lfs-sha256"
        elif git_blob and etag is not None:
            expected, actual, source = etag, sha1 or "", "hub-git-sha1"
        else:
            raise self.fail(
                "has no pinned sha256 and the hub gave no digest to check it against",
                "pin its sha256 in the bundle manifest",
                file.path,
            )
        if actual != expected:
            kind = "pinned sha256" if source == "manifest" else "hub's digest at the revision"
            raise self.fail(
                f"digest mismatch: got {actual}, the {kind} is {expected}; the file was discarded",
                retry,
                file.path,
            )
        with local.open("rb") as handle:
            os.fsync(handle.fileno())
        log.info("verified %s/%s (%s)", self.manifest.name, file.path, source)
        return RecordFile(file.path, size, sha256, source)

    def commit(self, verified: list[RecordFile]) -> None:
        """Move verified files into a fresh folder, write the record last, rename into place."""
        m = self.manifest
        shutil.rmtree(self.ready, ignore_errors=True)
        for entry in verified:
            dest = self.ready / entry.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.staged(entry.path), dest)
        record = InstallRecord(m.name, m.repo, m.revision, m.subfolder, tuple(verified))
        _write_durably(self.ready / RECORD_NAME, msgspec.json.format(msgspec.json.encode(record)))
        if self.target.exists():
            shutil.rmtree(self.old, ignore_errors=True)
            os.replace(self.target, self.old)
        os.replace(self.ready, self.target)
        _fsync_dir(self.model_dir)
        shutil.rmtree(self.old, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        log.info("bundle %s installed at %s", m.name, self.target)


def _write_durably(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_partials(staging: Path) -> None:
    """huggingface_hub names partial files per process; a killed process leaves them behind."""
    cache = staging / ".cache"
    if cache.is_dir():
        for partial in cache.rglob("*.incomplete"):
            partial.unlink(missing_ok=True)


def prepare(settings: Settings, *, progress: bool, rehash: bool = False) -> None:
    """Make every enabled bundle installed and verified; raise BundleError otherwise.

    Every bundle is tried, so one message names all that failed, each with what replaces it: a
    user without hub access then fixes the configuration once, not once per bundle. `progress`
    draws tqdm bars (pass `sys.stderr.isatty()`); without them, download progress goes to log
    lines. `rehash` re-hashes installed files instead of trusting their install record and sizes.
    """
    failed: list[tuple[str, BundleError]] = []
    for manifest in enabled_bundles(settings):
        try:
            _Installer(manifest, settings.model_dir, bar=progress).install(rehash=rehash)
        except BundleError as exc:
            failed.append((manifest.name, exc))
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        lines = [f"{len(failed)} enabled bundles cannot be prepared:"]
        for name, exc in failed:
            place = slot(name)
            text = str(exc)
            lines.append(
                f"  {text}" if place.variable in text else f"  {text}; or {place.replacement}"
            )
        lines.append(f"  ({TINY_HINT})")
        raise BundleError("\n".join(lines))
