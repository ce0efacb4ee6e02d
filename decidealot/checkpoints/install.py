"""Download, verify and install bundles (`serve` before it listens, and `prepare`); no torch.

Each file is fetched with huggingface_hub into a staging folder in the model directory and checked
against its pinned size and sha256 (else the hub's digest at the pinned revision) before the folder
is renamed into place: a later start trusts its install record after a size check, no request.
"""

from __future__ import annotations

import errno
import functools
import io
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

from decidealot.checkpoints.manifest import (
    GIT_SHA1,
    RECORD_NAME,
    SHA256,
    BundleError,
    DigestSource,
    InstallRecord,
    Manifest,
    ManifestFile,
    RecordFile,
    digests,
    installed_problem,
    load_manifest,
    read_record,
)
from decidealot.checkpoints.paths import TINY_HINT, Placed, ownership_fix, to_download
from decidealot.config import Settings

log = logging.getLogger("decidealot.bundles")

STAGING_DIR = ".staging"
_CHECK_MIRROR = "check HF_ENDPOINT or sync the mirror"
_START_AGAIN = "start again (verified files are kept)"
_OTHER_FILE = (
    "the endpoint serves another file than the pinned one; check HF_ENDPOINT or fix the manifest"
)
_PROGRESS_LOG_SECONDS = 10.0


class _LogProgress(tqdm):
    """A tqdm that logs a line every few seconds (and at the end) instead of drawing a bar."""

    monitor_interval = 0  # no tqdm monitor thread

    def __init__(self, *args: Any, label: str, **kwargs: Any):
        kwargs.update(desc=label, mininterval=_PROGRESS_LOG_SECONDS, file=io.StringIO())
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if self.total:
            done, total = mb(self.n), mb(self.total)
            percent = 100.0 * self.n / self.total
            log.info("downloading %s: %s of %s (%.0f%%)", self.desc, done, total, percent)
        else:
            log.info("downloading %s: %s", self.desc, mb(self.n))
        return True


class _Bar(tqdm):
    def __init__(self, *args: Any, label: str, **kwargs: Any):
        super().__init__(*args, **(kwargs | {"desc": label, "unit_divisor": 1024}))


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass(frozen=True)
class _Remote:
    file: ManifestFile
    size: int | None
    etag: str | None
    absent: bool = False  # optional file that the revision does not have


