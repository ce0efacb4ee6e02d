"""The images as people run them: built from the Dockerfiles and run by a Docker engine.

Where no engine runs (or mmdebstrap, or the on-disk torch wheel, is missing) every test here
skips saying which; `.ci/run` installs and starts what it needs where it can (root, apt).
No registry is needed: the base is a stand-in for `python:3.11-slim-bookworm` made from Debian
packages, and every package comes from a local index (tests/support/container.py).

Checked: the build context stays small (.dockerignore), the CPU image's size (both images'
sizes are reported), tiny checkpoints written by the image itself, health, the key, a
decision on Laya and on Von, a batch, unload, MCP, the non-root user, the HEALTHCHECK, and
`docker stop` with requests in flight under Docker's default grace, every client answered
and the process exiting 0; the Compose file brought up by Debian's `docker-compose` (its
secret, volume and drain) and stopped by it with requests in flight, every one answered; bind
mounts the image's user may not write name that user and the fix; the Compose files are valid
for each Compose at hand.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import shutil
import subprocess
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import container
from tests.support.container import ROOT, Unavailable, run

pytestmark = pytest.mark.container

CPU_TAG = "decidealot-test:cpu"
CUDA_TAG = "decidealot-test:cuda"
CPU_IMAGE_LIMIT = 1_800_000_000
"""Bytes: the CPU image was 1.63 GB when first built here (torch 754 MB of it)."""
CONTEXT_LIMIT = 20_000_000
"""Bytes of build context: the sources are under 5 MB; a .venv would be gigabytes."""
COMPOSE = ROOT / "deploy" / "compose"
USER = 10001
KEY = "container-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MCP_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "container-test", "version": "0"},
    },
}


def decision(model: str, text: str = "a ticket about a late delivery") -> dict[str, Any]:
    return {
        "model": model,
        "state": text,
        "questions": {"q": {"type": "noul", "instructions": "?"}},
    }


class ImageSizes(UserWarning):
    """Both images' sizes: a report, not a problem. A warning is what pytest shows of a test
    in the run's summary, under pytest-xdist too (.ci/run)."""


@dataclass
class Images:
    cpu: str
    cuda: str
    context_bytes: int


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    """Both images, built on the stand-in base from the local index; each size reported."""
    try:
        container.docker_ready()
        folder = tmp_path_factory.mktemp("images")
        base = container.build_base(folder)
        index = folder / "index"
        container.fill_index(index)
    except Unavailable as exc:
        pytest.skip(f"no images built here: {exc}")
    with container.serving(index) as url:
        output = container.build_image("Dockerfile", CPU_TAG, base, url + "/simple")
        container.build_image("Dockerfile.cuda", CUDA_TAG, base, url + "/simple")
    sizes = ", ".join(f"{t} {container.image_bytes(t) / 1e9:.2f} GB" for t in (CPU_TAG, CUDA_TAG))
    warnings.warn(ImageSizes(sizes), stacklevel=1)
    return Images(CPU_TAG, CUDA_TAG, container.context_bytes(output))


@dataclass
class Running:
    """A container of the CPU image serving on a loopback port."""

    name: str
    url: str

    def logs(self) -> str:
        done = subprocess.run(
            ["docker", "logs", self.name], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout[-4000:] + done.stderr[-4000:]

    def inspect(self, template: str) -> str:
        return run("docker", "inspect", "--format", template, self.name).stdout.strip()


@pytest.fixture(scope="module")
def models(images: Images) -> Iterator[tuple[str, dict[str, str]]]:
    """A models volume holding tiny checkpoints written by the image itself, and the
    variables that use them (what `checkpoints tiny` prints)."""
    volume = f"decidealot-test-models-{uuid.uuid4().hex[:8]}"
    run("docker", "volume", "create", volume)
    try:
        printed = run(
            "docker", "run", "--rm", "-v", f"{volume}:/models", images.cpu,
            "checkpoints", "tiny", "/models/tiny",
        ).stdout  # fmt: skip
        variables = dict(
            line.removeprefix("export ").split("=", 1)
            for line in printed.splitlines()
            if line.startswith("export ")
        )
        assert variables, printed
        yield volume, variables
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, check=False)


