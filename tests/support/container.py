"""Building the images where no registry is reachable (tests/deploy/test_container.py).

What the test needs and cannot fetch, it makes: a stand-in for `python:3.11-slim-bookworm`
built from Debian's own packages with `mmdebstrap` (trusting the host's CA certificates, as
networks that re-sign TLS need), and a local package index (PEP 503, served on loopback) with
the torch wheel on this machine's disk and every other distribution the image installs at the
lock's pins. `docker build --network host` then runs the Dockerfiles' own steps against them.
Each step says why it cannot run (`Unavailable`), which the test turns into its skip reason.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BASE_IMAGE = "decidealot-test/python:3.11-slim-bookworm"
"""The stand-in base's tag; built once per Docker engine and kept (it holds no project file)."""
TORCH = "2.13.0"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
"""What `python:3.11-slim-bookworm` gives the Dockerfiles: `python` (3.11 in bookworm) with
venv and pip, and CA certificates."""
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
INDEX_PORT = 38741
"""The local index's port when free (else any): the same build arguments let Docker reuse
the layers of an earlier build of the same sources."""


class Unavailable(Exception):
    """Something the container test needs is missing here; the message says what."""


def run(*command: str, timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`command`, its output captured as text, its failure an AssertionError with the output."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload]
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}"
        )
    return done


def docker_ready() -> None:
    """Raise `Unavailable` unless a Docker engine answers and mmdebstrap can build a base."""
    if shutil.which("docker") is None:
        raise Unavailable("no docker command (.ci/run installs Debian's docker.io as root)")
    info = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if info.returncode != 0:
        raise Unavailable(f"no Docker engine answers: {info.stderr.strip()[-300:]}")
    if not image_exists(BASE_IMAGE) and shutil.which("mmdebstrap") is None:
        raise Unavailable("no mmdebstrap to build the stand-in base image from Debian packages")


def image_exists(tag: str) -> bool:
    return (
        subprocess.run(
            ["docker", "image", "inspect", tag], capture_output=True, timeout=30, check=False
        ).returncode
        == 0
    )


def build_base(folder: Path) -> str:
    """The stand-in base image (Debian bookworm's python3.11), built unless present."""
    if image_exists(BASE_IMAGE):
        return BASE_IMAGE
    tarball = folder / "base.tar"
    hooks = ["--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*"]
    if HOST_CA_BUNDLE.is_file():  # the host's trust, whatever re-signs TLS on its network
        hooks.append(f"--customize-hook=copy-in {HOST_CA_BUNDLE} /etc/ssl/certs")
    run(
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        *hooks,
        "bookworm",
        str(tarball),
        DEBIAN_MIRROR,
        stdin=subprocess.DEVNULL,
        timeout=900,
    )
    run(
        "docker",
        "import",
        "--change",
        "ENV LANG=C.UTF-8",
        "--change",
        'CMD ["python3"]',
        str(tarball),
        BASE_IMAGE,
    )
    tarball.unlink()
    return BASE_IMAGE


def image_requirements() -> list[str]:
    """What the images install besides torch: the project's dependencies, its `otel` extra
    (the Dockerfiles' EXTRAS), and pip and setuptools, which .ci/install installs first."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["otel"]]
    return ["pip", "setuptools", *(r for r in wanted if not r.startswith("torch"))]


def torch_wheel(folder: Path) -> Path:
    """The CPU torch wheel on this machine's disk (pip's find-links), copied into `folder`."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-index",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "-d",
            str(folder),
            f"torch=={TORCH}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    wheels = sorted(folder.glob(f"torch-{TORCH}*.whl"))
    if done.returncode != 0 or not wheels:
        raise Unavailable(
            f"no torch {TORCH} wheel on this disk where pip finds it (find-links): "
            f"{done.stderr.strip()[-300:]}"
        )
    if "+cpu" not in wheels[0].name:
        raise Unavailable(f"the torch wheel on this disk is not a CPU build: {wheels[0].name}")
    return wheels[0]


def fill_index(folder: Path) -> Path:
    """A PEP 503 index in `folder/simple`: the on-disk torch wheel, its dependencies and
    `image_requirements()`, every version the lock's (pip resolves them as the image will)."""
    files = folder / "files"
    files.mkdir(parents=True, exist_ok=True)
    torch = torch_wheel(files)
    run(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--constraint",
        str(ROOT / "requirements.lock"),
        "-d",
        str(files),
        str(torch),
        *image_requirements(),
        timeout=1200,
    )
    projects: dict[str, list[Path]] = {}
    for path in sorted(files.iterdir()):
        name = re.split(r"-\d", path.name, maxsplit=1)[0]
        projects.setdefault(re.sub(r"[-_.]+", "-", name).lower(), []).append(path)
    simple = folder / "simple"
    for project, paths in projects.items():
        page = simple / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{p.name}#sha256={_sha256(p)}">{p.name}</a>\n' for p in paths
        )
        (page / "index.html").write_text(f"<!doctype html><html><body>\n{links}</body></html>\n")
    return simple


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    """`folder` served over HTTP on loopback for as long as the block runs; its URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:  # one port run after run: the URL is a build argument, so part of the layer cache
        server = http.server.ThreadingHTTPServer(("127.0.0.1", INDEX_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_image(dockerfile: str, tag: str, base: str, index_url: str) -> str:
    """`docker build` of `dockerfile` on the stand-in base, every package from `index_url`
    (the Dockerfile's own PIP_INDEX_URL and TORCH_INDEX_URL build arguments); its output.
    The classic builder: Debian's docker.io has no BuildKit client (buildx)."""
    host = index_url.split("//", 1)[1].split(":", 1)[0]
    return run(
        "docker",
        "build",
        "--network",
        "host",
        "-f",
        str(ROOT / dockerfile),
        "-t",
        tag,
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--build-arg",
        f"PIP_INDEX_URL={index_url}",
        "--build-arg",
        f"TORCH_INDEX_URL={index_url}",
        "--build-arg",
        f"PIP_TRUSTED_HOST={host}",
        str(ROOT),
        timeout=1800,
        env=_docker_env(),
    ).stdout


def _docker_env() -> dict[str, str]:
    return os.environ | {"DOCKER_BUILDKIT": "0"}


def context_bytes(build_output: str) -> int:
    """The build context's size from the classic builder's `Sending build context` line."""
    found = re.search(
        r"Sending build context to Docker daemon\s+([\d.]+)\s*([kMG]?B)", build_output
    )
    assert found, build_output[:2000]
    scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}[found[2]]
    return int(float(found[1]) * scale)


def image_bytes(tag: str) -> int:
    return int(run("docker", "image", "inspect", "--format", "{{.Size}}", tag).stdout)
