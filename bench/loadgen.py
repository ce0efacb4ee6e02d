"""Shared benchmark plumbing: start servers side by side, drive them with N clients, compare.

Benchmarks are scripts, never tests: they print a markdown table of throughput and latency
per server and client count, plus the ratio of Decidealot to each peer, for docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server(
    command: Sequence[str],
    *,
    port: int,
    env: Mapping[str, str] | None = None,
    health: str = "/health",
    timeout: float = 300.0,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Run a server process until the block ends; yields its base URL once `health` answers."""
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    full_env.update(env or {})
    log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        list(command), env=full_env, stdout=log, stderr=log, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[0]} exited with {process.returncode}")
            try:
                if httpx.get(base + health, timeout=1.0).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command[0]} did not become healthy in {timeout} s")
            time.sleep(0.2)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if log_path:
            log.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def side_by_side(
    *,
    threads: int,
    device: str,
    logs: Path,
    decidealot_env: Mapping[str, str],
    upstream: Callable[[int], tuple[list[str], dict[str, str]]],
    upstream_log: str,
) -> Iterator[tuple[str, str]]:
    """`decidealot serve` and an upstream server, both up, with the same torch threads and
    device; yields their base URLs (ours, theirs). `upstream(port)` gives the peer's command
    and environment; `decidealot_env` adds to or overrides Decidealot's settings."""
    common = {
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    ours_port, theirs_port = free_port(), free_port()
    ours_env = {
        **common,
        "DECIDEALOT_PORT": str(ours_port),
        "DECIDEALOT_DEVICE": device,
        "DECIDEALOT_TORCH_THREADS": str(threads),
        "DECIDEALOT_PROVIDER_TIMEOUT_SECONDS": "900",
        **decidealot_env,
    }
    theirs_command, theirs_env = upstream(theirs_port)
    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(
            server(
                [python(), "-m", "decidealot", "serve"],
                port=ours_port,
                env=ours_env,
                log_path=logs / "decidealot.log",
            )
        )
        theirs = stack.enter_context(
            server(
                theirs_command,
                port=theirs_port,
                env={**common, **theirs_env},
                log_path=logs / upstream_log,
            )
        )
        yield ours, theirs


@dataclass(frozen=True)
class LoadResult:
    name: str
    clients: int
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class RawConnection:
    """One keep-alive HTTP/1.1 connection of the minimal client: a request line, headers and
    a body out, a `content-length` framed response read back (chunked is not supported)."""

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        method: str = "POST",
        name: str = "server",
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        lines = [f"{method} {parsed.path or '/'} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        all_headers = {"content-type": "application/json", **(headers or {})}
        lines += [f"{key}: {value}" for key, value in all_headers.items()]
        self._prefix = ("\r\n".join(lines) + "\r\ncontent-length: ").encode()
        self._name = name
        self._stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def call(self, body: bytes) -> int:
        """The response's status; 0 when the connection broke (the next call reconnects)."""
        if self._stream is None:
            self._stream = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._stream
        try:
            writer.write(self._prefix + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            length = None
            for line in head.split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                if key.strip().lower() == b"content-length":
                    length = int(value)
            if length is None:
                raise RuntimeError(f"{self._name} answered without content-length")
            await reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close()
            return 0
        return int(head[9:12])

    def close(self) -> None:
        if self._stream is not None:
            self._stream[1].close()
            self._stream = None


async def _raw_drive(
    name: str,
    url: str,
    bodies: Callable[[int], bytes],
    *,
    clients: int,
    seconds: float,
    warmup: int,
    expect: int,
    headers: Mapping[str, str] | None,
    method: str,
) -> LoadResult:
    first = RawConnection(url, headers, method, name)
    for i in range(warmup):
        await first.call(bodies(i))
    first.close()
    latencies: list[float] = []
    errors = 0
    counter = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors, counter
        connection = RawConnection(url, headers, method, name)
        try:
            while time.perf_counter() < stop_at:
                counter += 1
                body = bodies(counter)
                started = time.perf_counter()
                status = await connection.call(body)
                latencies.append(time.perf_counter() - started)
                if status != expect:
                    errors += 1
        finally:
            connection.close()

    begun = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - begun
    ms = sorted(x * 1000 for x in latencies)
    return LoadResult(
        name, clients, len(ms), errors, elapsed, _percentile(ms, 50), _percentile(ms, 99)
    )


def drive_raw(
    name: str,
    url: str,
    bodies: Callable[[int], bytes],
    *,
    clients: int,
    seconds: float,
    warmup: int = 3,
    expect: int = 200,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
) -> LoadResult:
    """Closed-loop load: `clients` concurrent callers, each sending its next request at once,
    over a minimal HTTP/1.1 keep-alive client (one connection per client). httpx costs about
    2 ms of CPU per request, which on a small machine competes with the servers and adds
    client-side queueing to the latencies; this costs a small fraction of that. Needs
    `content-length` framed responses."""
    return asyncio.run(
        _raw_drive(
            name,
            url,
            bodies,
            clients=clients,
            seconds=seconds,
            warmup=warmup,
            expect=expect,
            headers=headers,
            method=method,
        )
    )


def table(results: Sequence[LoadResult], baseline: str) -> str:
    """Markdown rows per (server, clients) plus throughput ratios against `baseline`."""
    lines = [
        "| server | clients | requests | errors | req/s | p50 ms | p99 ms | req/s vs "
        + baseline
        + " |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r.name, r.clients): r for r in results}
    for r in results:
        base = by_key.get((baseline, r.clients))
        ratio = f"{r.rps / base.rps:.2f}x" if base and base.rps else "-"
        lines.append(
            f"| {r.name} | {r.clients} | {r.requests} | {r.errors} | {r.rps:.1f} | "
            f"{r.p50_ms:.1f} | {r.p99_ms:.1f} | {ratio} |"
        )
    return "\n".join(lines)


def upstream_package(name: str) -> ModuleType:
    """The installed upstream package `name`, not the bench script of the same name beside
    this module (bench/laya.py, bench/von.py), whose folder a script run puts first on
    sys.path."""
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    return importlib.import_module(name)


def python() -> str:
    return sys.executable


def cpu_model() -> str:
    """The CPU's model name, as `lscpu` prints it, for the tables' headings."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# -- CPU used by a server and its worker processes ------------------------------------------


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """`root` and its live descendants (Decidealot's gateway and its worker)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = _parent(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    tree = [root]
    for pid in tree:
        tree += [child for child, parent in parents.items() if parent == pid]
    return tree


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds used so far by `root` and its live descendants."""
    total = 0.0
    for pid in process_tree(root):
        try:
            total += _cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            continue
    return total


def role_cpu_seconds(root: int, roles: Mapping[str, str]) -> dict[str, float]:
    """CPU seconds so far of `root`'s tree split by role: each process counts for the first
    role whose marker its command line contains, the rest (the server itself) for "gateway"."""
    used = {"gateway": 0.0, **dict.fromkeys(roles, 0.0)}
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
            seconds = _cpu_seconds(pid)
        except (OSError, IndexError, ValueError):
            continue
        role = next((r for r, marker in roles.items() if marker.encode() in command), "gateway")
        used[role] += seconds
    return used


def server_root(marker: str) -> int:
    """The pid of this process's child whose command line contains `marker`."""
    me = os.getpid()
    for pid in process_tree(me)[1:]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read() and _parent(pid) == me:
                    return pid
        except OSError:
            continue
    raise RuntimeError(f"no server process matching {marker!r}")