@pytest.fixture(scope="module")
def start(images: Images, models: tuple[str, dict[str, str]]) -> Iterator[Callable[..., Running]]:
    """Start a container of the CPU image on the models volume, the key set; each removed at
    the end of the module."""
    volume, variables = models
    names: list[str] = []

    def launch(*options: str, **env: str) -> Running:
        name = f"decidealot-test-{uuid.uuid4().hex[:8]}"
        names.append(name)
        settings = variables | {"DECIDEALOT_API_KEY": KEY} | env
        flags = [f"--env={k}={v}" for k, v in settings.items()]
        run(
            "docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8080",
            "-v", f"{volume}:/models", *flags, *options, images.cpu,
        )  # fmt: skip
        port = run("docker", "port", name, "8080/tcp").stdout.split()[0].rsplit(":", 1)[1]
        return _healthy(Running(name, f"http://127.0.0.1:{port}"))

    yield launch
    for name in names:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def _healthy(served: Running) -> Running:
    """`served` once its /health answers 200; an AssertionError with its log if it exits or
    never answers."""
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if served.inspect("{{.State.Running}}") != "true":
                raise AssertionError(f"{served.name} exited:\n{served.logs()}")
            try:
                if client.get(served.url + "/health").status_code == 200:
                    return served
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"{served.name} never answered /health:\n{served.logs()}")


@pytest.fixture(scope="module")
def served(start: Callable[..., Running]) -> Running:
    """One container for the end-to-end checks; its health check probes every 2 s (the
    image's own command, at a shorter interval than the image's 30 s)."""
    return start("--health-interval=2s")


def test_the_build_context_holds_only_what_the_images_copy(images: Images) -> None:
    assert images.context_bytes < CONTEXT_LIMIT, images.context_bytes


def test_the_cpu_image_stays_small(images: Images) -> None:
    size = container.image_bytes(images.cpu)
    assert size < CPU_IMAGE_LIMIT, f"{images.cpu} is {size / 1e9:.2f} GB"


def test_both_images_run_as_the_unprivileged_user(images: Images, served: Running) -> None:
    for image in (images.cpu, images.cuda):
        config = run("docker", "image", "inspect", "--format", "{{json .Config}}", image)
        assert json.loads(config.stdout)["User"] == f"{USER}:{USER}"
    assert run("docker", "exec", served.name, "id", "-u").stdout.strip() == str(USER)
    cuda_env = json.loads(
        run("docker", "image", "inspect", "--format", "{{json .Config.Env}}", images.cuda).stdout
    )
    assert "DECIDEALOT_DEVICE=cuda" in cuda_env


def test_the_image_serves_every_surface_end_to_end(served: Running) -> None:
    with httpx.Client(base_url=served.url, timeout=120) as client:
        assert client.get("/health").json()["providers"] == ["laya", "von"]
        assert client.get("/v1/models").status_code == 401
        for model in ("laya", "von"):
            answer = client.post("/v1/systemone", json=decision(model), headers=AUTH)
            assert answer.status_code == 200, answer.text
            assert answer.json()["answers"]["q"]
        batch = {"requests": [decision("laya"), decision("von")]}
        answered = client.post("/v1/systemone/batch", json=batch, headers=AUTH)
        assert answered.status_code == 200, answered.text
        models = [r["model"] for r in answered.json()["results"]]
        assert [m.split("-")[0] for m in models] == ["laya", "von"], models
        assert client.post("/v1/models/unload", headers=AUTH).status_code == 200
        mcp = client.post(
            "/mcp",
            json=MCP_INIT,
            headers=AUTH | {"Accept": "application/json, text/event-stream"},
        )
        assert mcp.status_code == 200, mcp.text
        assert '"serverInfo"' in mcp.text


