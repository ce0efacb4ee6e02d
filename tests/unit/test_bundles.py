"""Bundle download, verification and install, run for real against a local fake hub."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import msgspec
import pytest
from huggingface_hub import constants

from decidealot import registry
from decidealot.checkpoints import install as bundles
from decidealot.checkpoints import paths
from decidealot.checkpoints.install import RECORD_NAME, BundleError, InstallRecord
from decidealot.checkpoints.manifest import load_manifest
from decidealot.config import Settings
from tests.support.fake_hub import FakeHub, running_hub

REPO_ROOT = Path(__file__).resolve().parents[2]
VON_COMMIT = hashlib.sha1(b"tiny von", usedforsecurity=False).hexdigest()
LAYA_COMMIT = hashlib.sha1(b"tiny laya", usedforsecurity=False).hexdigest()
CLM_COMMIT = hashlib.sha1(b"tiny clm", usedforsecurity=False).hexdigest()


def _path(bundle: str, settings: Settings) -> Path:
    """Where the providers are told bundle `bundle`'s checkpoint is."""
    return next(p for p in paths.every_bundle() if p.name == bundle).path(settings)


def _bytes(seed: str, n: int) -> bytes:
    out = bytearray()
    block = seed.encode()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:n])


def _safetensors(seed: str, n: int) -> bytes:
    """`n` bytes of a safetensors file (one uint8 tensor of `_bytes(seed)`): startup reads its
    header."""
    header = b""
    for _ in range(2):  # the header names the data's length, which depends on the header's
        data = n - 8 - len(header)
        tensor = {"dtype": "U8", "shape": [data], "data_offsets": [0, data]}
        header = json.dumps({"weights": tensor}).encode()
    return len(header).to_bytes(8, "little") + header + _bytes(seed, n - 8 - len(header))


def _entry(path: str, content: bytes | None, *, pin: bool, optional: bool = False) -> dict:
    pinned = pin and content is not None
    entry: dict = {
        "path": path,
        "size": len(content) if pinned and content is not None else None,
        "sha256": hashlib.sha256(content).hexdigest() if pinned and content is not None else None,
    }
    if optional:
        entry["optional"] = True
    return entry


