"""What a new user meets before the service listens, over the real `decidealot` commands.

`decidealot checkpoints tiny DIR` writes random checkpoints of every local model and prints the
variables; `serve` on them answers decisions over HTTP. A checkpoint directory that lacks a file
its engine reads, an offline machine with no bundles, and `DECIDEALOT_DEVICE=cuda` without a GPU
each stop `serve` and `prepare` before listening, with one message and no traceback.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import msgspec
import pytest

from decidealot.checkpoints.install import RECORD_NAME, InstallRecord, RecordFile
from tests.support.cli import run_cli
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.servers import free_port as _free_port
from tests.support.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]
VON_COMMIT = "a" * 40


def _env(**env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DECIDEALOT_", "HF_"))}
    return clean | {"HF_HUB_OFFLINE": "1", "DECIDEALOT_DEVICE": "cpu"} | env


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    offline = {"HF_HUB_OFFLINE": "1", "DECIDEALOT_DEVICE": "cpu"}
    return run_cli(*args, clear=("DECIDEALOT_", "HF_"), **(offline | env))


@pytest.fixture(scope="module")
def tiny_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    """What `decidealot checkpoints tiny DIR` prints: one run for the module."""
    directory = tmp_path_factory.mktemp("tiny")
    result = cli("checkpoints", "tiny", str(directory))
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def printed(tiny_output: str) -> dict[str, str]:
    """The variables `decidealot checkpoints tiny DIR` prints, parsed from its output."""
    lines = tiny_output.splitlines()
    assert "random weights, so answers carry no meaning" in lines[0]
    variables = {}
    for line in lines:  # CLM's head is commented out: it is refused without an encoder URL
        if line.startswith(("export ", "# export ")):
            name, _, value = line.removeprefix("# ").removeprefix("export ").partition("=")
            variables[name] = value
    return variables


def test_tiny_checkpoints_name_every_local_checkpoint_variable(printed: dict[str, str]) -> None:
    assert sorted(printed) == [
        "DECIDEALOT_CLM_HEAD",
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT",
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT",
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT",
        "DECIDEALOT_VON_CHECKPOINT",
    ]
    assert all(Path(path).exists() for path in printed.values())


# Random weights: laya rightly warns that their temperatures are uncalibrated.
@pytest.mark.filterwarnings("ignore:laya. this checkpoint ships invalid temperatures")
def test_upstream_packages_load_the_tiny_checkpoints(
    printed: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command writes the upstream on-disk formats, not only ours."""
    import laya
    from von.backends.option_marker_backend import OptionMarkerBackend

    monkeypatch.setenv("VON_CHAINS_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(Path(printed["DECIDEALOT_CLM_HEAD"]).parent))
    laya.load(printed["DECIDEALOT_LAYA_ENGLISH_CHECKPOINT"], device="cpu")
    backend = OptionMarkerBackend(checkpoint_dir=printed["DECIDEALOT_VON_CHECKPOINT"], device="cpu")
    assert backend._get_model() is not None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start `decidealot serve` with `env`; returns its URL once it listens."""
    started: list[subprocess.Popen[str]] = []

    def start(**env: str) -> str:
        port = _free_port()
        log = (tmp_path / f"serve{len(started)}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "decidealot", "serve", "--port", str(port)],
            cwd=ROOT,
            env=_env(DECIDEALOT_MODEL_DIR=str(tmp_path / "models"), **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started.append(process)
        url = f"http://127.0.0.1:{port}"
        if wait_healthy(url, process, seconds=60):
            return url
        assert process.poll() is None, Path(log.name).read_text()[-2000:]
        raise AssertionError("serve did not start")

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def test_the_tiny_checkpoints_serve_decisions_over_http(
    printed: dict[str, str], serve: Callable[..., str]
) -> None:
    embeddings = FakeEmbeddings(4096).start()
    try:
        url = serve(
            **printed,
            DECIDEALOT_CLM_EMBEDDINGS_URL=embeddings.url,
            DECIDEALOT_MAX_RESIDENT_PROVIDERS="3",
        )
        questions = {
            "route": {"type": "choice", "criteria": {"billing": "Payment", "tech": None}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "level": {"type": "score", "criteria": ["low", "mid", "high"]},
        }
        for model in ("laya", "von", "clm"):
            body = {"model": model, "state": "The refund failed twice.", "questions": questions}
            answer = httpx.post(url + "/v1/systemone", json=body, timeout=120)
            assert answer.status_code == 200, (model, answer.text)
            probabilities = answer.json()["answers"]["route"]["probabilities"]
            assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-3)

        # Von: a state past the 8192-token window is cut, not refused ...
        long_state = "The refund for order 84213 failed twice. " * 2500
        body = {"model": "von", "state": long_state, "questions": questions}
        answer = httpx.post(url + "/v1/systemone", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["input_tokens"] > 8192
        # ... and only instructions that cannot fit by themselves get the 422, naming them.
        huge = {"type": "noul", "instructions": " ".join(f"rule{i}" for i in range(9000))}
        body = {"model": "von", "state": "short", "questions": {**questions, "rules": huge}}
        refused = httpx.post(url + "/v1/systemone", json=body, timeout=120)
        assert refused.status_code == 422
        assert "questions" in json.dumps(refused.json()) and "rules" in json.dumps(refused.json())
        assert "by themselves" in refused.text and "rule17" not in refused.text
    finally:
        embeddings.stop()


# -- checkpoints checked before listening --------------------------------------------------


def _copy(printed: dict[str, str], variable: str, tmp_path: Path) -> Path:
    source = Path(printed[variable])
    target = tmp_path / "ckpt" / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        target.parent.mkdir(parents=True)
        shutil.copy(source, target)
    return target


def _empty_dir(path: Path) -> None:
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def _remove(name: str) -> Callable[[Path], None]:
    def remove(path: Path) -> None:
        target = path / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return remove


MISSING = {
    "von-empty": ("DECIDEALOT_VON_CHECKPOINT", _empty_dir, "option_marker.pt"),
    "von-no-calibration": (
        "DECIDEALOT_VON_CHECKPOINT",
        _remove("marker_calibration.json"),
        "marker_calibration.json",
    ),
    "laya-no-tokenizer": (
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT",
        _remove("tokenizer"),
        "tokenizer/tokenizer.json",
    ),
    "laya-no-weights": (
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT",
        _remove("model.safetensors"),
        "model.safetensors",
    ),
    "laya-empty": ("DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT", _empty_dir, "encoder/config.json"),
    "clm-empty-head": (
        "DECIDEALOT_CLM_HEAD",
        lambda path: path.write_bytes(b""),
        "the head file is empty",
    ),
}


def _assert_refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert any(line.startswith("decidealot: ") for line in result.stderr.splitlines())
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["serve", "prepare"])
@pytest.mark.parametrize("case", list(MISSING))
def test_a_checkpoint_missing_a_file_stops_startup(
    printed: dict[str, str], tmp_path: Path, command: str, case: str
) -> None:
    variable, damage, needle = MISSING[case]
    broken = _copy(printed, variable, tmp_path)
    damage(broken)
    port = _free_port()
    env = {
        **printed,
        variable: str(broken),
        "DECIDEALOT_CLM_EMBEDDINGS_URL": "http://127.0.0.1:9/v1",
        "DECIDEALOT_MODEL_DIR": str(tmp_path / "models"),
        "DECIDEALOT_PORT": str(port),
    }
    result = cli(command, **env)
    _assert_refused(result, f"{variable}={broken}", needle)
    if command == "serve":
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)


def _write(name: str, content: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        (path / name).write_bytes(content)

    return write


def _garble_header(path: Path) -> None:
    """A safetensors file whose header length is right and whose JSON is not."""
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:10] = b"{x"
    weights.write_bytes(bytes(data))


MALFORMED = {
    "von-calibration": (
        "DECIDEALOT_VON_CHECKPOINT",
        _write("marker_calibration.json", b"{temperature: 2.2}"),
        "marker_calibration.json is not valid JSON",
    ),
    "laya-agent-config": (
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT",
        _write("rl_agent_config.json", b'{"encoder": "tiny"'),
        "rl_agent_config.json is not valid JSON",
    ),
    "laya-tokenizer": (
        "DECIDEALOT_LAYA_ENGLISH_CHECKPOINT",
        _write("tokenizer/tokenizer.json", b'["not", "a", "tokenizer"]'),
        "tokenizer/tokenizer.json is not a JSON object",
    ),
    "laya-safetensors-header": (
        "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT",
        _garble_header,
        "model.safetensors has a safetensors header that does not parse",
    ),
    "laya-safetensors-cut": (
        "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT",
        lambda path: (path / "model.safetensors").write_bytes(
            (path / "model.safetensors").read_bytes()[:-100]
        ),
        "model.safetensors is cut short",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_checkpoint_file_that_does_not_parse_stops_startup(
    printed: dict[str, str], tmp_path: Path, case: str
) -> None:
    """Read as its engine will read it, before listening: not a worker traceback at the
    first request."""
    variable, damage, needle = MALFORMED[case]
    broken = _copy(printed, variable, tmp_path)
    damage(broken)
    port = _free_port()
    laya_and_von = {k: v for k, v in printed.items() if k != "DECIDEALOT_CLM_HEAD"}
    env = {**laya_and_von, variable: str(broken), "DECIDEALOT_PORT": str(port)}
    result = cli("serve", **env, DECIDEALOT_MODEL_DIR=str(tmp_path / "models"))
    _assert_refused(result, f"{variable}={broken}: {needle}", "the ", " engine reads it")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)


def _install(
    printed: dict[str, str], tmp_path: Path, damage: Callable[[Path], None]
) -> dict[str, str]:
    """An installed von-1.1 bundle, damaged, with a manifest and record of what is left."""
    source = Path(printed["DECIDEALOT_VON_CHECKPOINT"])
    models, manifests = tmp_path / "models", tmp_path / "manifests"
    target = models / "von-1.1"
    shutil.copytree(source, target)
    damage(target)
    files = [
        RecordFile(p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest(), "manifest")
        for p in sorted(target.iterdir())
    ]
    record = InstallRecord("von-1.1", "tiny/von", VON_COMMIT, "", tuple(files))
    (target / RECORD_NAME).write_bytes(msgspec.json.encode(record))
    manifests.mkdir()
    manifest = {
        "name": "von-1.1",
        "repo": "tiny/von",
        "revision": VON_COMMIT,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files],
    }
    (manifests / "von-1.1.json").write_text(json.dumps(manifest))
    return {
        "DECIDEALOT_MODEL_DIR": str(models),
        "DECIDEALOT_BUNDLE_MANIFEST_DIR": str(manifests),
        "DECIDEALOT_LAYA_ENABLED": "false",
    }


@pytest.mark.parametrize("command", ["serve", "prepare"])
def test_an_installed_bundle_missing_a_file_stops_startup(
    printed: dict[str, str], tmp_path: Path, command: str
) -> None:
    env = _install(printed, tmp_path, _remove("marker_calibration.json"))
    result = cli(command, **env)
    _assert_refused(result, "bundle von-1.1", "marker_calibration.json is missing")


def test_an_installed_bundle_holding_a_file_that_does_not_parse_stops_startup(
    printed: dict[str, str], tmp_path: Path
) -> None:
    env = _install(printed, tmp_path, _write("marker_calibration.json", b"[0.5, "))
    result = cli("serve", **env)
    _assert_refused(result, "bundle von-1.1 (installed at ", "marker_calibration.json is not valid")


def test_prepare_prints_where_each_checkpoint_is(printed: dict[str, str], tmp_path: Path) -> None:
    result = cli(
        "prepare",
        **printed,
        DECIDEALOT_CLM_EMBEDDINGS_URL="http://127.0.0.1:9/v1",
        DECIDEALOT_MODEL_DIR=str(tmp_path / "models"),
    )
    assert result.returncode == 0, result.stderr
    assert f"von-1.1: {printed['DECIDEALOT_VON_CHECKPOINT']}" in result.stdout.splitlines()


# -- the offline path ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["serve", "prepare"])
def test_offline_names_every_missing_bundle_and_its_replacement(
    tmp_path: Path, command: str
) -> None:
    result = cli(
        command,
        DECIDEALOT_MODEL_DIR=str(tmp_path / "models"),
        DECIDEALOT_CLM_EMBEDDINGS_URL="http://127.0.0.1:9/v1",
        DECIDEALOT_PORT=str(_free_port()),
    )
    _assert_refused(result, "5 enabled bundles cannot be prepared", "decidealot checkpoints tiny")
    expected = {
        "laya-english": ("DECIDEALOT_LAYA_ENGLISH_CHECKPOINT", "DECIDEALOT_LAYA_ENABLED=false"),
        "laya-multilingual": (
            "DECIDEALOT_LAYA_MULTILINGUAL_CHECKPOINT",
            "DECIDEALOT_LAYA_ENABLED=false",
        ),
        "laya-typed-decisions": (
            "DECIDEALOT_LAYA_TYPED_DECISIONS_CHECKPOINT",
            "DECIDEALOT_LAYA_ENABLED=false",
        ),
        "von-1.1": ("DECIDEALOT_VON_CHECKPOINT", "DECIDEALOT_VON_ENABLED=false"),
        "clm-0.1-8b": ("DECIDEALOT_CLM_HEAD", "unset DECIDEALOT_CLM_EMBEDDINGS_URL"),
    }
    lines = result.stderr.splitlines()
    for bundle, needles in expected.items():
        (line,) = [line for line in lines if f"bundle {bundle}:" in line]
        assert all(needle in line for needle in needles), line


def test_troubleshooting_shows_what_a_fresh_machine_without_the_hub_prints(
    tmp_path: Path,
) -> None:
    """docs/troubleshooting.md's sample is the real message, word for word: default settings,
    an empty model directory, a hub that cannot be reached (here a closed local port, shown as
    the default endpoint)."""
    endpoint = f"http://127.0.0.1:{_free_port()}"
    result = run_cli(
        "serve",
        clear=("DECIDEALOT_", "HF_", "TRANSFORMERS_OFFLINE"),  # huggingface_hub reads both
        HF_ENDPOINT=endpoint,
        DECIDEALOT_MODEL_DIR=str(tmp_path / "models"),
        DECIDEALOT_DEVICE="cpu",
        DECIDEALOT_PORT=str(_free_port()),
    )
    assert result.returncode == 1, result.stderr
    printed = result.stderr[result.stderr.index("decidealot: ") :].rstrip("\n")
    printed = printed.replace(endpoint, "https://huggingface.co")
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    samples = [
        block for block in page.split("```") if "enabled bundles cannot be prepared" in block
    ]
    assert [sample.strip("\n") for sample in samples] == [printed]


def test_offline_the_printed_lines_are_enough_to_start(
    tiny_output: str, serve: Callable[..., str]
) -> None:
    """`eval "$(decidealot checkpoints tiny DIR)"` then `serve`, as the README shows: the shell
    evaluates what the command printed, no bundle is fetched, and the commented CLM line
    leaves CLM off."""
    printed = subprocess.run(
        ["bash", "-c", 'eval "$1"; env', "bash", tiny_output],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert printed.returncode == 0, printed.stderr
    exported = dict(
        line.split("=", 1) for line in printed.stdout.splitlines() if line.startswith("DECIDEALOT_")
    )
    assert "DECIDEALOT_CLM_HEAD" not in exported
    url = serve(**{k: v for k, v in exported.items() if k != "DECIDEALOT_DEVICE"})
    assert httpx.get(url + "/health").json() == {"status": "ok", "providers": ["laya", "von"]}


# -- the device ------------------------------------------------------------------------------


@functools.cache
def _torch_sees_cuda() -> bool:
    probe = "import torch; print(torch.cuda.is_available())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() == "True"


@pytest.mark.parametrize("command", ["serve", "prepare"])
def test_cuda_without_a_gpu_is_told_at_startup(
    printed: dict[str, str], tmp_path: Path, command: str
) -> None:
    if _torch_sees_cuda():
        pytest.skip("torch sees a GPU here")
    env = {k: v for k, v in printed.items() if k != "DECIDEALOT_CLM_HEAD"}
    result = cli(command, **env, DECIDEALOT_DEVICE="cuda", DECIDEALOT_PORT=str(_free_port()))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("decidealot: DECIDEALOT_DEVICE=cuda: ")
    assert "sees no CUDA device" in result.stderr


class Unwritable(NamedTuple):
    folder: Path
    wrapper: tuple[str, ...]
    """What runs the command so that it may not write `folder`."""


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Unwritable]:
    """A folder the command may not write, as a bind mount owned by root is to the images'
    user. As root, the folder belongs to nobody and the command runs without root's
    capabilities (so owner and mode bind it); otherwise the folder is made read-only."""
    folder = tmp_path / "unwritable"
    folder.mkdir()
    if os.getuid() != 0:
        folder.chmod(0o555)
        yield Unwritable(folder, ())
        folder.chmod(0o755)
        return
    if shutil.which("setpriv") is None:
        pytest.skip("as root, util-linux's setpriv drops the capabilities that ignore modes")
    os.chown(folder, 65534, 65534)
    yield Unwritable(folder, ("setpriv", "--bounding-set=-all", "--"))


def _names_the_uid_and_the_fix(line: str) -> None:
    uid, gid = os.getuid(), os.getgid()
    assert "Permission denied" in line, line
    assert f"this process runs as uid {uid} (gid {gid})" in line, line
    assert f"`chown -R {uid}:{gid} " in line, line
    assert "`docker run --user UID:GID`" in line, line


def test_tiny_checkpoints_in_an_unwritable_folder_name_the_uid_and_the_fix(
    unwritable: Unwritable,
) -> None:
    target = unwritable.folder / "tiny"
    result = run_cli("checkpoints", "tiny", str(target), wrapper=unwritable.wrapper, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"decidealot: cannot write checkpoints to {target}: "), line
    _names_the_uid_and_the_fix(line)


def test_startup_in_an_unwritable_model_dir_names_the_uid_and_the_fix(
    unwritable: Unwritable,
) -> None:
    """The first start, installing Von's bundle into a model folder it may not write."""
    env = {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_MODEL_DIR": str(unwritable.folder)}
    clear = ("DECIDEALOT_", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    result = run_cli("serve", clear=clear, wrapper=unwritable.wrapper, **env)
    assert result.returncode == 1, result.stderr[-2000:]
    # one message for the user; the JSON log lines beside it (the device choice) are the log's
    (line,) = [s for s in result.stderr.strip().splitlines() if not s.startswith("{")]
    assert line.startswith("decidealot: bundle von"), line
    _names_the_uid_and_the_fix(line)