def test_the_health_check_turns_healthy(served: Running) -> None:
    image_check = json.loads(
        run(
            "docker", "image", "inspect", "--format", "{{json .Config.Healthcheck}}", CPU_TAG
        ).stdout
    )
    assert json.loads(served.inspect("{{json .Config.Healthcheck.Test}}")) == image_check["Test"]
    deadline = time.monotonic() + 60
    while (status := served.inspect("{{.State.Health.Status}}")) != "healthy":
        assert status == "starting" and time.monotonic() < deadline, served.inspect(
            "{{json .State.Health}}"
        )
        time.sleep(0.5)


# -- docker stop with requests in flight --------------------------------------------------------


BATCH_BYTES = str(64 << 20)
"""The body bound for the stop tests: a fast machine decides so many items per second that
40 s of work spread over 4 batches outgrows the default 2 MiB (an instant 413, never in
flight)."""


def _batch(items: int) -> dict[str, Any]:
    """A batch of Laya decisions on long states: work the worker takes its time over."""
    text = "the parcel arrived late and the box was damaged; " * 40
    return {"requests": [decision("laya", f"{i} {text}") for i in range(items)]}


def _items_per_second(url: str) -> float:
    """How many of `_batch`'s items this container decides per second, from one batch."""
    with httpx.Client(timeout=300) as client:
        client.post(url + "/v1/systemone", json=decision("laya"), headers=AUTH)  # loaded
        started = time.monotonic()
        answer = client.post(url + "/v1/systemone/batch", json=_batch(16), headers=AUTH)
        assert answer.status_code == 200, answer.text
        return 16 / (time.monotonic() - started)


@dataclass
class Stopped:
    statuses: list[int]
    retry_after: list[str | None]
    exit_code: int
    seconds: float
    log: str


def _stop_with_requests_in_flight(
    served: Running, work_seconds: float, stop: tuple[str, ...] = ()
) -> Stopped:
    """Send 4 batches that together take about `work_seconds`, stop the container with
    `stop` (default `docker stop`) once all 4 are being served, and collect every answer and
    the exit status."""
    batch = _batch(max(1, math.ceil(_items_per_second(served.url) * work_seconds / 4)))

    def send() -> httpx.Response:
        with httpx.Client(timeout=300) as client:
            return client.post(served.url + "/v1/systemone/batch", json=batch, headers=AUTH)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        sent = [pool.submit(send) for _ in range(4)]
        _wait_in_flight(served.url, 4, sent)
        started = time.monotonic()
        run(*(stop or ("docker", "stop", served.name)), timeout=300)
        seconds = time.monotonic() - started
        answers = [future.result() for future in sent]  # a cut connection raises here
    return Stopped(
        [a.status_code for a in answers],
        [a.headers.get("retry-after") for a in answers],
        int(served.inspect("{{.State.ExitCode}}")),
        seconds,
        served.logs(),
    )


def _wait_in_flight(
    url: str, count: int, sent: list[concurrent.futures.Future[httpx.Response]]
) -> None:
    """Until `count` requests are being served besides the scrape asking; one of `sent`
    answered before that fails at once, saying what it was answered."""
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=10, headers=AUTH) as client:
        while time.monotonic() < deadline:
            for future in sent:
                if future.done():
                    answer = future.result()
                    raise AssertionError(
                        f"a batch was answered before {count} were in flight: "
                        f"{answer.status_code} {answer.text[:300]}"
                    )
            gauge = "decidealot_http_requests_in_flight "
            for line in client.get(url + "/metrics").text.splitlines():
                if line.startswith(gauge) and float(line.split()[1]) - 1 >= count:
                    return
            time.sleep(0.05)
    raise AssertionError(f"never {count} requests in flight")


