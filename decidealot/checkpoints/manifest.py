"""Bundle manifests, which pin a bundle's hub repository, revision and files (sizes, sha256),
and install records, what was verified."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal

import msgspec
from huggingface_hub.utils.sha import git_hash

RECORD_NAME = ".decidealot-bundle.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
GIT_SHA1 = re.compile(r"[0-9a-f]{40}")

DigestSource = Literal["manifest", "hub-lfs-sha256", "hub-git-sha1"]


class BundleError(Exception):
    """A bundle cannot be prepared; the message is one line naming the bundle, file and fix."""


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


def load_manifest(folder: Path, name: str) -> Manifest:
    path = folder / f"{name}.json"
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
    if not GIT_SHA1.fullmatch(manifest.revision):
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
        if file.sha256 is not None and not SHA256.fullmatch(file.sha256):
            return f"file {file.path}: sha256 must be 64 lowercase hex digits or null"
    return None


def read_record(folder: Path) -> InstallRecord | None:
    try:
        return msgspec.json.decode((folder / RECORD_NAME).read_bytes(), type=InstallRecord)
    except (OSError, msgspec.DecodeError):
        return None


def installed_problem(manifest: Manifest, folder: Path, *, rehash: bool) -> str | None:
    """Why `folder` is not a verified install of `manifest`, or None when it is."""
    record = read_record(folder)
    if record is None:
        return "no readable install record"
    pinned = (manifest.name, manifest.repo, manifest.revision, manifest.subfolder)
    if (record.bundle, record.repo, record.revision, record.subfolder) != pinned:
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
        if rehash and digests(path, git_blob=False)[0] != entry.sha256:
            return f"{entry.path} no longer matches its recorded sha256"
    return None


def digests(path: Path, *, git_blob: bool) -> tuple[str, str | None]:
    """sha256 of a file, and its git blob sha1 (the hub's ETag of non-LFS files) if asked."""
    with path.open("rb") as handle:
        sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    return sha256, git_hash(path.read_bytes()) if git_blob else None