class TinyHub:
    """Tiny bundles published on a fake hub, with manifests written for them."""

    def __init__(self, hub: FakeHub, root: Path):
        self.hub = hub
        self.manifests = root / "manifests"
        self.manifests.mkdir()
        self.models = root / "models"
        self.von = {
            "config.json": (b'{"model_type": "modernbert", "hidden_size": 32}', False),
            "tokenizer.json": (
                json.dumps({"model": "tiny", "vocab": ["tiny"] * 60}).encode(),
                False,
            ),
            "tokenizer_config.json": (b'{"mask_token": "[MASK]"}', False),
            "model.safetensors": (_bytes("von weights", 300_000), True),
            "option_marker.pt": (_bytes("von marker", 200_000), True),
            "marker_calibration.json": (b'{"temperature": 2.2}', False),
        }
        hub.add_repo("tiny/von", VON_COMMIT, self.von)
        # model.safetensors is pinned; the rest is verified against the hub's own digests.
        self.write(
            "von-1.1",
            "tiny/von",
            VON_COMMIT,
            "",
            [
                _entry("config.json", self.von["config.json"][0], pin=False),
                _entry("tokenizer.json", self.von["tokenizer.json"][0], pin=False),
                _entry("tokenizer_config.json", self.von["tokenizer_config.json"][0], pin=False),
                _entry("special_tokens_map.json", None, pin=False, optional=True),
                _entry("model.safetensors", self.von["model.safetensors"][0], pin=True),
                _entry("option_marker.pt", self.von["option_marker.pt"][0], pin=False),
                _entry("marker_calibration.json", self.von["marker_calibration.json"][0], pin=True),
            ],
        )
        laya: dict[str, tuple[bytes, bool]] = {}
        for name, sub in (
            ("laya-english", ""),
            ("laya-multilingual", "multilingual"),
            ("laya-typed-decisions", "typed-decisions"),
        ):
            prefix = f"{sub}/" if sub else ""
            files = {
                "rl_agent_config.json": (json.dumps({"encoder": name}).encode(), False),
                "model.safetensors": (_safetensors(name, 120_000), True),
                "tokenizer/tokenizer.json": (b'{"version": "1.0"}', False),
                "tokenizer/tokenizer_config.json": (b'{"mask_token": "[MASK]"}', False),
                "encoder/config.json": (b'{"hidden_size": 64}', False),
            }
            laya.update({prefix + path: value for path, value in files.items()})
            self.write(
                name,
                "tiny/laya",
                LAYA_COMMIT,
                sub,
                [_entry(p, c, pin=p == "model.safetensors") for p, (c, _) in files.items()],
            )
        hub.add_repo("tiny/laya", LAYA_COMMIT, laya)
        self.clm_head = _bytes("clm head", 90_000)
        hub.add_repo("tiny/clm", CLM_COMMIT, {"CLM_v0.1-8B.pt": (self.clm_head, True)})
        self.write(
            "clm-0.1-8b",
            "tiny/clm",
            CLM_COMMIT,
            "",
            [_entry("CLM_v0.1-8B.pt", self.clm_head, pin=True)],
        )

    def write(self, name: str, repo: str, commit: str, sub: str, files: list[dict]) -> None:
        manifest = {
            "name": name,
            "repo": repo,
            "revision": commit,
            "subfolder": sub,
            "files": files,
        }
        (self.manifests / f"{name}.json").write_text(json.dumps(manifest))

    def settings(self, **overrides: object) -> Settings:
        values: dict[str, object] = {
            "model_dir": self.models,
            "bundle_manifest_dir": self.manifests,
            "laya_enabled": False,
            "von_enabled": True,
        }
        values.update(overrides)
        return registry.settings(**values)  # type: ignore[arg-type]

    def env(self) -> dict[str, str]:
        """The environment a separate `decidealot prepare` process gets for this hub."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DECIDEALOT_", "HF_"))}
        env.update(
            DECIDEALOT_MODEL_DIR=str(self.models),
            DECIDEALOT_BUNDLE_MANIFEST_DIR=str(self.manifests),
            DECIDEALOT_LAYA_ENABLED="false",
            DECIDEALOT_VON_ENABLED="true",
            HF_ENDPOINT=self.hub.endpoint,
            HF_HUB_CACHE=str(self.models.parent / "hf-cache"),
            HF_HUB_OFFLINE="0",
        )
        return env


@pytest.fixture
def hub_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TinyHub]:
    with running_hub() as hub:
        # conftest keeps the suite offline; these tests talk only to the local fake hub.
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
        yield TinyHub(hub, tmp_path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _record(folder: Path) -> InstallRecord:
    return msgspec.json.decode((folder / RECORD_NAME).read_bytes(), type=InstallRecord)


def _assert_nothing_installed(hub_repo: TinyHub, name: str = "von-1.1") -> None:
    assert not (hub_repo.models / name).exists()


def _one_line(error: BundleError, *needles: str) -> str:
    message = str(error)
    assert "\n" not in message
    assert "Fix: " in message
    for needle in needles:
        assert needle in message, message
    return message


# -- success and a second start --------------------------------------------------------------


def test_install_then_second_start_makes_no_request(hub_repo: TinyHub) -> None:
    settings = hub_repo.settings()
    bundles.install_enabled(settings, progress=False)

    folder = _path("von-1.1", settings)
    assert folder == hub_repo.models / "von-1.1"
    for path, (content, _) in hub_repo.von.items():
        assert (folder / path).read_bytes() == content
    assert not (folder / "special_tokens_map.json").exists()  # optional, absent at the revision
    assert not (hub_repo.models / bundles.STAGING_DIR / "von-1.1").exists()

    record = _record(folder)
    assert record.revision == VON_COMMIT
    sources = {f.path: f.digest_source for f in record.files}
    assert sources == {
        "config.json": "hub-git-sha1",
        "tokenizer.json": "hub-git-sha1",
        "tokenizer_config.json": "hub-git-sha1",
        "model.safetensors": "manifest",
        "option_marker.pt": "hub-lfs-sha256",
        "marker_calibration.json": "manifest",
    }
    for entry in record.files:  # every file's sha256 is recorded, pinned or not
        assert entry.sha256 == hashlib.sha256(hub_repo.von[entry.path][0]).hexdigest()
    assert hub_repo.hub.count("GET", "/cdn/") == 2  # both LFS files came through the CDN redirect

    hub_repo.hub.requests.clear()
    bundles.install_enabled(hub_repo.settings(), progress=False)
    assert hub_repo.hub.requests == []


def test_laya_subfolders_and_clm_head_install_where_providers_look(
    hub_repo: TinyHub, caplog: pytest.LogCaptureFixture
) -> None:
    settings = hub_repo.settings(
        laya_enabled=True, von_enabled=False, clm_embeddings_url="http://127.0.0.1:9/v1"
    )
    names = [placed.name for placed in paths.to_download(settings)]
    assert names == ["laya-english", "laya-multilingual", "laya-typed-decisions", "clm-0.1-8b"]
    with caplog.at_level("INFO", logger="decidealot.bundles"):
        bundles.install_enabled(settings, progress=False)  # no bars: progress goes to log lines
    assert "downloading laya-multilingual/model.safetensors: 0.1 MB of 0.1 MB (100%)" in (
        caplog.messages
    )

    for name in names[:3]:
        folder = _path(name, settings)
        assert json.loads((folder / "rl_agent_config.json").read_bytes()) == {"encoder": name}
        assert (folder / "encoder" / "config.json").is_file()
        assert not (folder / "multilingual").exists()
    head = _path("clm-0.1-8b", settings)
    assert head == hub_repo.models / "clm-0.1-8b" / "CLM_v0.1-8B.pt"
    assert head.read_bytes() == hub_repo.clm_head


def test_local_overrides_skip_their_bundles(hub_repo: TinyHub, tmp_path: Path) -> None:
    own = tmp_path / "own-von"
    own.mkdir()
    settings = hub_repo.settings(von_checkpoint=own)
    assert paths.to_download(settings) == []
    assert _path("von-1.1", settings) == own
    bundles.install_enabled(settings, progress=False)
    assert hub_repo.hub.requests == []


# -- failures: nothing is installed, the message names bundle, file and fix -------------------


@pytest.mark.parametrize(
    ("path", "against"),
    [
        ("model.safetensors", "pinned sha256"),  # LFS, digest pinned in the manifest
        ("option_marker.pt", "hub's digest"),  # LFS, no pin: the hub's X-Linked-Etag sha256
        ("config.json", "hub's digest"),  # git file, no pin: the hub's ETag git blob sha1
    ],
)
def test_tampered_file_is_refused_and_discarded(hub_repo: TinyHub, path: str, against: str) -> None:
    hub_repo.hub.faults[path] = "tamper"
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "bundle von-1.1", path, "digest mismatch", against)
    _assert_nothing_installed(hub_repo)

    del hub_repo.hub.faults[path]  # the discarded file is fetched afresh next time
    bundles.install_enabled(hub_repo.settings(), progress=False)
    assert (hub_repo.models / "von-1.1" / path).read_bytes() == hub_repo.von[path][0]


def test_cut_transfer_resumes_with_range(
    hub_repo: TinyHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small chunks, so the bytes before the cut reach the file (hub default: 10 MB chunks).
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    hub_repo.hub.faults["option_marker.pt"] = "truncate_once"
    bundles.install_enabled(hub_repo.settings(), progress=False)
    ranged = [r for r in hub_repo.hub.requests if r.range and r.path.startswith("/cdn/")]
    assert len(ranged) == 1 and ranged[0].range != "bytes=0-"
    assert _record(hub_repo.models / "von-1.1").files


def test_short_transfer_is_refused(hub_repo: TinyHub) -> None:
    hub_repo.hub.faults["option_marker.pt"] = "short"
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "option_marker.pt", "ended early")
    _assert_nothing_installed(hub_repo)


def test_missing_file_is_a_404_error(hub_repo: TinyHub) -> None:
    hub_repo.hub.faults["option_marker.pt"] = "missing"
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "bundle von-1.1: option_marker.pt", "HTTP 404", VON_COMMIT)
    _assert_nothing_installed(hub_repo)
    assert hub_repo.hub.count("GET") == 0  # every file is checked on the hub before any download


def test_unknown_revision_and_server_errors(hub_repo: TinyHub) -> None:
    hub_repo.hub.repos["tiny/von"].commit = "f" * 40
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, f"revision {VON_COMMIT} not found")

    hub_repo.hub.repos["tiny/von"].commit = VON_COMMIT
    hub_repo.hub.faults["config.json"] = "error500"
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "config.json", "HTTP 500")
    _assert_nothing_installed(hub_repo)


@pytest.mark.parametrize(
    ("pin", "needle"),
    [
        ({"size": 1}, "the hub announces 300000 bytes but the manifest pins 1"),
        ({"sha256": "0" * 64}, "but the manifest pins " + "0" * 64),
    ],
)
def test_hub_disagreeing_with_pins_is_refused_before_download(
    hub_repo: TinyHub, pin: dict, needle: str
) -> None:
    path = hub_repo.manifests / "von-1.1.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["files"]:
        if entry["path"] == "model.safetensors":
            entry.update(pin)
    path.write_text(json.dumps(manifest))
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "model.safetensors", needle)
    assert hub_repo.hub.count("GET") == 0


def test_mirror_serving_another_commit_is_refused(hub_repo: TinyHub) -> None:
    hub_repo.hub.any_revision = True
    hub_repo.hub.repos["tiny/von"].commit = "e" * 40
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, f"served commit {'e' * 40} instead of the pinned {VON_COMMIT}")
    assert hub_repo.hub.count("GET") == 0


def test_token_is_sent_and_never_echoed(hub_repo: TinyHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub_repo.hub.token = "hf_tinysecret"
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "HF_TOKEN")

    monkeypatch.setenv("HF_TOKEN", "hf_tinysecret")
    hub_repo.hub.requests.clear()
    bundles.install_enabled(hub_repo.settings(), progress=False)
    assert (hub_repo.models / "von-1.1" / RECORD_NAME).is_file()
    cdn = [r for r in hub_repo.hub.requests if r.path.startswith("/cdn/")]
    hub = [r for r in hub_repo.hub.requests if not r.path.startswith("/cdn/")]
    assert cdn and all(r.authorization is None for r in cdn)  # the token stays on the hub
    assert hub and all(r.authorization == "Bearer hf_tinysecret" for r in hub)
    assert "hf_tinysecret" not in str(caught.value)


def test_offline_mode_and_unreachable_hub(
    hub_repo: TinyHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "HF_HUB_OFFLINE")
    assert hub_repo.hub.requests == []

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "cannot reach the hub at http://127.0.0.1:9")
    _assert_nothing_installed(hub_repo)


def test_not_enough_disk_space(hub_repo: TinyHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundles.shutil, "disk_usage", lambda _: SimpleNamespace(free=1000))
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "free in", "DECIDEALOT_MODEL_DIR")
    assert hub_repo.hub.count("GET") == 0


@contextlib.contextmanager
def _tmpfs(path: Path, options: str) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("needs a tmpfs mount (root with CAP_SYS_ADMIN)")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_unwritable_model_dir(hub_repo: TinyHub) -> None:
    if os.geteuid() != 0:
        hub_repo.models.mkdir(mode=0o555)
        guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:  # root writes through permission bits: use a read-only mount instead
        guard = _tmpfs(hub_repo.models, "ro,size=1m")
    with guard, pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "bundle von-1.1", "cannot write", "writable")


def test_disk_fills_up_during_download(hub_repo: TinyHub, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs a small tmpfs mount")
    plenty = SimpleNamespace(free=10**12)
    monkeypatch.setattr(bundles.shutil, "disk_usage", lambda _: plenty)  # pass the pre-check
    with _tmpfs(hub_repo.models, "size=256k"), pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "no space left", "larger volume")


def test_unmanaged_folder_is_left_alone(hub_repo: TinyHub) -> None:
    folder = hub_repo.models / "von-1.1"
    folder.mkdir(parents=True)
    (folder / "mine.txt").write_text("keep")
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "no install record", "DECIDEALOT_VON_CHECKPOINT=")
    assert (folder / "mine.txt").read_text() == "keep"


# -- damaged installs and restarts -----------------------------------------------------------


def test_damaged_install_is_replaced(hub_repo: TinyHub) -> None:
    bundles.install_enabled(hub_repo.settings(), progress=False)
    marker = hub_repo.models / "von-1.1" / "option_marker.pt"
    marker.write_bytes(marker.read_bytes()[:-1])  # size changed: caught by the quick check
    bundles.install_enabled(hub_repo.settings(), progress=False)
    assert marker.read_bytes() == hub_repo.von["option_marker.pt"][0]

    flipped = bytearray(marker.read_bytes())
    flipped[0] ^= 1
    marker.write_bytes(bytes(flipped))  # same size: only a re-hash notices
    hub_repo.hub.requests.clear()
    bundles.install_enabled(hub_repo.settings(), progress=False)
    assert hub_repo.hub.requests == []
    bundles.install_enabled(hub_repo.settings(), progress=False, rehash=True)
    assert marker.read_bytes() == hub_repo.von["option_marker.pt"][0]


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
def test_killed_mid_download_then_restart_finishes_verified(hub_repo: TinyHub) -> None:
    hub_repo.hub.faults["option_marker.pt"] = "stall"
    code = "from decidealot import cli; cli.main(['prepare'])"
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        env=hub_repo.env(),
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert hub_repo.hub.stalled.wait(30), "the child never reached the stalled transfer"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    _assert_nothing_installed(hub_repo)
    staging = hub_repo.models / bundles.STAGING_DIR / "von-1.1"
    assert (staging / "model.safetensors").is_file()  # finished before the kill
    assert list(staging.rglob("*.incomplete"))  # the killed transfer's leftover

    del hub_repo.hub.faults["option_marker.pt"]
    hub_repo.hub.release.set()
    hub_repo.hub.requests.clear()
    bundles.install_enabled(hub_repo.settings(), progress=False)
    record = _record(hub_repo.models / "von-1.1")
    assert {f.path for f in record.files} == set(hub_repo.von)
    assert hub_repo.hub.count("GET", "/cdn/") == 1  # only option_marker.pt was fetched again
    assert not staging.exists()


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
def test_run_prepare_exit_codes_and_no_torch(hub_repo: TinyHub) -> None:
    code = (
        "import sys; from decidealot import cli\n"
        "status = cli.main(['prepare'])\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
        "sys.exit(status)"
    )
    run = [sys.executable, "-c", code]
    hub_repo.hub.faults["config.json"] = "missing"
    failed = subprocess.run(run, env=hub_repo.env(), cwd=REPO_ROOT, capture_output=True, text=True)
    assert failed.returncode == 1
    lines = failed.stderr.strip().splitlines()
    assert lines[-1].startswith("decidealot: bundle von-1.1: config.json: ")

    del hub_repo.hub.faults["config.json"]
    done = subprocess.run(run, env=hub_repo.env(), cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"von-1.1: {hub_repo.models / 'von-1.1'}" in done.stdout
    assert "torch not loaded" in done.stdout


# -- manifests -------------------------------------------------------------------------------


def test_shipped_manifests_hold_what_providers_load(tmp_path: Path) -> None:
    settings = registry.settings(model_dir=tmp_path, clm_embeddings_url="http://127.0.0.1:9/v1")
    shipped = {  # each one validates
        placed.name: load_manifest(placed.manifests(settings), placed.name)
        for placed in paths.to_download(settings)
    }
    assert list(shipped) == [placed.name for placed in paths.every_bundle()]
    needed = {
        "laya-english": {
            "rl_agent_config.json",
            "model.safetensors",
            "tokenizer/tokenizer.json",
            "encoder/config.json",
        },
        "von-1.1": {"config.json", "tokenizer.json", "option_marker.pt", "marker_calibration.json"},
        "clm-0.1-8b": {_path("clm-0.1-8b", settings).name},
    }
    needed["laya-multilingual"] = needed["laya-typed-decisions"] = needed["laya-english"]
    for name, manifest in shipped.items():
        required = {f.path for f in manifest.files if not f.optional}
        assert needed[name] <= required, name
    laya = [shipped[n] for n in ("laya-english", "laya-multilingual", "laya-typed-decisions")]
    assert len({(m.repo, m.revision) for m in laya}) == 1  # one bundle repo, one pinned commit
    assert [m.subfolder for m in laya] == ["", "multilingual", "typed-decisions"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"revision": "main"}, "full 40-character commit sha"),
        ({"name": "von-2"}, "expected 'von-1.1'"),
        ({"files": [{"path": "../x", "size": None, "sha256": None}]}, "'..'"),
        ({"files": [{"path": "a", "size": 1, "sha256": "ABC"}]}, "64 lowercase hex"),
        ({"extra": 1}, "invalid"),
    ],
)
def test_bad_manifest_is_refused(hub_repo: TinyHub, change: dict, needle: str) -> None:
    path = hub_repo.manifests / "von-1.1.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "bundle von-1.1: manifest", needle)


def test_missing_manifest_is_refused(hub_repo: TinyHub) -> None:
    (hub_repo.manifests / "von-1.1.json").unlink()
    with pytest.raises(BundleError) as caught:
        bundles.install_enabled(hub_repo.settings(), progress=False)
    _one_line(caught.value, "von-1.1.json not found", "DECIDEALOT_BUNDLE_MANIFEST_DIR")


# -- `decidealot serve` listens only once its bundles are ready -------------------------------


def _serve(hub_repo: TinyHub, port: int) -> subprocess.Popen[str]:
    env = hub_repo.env() | {"DECIDEALOT_PORT": str(port), "DECIDEALOT_LOG_FORMAT": "text"}
    return subprocess.Popen(
        [sys.executable, "-m", "decidealot", "serve"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _health(port: int) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
    except httpx.TransportError:
        return None


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
def test_serve_answers_health_only_after_bundles_are_ready(hub_repo: TinyHub) -> None:
    port = _free_port()
    hub_repo.hub.faults["option_marker.pt"] = "stall"
    server = _serve(hub_repo, port)
    try:
        assert hub_repo.hub.stalled.wait(30), "serve never started downloading"
        assert _health(port) is None  # mid-download: nothing listens yet
        del hub_repo.hub.faults["option_marker.pt"]
        hub_repo.hub.release.set()
        deadline = time.monotonic() + 40
        while (answer := _health(port)) is None and time.monotonic() < deadline:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            time.sleep(0.1)
        assert answer is not None and answer.json() == {"status": "ok", "providers": ["von"]}
        assert _record(hub_repo.models / "von-1.1").revision == VON_COMMIT
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)


@pytest.mark.slow  # a real worker or command: the full suite, not the quick loop
def test_serve_exits_before_listening_when_a_bundle_fails(hub_repo: TinyHub) -> None:
    port = _free_port()
    hub_repo.hub.faults["option_marker.pt"] = "missing"
    server = _serve(hub_repo, port)
    _, stderr = server.communicate(timeout=40)
    assert server.returncode != 0
    assert (
        stderr.strip()
        .splitlines()[-1]
        .startswith("decidealot: bundle von-1.1: option_marker.pt: not found")
    )
    assert _health(port) is None
    _assert_nothing_installed(hub_repo)