def test_docker_stop_under_the_default_grace_answers_every_request(
    start: Callable[..., Running],
) -> None:
    """The image's drain (5 s) fits `docker stop`'s 10 s: batches that need far longer are
    answered 503 with Retry-After when it runs out, and the process exits 0, never killed."""
    served = start(DECIDEALOT_MAX_REQUEST_BYTES=BATCH_BYTES)
    stopped = _stop_with_requests_in_flight(served, work_seconds=40)
    assert stopped.exit_code == 0, (stopped.exit_code, stopped.seconds, stopped.log)
    assert set(stopped.statuses) <= {200, 503}, stopped.statuses
    assert 503 in stopped.statuses, (stopped.statuses, stopped.log)  # the drain ran out
    for status, retry_after in zip(stopped.statuses, stopped.retry_after, strict=True):
        assert status == 200 or retry_after is not None
    assert "answering them 503" in stopped.log


def test_compose_up_serves_and_its_stop_lets_every_request_finish(
    images: Images, tmp_path: Path
) -> None:
    """deploy/compose/compose.yaml brought up by Debian's `docker-compose` as written (the key
    as a Compose secret, the models volume, its drain), with three substitutions: the image the
    suite built, a free loopback port, and tiny checkpoints that the service itself writes
    into the volume first. Its key guards it, and `docker-compose stop` (which waits the
    file's `stop_grace_period`) lets admitted batches finish with their answers; exit 0."""
    if not shutil.which("docker-compose"):
        pytest.skip("Debian's docker-compose is not installed")
    folder = tmp_path / "compose"
    shutil.copytree(COMPOSE, folder)
    key = folder / "api-key"
    key.write_text(KEY + "\n")
    try:  # the file's own instructions: the image's user, and only it, reads the key
        shutil.chown(key, USER, USER)
        key.chmod(0o400)
    except PermissionError:  # not root: readable by all, the image's user included
        key.chmod(0o444)
    file = folder / "compose.yaml"
    written = yaml.safe_load(file.read_text())
    service = written["services"]["decidealot"]
    grace = _seconds(service["stop_grace_period"])
    assert grace >= float(service["environment"]["DECIDEALOT_DRAIN_SECONDS"]) + 10
    service |= {"image": images.cpu, "ports": ["127.0.0.1::8080"]}
    file.write_text(yaml.safe_dump(written))
    compose = ("docker-compose", f"--file={file}", f"--project-name=dtest{uuid.uuid4().hex[:8]}")
    try:
        printed = run(
            *compose,
            "run",
            "--rm",
            "--no-deps",
            "decidealot",
            "checkpoints",
            "tiny",
            "/models/tiny",
        ).stdout
        checkpoints = dict(
            line.removeprefix("export ").split("=", 1)
            for line in printed.splitlines()
            if line.startswith("export ")
        )
        service["environment"] |= checkpoints | {"DECIDEALOT_MAX_REQUEST_BYTES": BATCH_BYTES}
        file.write_text(yaml.safe_dump(written))
        run(*compose, "up", "--detach", "--no-build")
        (name,) = run(*compose, "ps", "--quiet", "decidealot").stdout.split()
        port = run(*compose, "port", "decidealot", "8080").stdout.strip().rsplit(":", 1)[1]
        served = _healthy(Running(name, f"http://127.0.0.1:{port}"))
        assert served.inspect("{{.Config.StopTimeout}}") == str(int(grace))
        with httpx.Client(timeout=60) as client:
            assert (
                client.post(served.url + "/v1/systemone", json=decision("von")).status_code == 401
            )
            answered = client.post(served.url + "/v1/systemone", json=decision("von"), headers=AUTH)
            assert answered.status_code == 200, answered.text
        stopped = _stop_with_requests_in_flight(served, work_seconds=8, stop=(*compose, "stop"))
        assert stopped.exit_code == 0, (stopped.exit_code, stopped.seconds, stopped.log)
        assert stopped.statuses == [200] * 4, stopped.statuses
    finally:
        subprocess.run([*compose, "down", "--volumes"], capture_output=True, check=False)