class _Installer:
    def __init__(self, placed: Placed, manifest: Manifest, model_dir: Path, *, bar: bool):
        self.placed = placed
        self.manifest = manifest
        self.model_dir = model_dir
        self.bar = bar
        self.target = model_dir / manifest.name
        self.staging_root = model_dir / STAGING_DIR
        self.staging = self.staging_root / manifest.name
        self.ready = self.staging_root / f"{manifest.name}.ready"
        self.old = self.staging_root / f"{manifest.name}.old"
        self.endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.pinned = {
            "subfolder": manifest.subfolder or None,
            "revision": manifest.revision,
            "endpoint": self.endpoint,
        }

    def fail(self, what: str, fix: str, file: str | None = None) -> BundleError:
        where = f"bundle {self.manifest.name}" + (f": {file}" if file else "")
        return BundleError(f"{where}: {what}. Fix: {fix}")

    def os_error(self, exc: OSError, file: str | None = None) -> BundleError:
        place = exc.filename or self.model_dir
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            what = f"cannot write {place} ({os.strerror(exc.errno)})"
            fix = (
                f"{ownership_fix(self.model_dir)}; or point DECIDEALOT_MODEL_DIR at a writable "
                "directory"
            )
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
            what = f"no space left on the device holding {self.model_dir}"
            fix = (
                "free disk space or point DECIDEALOT_MODEL_DIR at a larger volume, then "
                + _START_AGAIN
            )
        else:
            what = f"file system error at {place}: {exc.strerror or exc}"
            fix = f"check that {self.model_dir} is a healthy, writable directory and start again"
        return self.fail(what, fix, file)

    def hub_error(self, exc: Exception, file: str) -> BundleError:
        repo, rev, endpoint = self.manifest.repo, self.manifest.revision, self.endpoint
        if isinstance(exc, GatedRepoError):
            what = f"{repo} is gated and this token has no access"
            fix = "accept the model's terms on the hub and set HF_TOKEN to a token of that account"
        elif isinstance(exc, RepositoryNotFoundError):
            what = f"repository {repo} not found at {endpoint} (or private)"
            fix = "check HF_ENDPOINT; for a private mirror set HF_TOKEN to a token with read access"
        elif isinstance(exc, RevisionNotFoundError):
            what = f"revision {rev} not found in {repo} at {endpoint}"
            fix = f"the pinned commit must exist on the endpoint; {_CHECK_MIRROR}"
        elif isinstance(exc, RemoteEntryNotFoundError):
            what = f"not found in {repo} at revision {rev} (HTTP 404)"
            fix = (
                f"the endpoint does not serve the pinned file; {_CHECK_MIRROR}, or fix the bundle "
                "manifest"
            )
        elif isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else "error"
            what = f"the hub answered HTTP {status} for {repo}"
            if status in (401, 403):
                fix = "set HF_TOKEN to a token with read access to the repository"
            else:
                fix = "retry later; the hub or the mirror at HF_ENDPOINT is failing"
        elif isinstance(exc, OfflineModeIsEnabled):
            return self.offline()
        elif isinstance(exc, httpx2.TimeoutException):
            what = f"timed out talking to {endpoint}"
            fix = (
                "check the network; raise HF_HUB_DOWNLOAD_TIMEOUT / HF_HUB_ETAG_TIMEOUT on a slow "
                f"link, then {_START_AGAIN}"
            )
        elif isinstance(exc, (httpx2.TransportError, FileMetadataError, LocalEntryNotFoundError)):
            what = f"cannot reach the hub at {endpoint} ({type(exc).__name__})"
            fix = (
                "check network access, proxy settings (HTTPS_PROXY) and HF_ENDPOINT, install "
                "the bundle with `decidealot prepare` on a connected machine and copy "
                f"DECIDEALOT_MODEL_DIR, or {self.placed.replacement}"
            )
        elif isinstance(exc, OSError) and "Consistency check failed" in str(exc):
            what = (
                "the transfer ended early (fewer bytes than the hub announced); nothing was "
                "installed"
            )
            fix = (
                "start again to retry the download; if it keeps failing check the network, proxy "
                "or HF_ENDPOINT"
            )
        elif isinstance(exc, OSError):
            return self.os_error(exc, file)
        else:
            what = f"download failed ({type(exc).__name__})"
            fix = "start again; if it persists check HF_ENDPOINT and the network"
        return self.fail(what, fix, file)

    def offline(self) -> BundleError:
        return self.fail(
            f"not installed in {self.model_dir} and HF_HUB_OFFLINE is set",
            "unset HF_HUB_OFFLINE for the first start, copy in a model directory prepared with "
            f"`decidealot prepare`, or {self.placed.replacement}",
        )

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
        if read_record(self.target) is None:
            raise self.fail(
                f"{self.target} exists but holds no install record, so it was not installed by "
                "Decidealot",
                "move it away to let Decidealot install the bundle, or use it as is by setting "
                f"{self.placed.bundle.variable}={self.target}",
            )
        return installed_problem(self.manifest, self.target, rehash=rehash)

    def recover_ready(self) -> bool:
        """Finish an install that stopped between verifying and renaming into place."""
        if not self.ready.is_dir() or self.target.exists():
            return False
        if installed_problem(self.manifest, self.ready, rehash=True) is not None:
            return False
        os.replace(self.ready, self.target)
        log.info("bundle %s installed at %s", self.manifest.name, self.target)
        return True

    def download_and_install(self) -> None:
        # huggingface_hub names partial files per process; a killed process leaves them behind
        for partial in (self.staging / ".cache").rglob("*.incomplete"):
            partial.unlink(missing_ok=True)
        m = self.manifest
        present = [r for r in map(self.remote, m.files) if not r.absent]
        self.check_space(present)
        files = f"{len(present)} files ({mb(sum(r.size or 0 for r in present))})"
        log.info("bundle %s: fetching %s from %s@%s", m.name, files, m.repo, m.revision[:12])
        self.commit([self.fetch_and_verify(remote) for remote in present])

    def remote(self, file: ManifestFile) -> _Remote:
        """Ask the hub what it serves at the pinned revision before downloading anything."""
        m = self.manifest
        try:
            url = hf_hub_url(m.repo, file.path, **self.pinned)
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
                _OTHER_FILE,
                file.path,
            )
        etag = (meta.etag or "").lower() or None
        if file.sha256 is not None and etag and SHA256.fullmatch(etag) and etag != file.sha256:
            raise self.fail(
                f"the hub announces sha256 {etag} but the manifest pins {file.sha256}",
                _OTHER_FILE,
                file.path,
            )
        return _Remote(file, file.size if file.size is not None else meta.size, etag)

    def check_space(self, remotes: Iterable[_Remote]) -> None:
        needed = sum(r.size or 0 for r in remotes if not self.staged(r.file.path).is_file())
        free = shutil.disk_usage(self.model_dir).free
        if needed > free:
            raise self.fail(
                f"needs {mb(needed)} free in {self.model_dir}, only {mb(free)} available",
                "free disk space or point DECIDEALOT_MODEL_DIR at a larger volume",
            )

    def staged(self, path: str) -> Path:
        sub = self.manifest.subfolder
        return self.staging / sub / path if sub else self.staging / path

    def fetch_and_verify(self, remote: _Remote) -> RecordFile:
        m, file = self.manifest, remote.file
        bar = functools.partial(_Bar if self.bar else _LogProgress, label=f"{m.name}/{file.path}")
        try:
            local = Path(
                hf_hub_download(
                    m.repo, file.path, local_dir=self.staging, tqdm_class=bar, **self.pinned
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
        git_blob = file.sha256 is None and etag is not None and bool(GIT_SHA1.fullmatch(etag))
        sha256, sha1 = digests(local, git_blob=git_blob)
        source: DigestSource
        if file.sha256 is not None:
            expected, actual, source = file.sha256, sha256, "manifest"
        elif etag is not None and SHA256.fullmatch(etag):
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
        _fsync(local)
        log.info("verified %s/%s (%s)", self.manifest.name, file.path, source)
        return RecordFile(file.path, size, sha256, source)

    def commit(self, verified: list[RecordFile]) -> None:
        """The record is written last, then the folder renamed into place: a crash leaves no
        bundle that looks installed."""
        m = self.manifest
        shutil.rmtree(self.ready, ignore_errors=True)
        for entry in verified:
            dest = self.ready / entry.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.staged(entry.path), dest)
        record = InstallRecord(m.name, m.repo, m.revision, m.subfolder, tuple(verified))
        (self.ready / RECORD_NAME).write_bytes(msgspec.json.format(msgspec.json.encode(record)))
        _fsync(self.ready / RECORD_NAME)
        _fsync(self.ready)
        if self.target.exists():
            shutil.rmtree(self.old, ignore_errors=True)
            os.replace(self.target, self.old)
        os.replace(self.ready, self.target)
        _fsync(self.model_dir)
        shutil.rmtree(self.old, ignore_errors=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        log.info("bundle %s installed at %s", m.name, self.target)


def _fsync(path: Path) -> None:
    """A file's data, or a folder's entries, on disk (an fsync works on a read-only descriptor)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_enabled(settings: Settings, *, progress: bool, rehash: bool = False) -> None:
    """Make every enabled bundle installed and verified, or raise one BundleError naming all that
    failed, each with what replaces it, so a user without hub access fixes the configuration once.
    `progress`: tqdm bars, else log lines. `rehash`: trust no install record, re-hash every file."""
    failed: list[tuple[Placed, BundleError]] = []
    for placed in to_download(settings):
        try:
            manifest = load_manifest(placed.manifests(settings), placed.name)
            _Installer(placed, manifest, settings.model_dir, bar=progress).install(rehash=rehash)
        except BundleError as exc:
            failed.append((placed, exc))
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        lines = [f"{len(failed)} enabled bundles cannot be prepared:"]
        for placed, exc in failed:
            hint = "" if placed.bundle.variable in str(exc) else f"; or {placed.replacement}"
            lines.append(f"  {exc}{hint}")
        lines.append(f"  ({TINY_HINT})")
        raise BundleError("\n".join(lines))