def _seconds(duration: str) -> float:
    """A Compose duration such as `140s` or `2m20s`, in seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    total, number = 0.0, ""
    for char in duration:
        if char.isdigit() or char == ".":
            number += char
        else:
            total, number = total + float(number) * units[char], ""
    return total + (float(number) if number else 0)


# -- bind mounts the image's user may not write ------------------------------------------------


@pytest.fixture
def root_owned(tmp_path: Path) -> Iterator[Path]:
    """A host folder as `mkdir` makes it for root: others may not write it."""
    folder = tmp_path / "bind"
    folder.mkdir(mode=0o755)
    yield folder
    # the image's user wrote into it after the fix: root removes it
    shutil.rmtree(folder, ignore_errors=True)


def _fails_naming_the_user(done: subprocess.CompletedProcess[str]) -> str:
    """The first line of a failure that names the image's user and the fix on every line
    that says what it could not write (a first start: one line per bundle)."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if "Permission denied" in line]
    assert lines, done.stderr[-2000:]
    for line in lines:
        assert f"this process runs as uid {USER} (gid {USER})" in line, line
        assert f"`chown -R {USER}:{USER} " in line, line
        assert "`docker run --user UID:GID`" in line, line
    return done.stderr.strip().splitlines()[0]


def test_a_root_owned_bind_mount_names_the_user_and_the_fix(
    images: Images, root_owned: Path
) -> None:
    def docker_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["docker", "run", "--rm", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    tiny = docker_run("-v", f"{root_owned}:/tiny", images.cpu, "checkpoints", "tiny", "/tiny")
    assert _fails_naming_the_user(tiny).startswith("decidealot: cannot write checkpoints to /tiny")
    serve = docker_run("-v", f"{root_owned}:/models", images.cpu)
    assert _fails_naming_the_user(serve).startswith("decidealot: ")
    # the fix the message names
    shutil.chown(root_owned, USER, USER)
    fixed = docker_run("-v", f"{root_owned}:/tiny", images.cpu, "checkpoints", "tiny", "/tiny")
    assert fixed.returncode == 0, fixed.stderr[-2000:]


# -- Compose ----------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [("compose.yaml",), ("compose.yaml", "compose.cuda.yaml")])
def test_the_compose_files_are_valid(files: tuple[str, ...], tmp_path: Path) -> None:
    """Checked by each Compose installed here: Debian's `docker-compose` (1.x, Python) and
    the `docker compose` plugin; the CUDA override reserves the GPUs."""
    composes = [
        command
        for command in (["docker-compose"], ["docker", "compose"])
        if shutil.which(command[0])
        and subprocess.run([*command, "version"], capture_output=True, check=False).returncode == 0
    ]
    if not composes:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    shutil.copytree(COMPOSE, tmp_path / "compose")
    (tmp_path / "compose" / "api-key").write_text(KEY + "\n")
    for command in composes:
        flags = [f"--file={tmp_path / 'compose' / name}" for name in files]
        rendered = yaml.safe_load(run(*command, *flags, "config").stdout)
        service = rendered["services"]["decidealot"]
        assert service["environment"]["DECIDEALOT_API_KEY_FILE"] == "/run/secrets/api-key"
        assert [s if isinstance(s, str) else s["source"] for s in service["secrets"]] == ["api-key"]
        assert "/models" in str(service["volumes"])
        assert service["healthcheck"]["test"][-1].endswith("/health', timeout=4)")
        if "compose.cuda.yaml" in files:
            (device,) = service["deploy"]["resources"]["reservations"]["devices"]
            assert device["capabilities"] == ["gpu"]
            assert service["build"]["dockerfile"] == "Dockerfile.cuda"
