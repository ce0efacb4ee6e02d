"""What connections cost the gateway: held at once, descriptors and memory per connection, and
how long a slow or idle one is kept, over a real `decidealot serve` (no local provider: the
gateway process alone, which is what holds the connections).

Three servers in turn, on one loopback port each:

- `hold`: DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS=600, so nothing is closed under the count. Its
  resident memory (VmRSS) and descriptors idle, with N idle connections (no byte sent), with the
  same connections each holding half a request head, and after they close; `/health` on a new
  connection meanwhile.
- `capacity`: the same, DECIDEALOT_MAX_CONNECTIONS=4096 (the default) and 4096 + 200
  connections opened: how many the process holds (its descriptors and
  `decidealot_open_connections`), and what a client past the limit gets.
- `timeouts`: the default settings: when the server closes 200 connections that never send a
  byte, and 200 that send a header byte every 2 s.

    .venv/bin/python bench/connections.py              # N = 1000
    .venv/bin/python bench/connections.py --idle 2000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import cpu_model, free_port, python

NO_LOCAL = {"DECIDEALOT_LAYA_ENABLED": "false", "DECIDEALOT_VON_ENABLED": "false"}
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "


@contextlib.contextmanager
def serving(**env: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`decidealot serve` on a free port with `env`; yields its port and process."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DECIDEALOT_")}
    full = clean | NO_LOCAL | {"DECIDEALOT_PORT": str(port), "OMP_NUM_THREADS": "1"} | env
    process = subprocess.Popen(
        [python(), "-m", "decidealot", "serve"],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while health(port, 1.0) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("decidealot serve did not start")
            time.sleep(0.2)
        yield port, process
    finally:
        process.terminate()
        process.wait(30)


def health(port: int, timeout: float) -> float | None:
    """Seconds `/health` took on a new connection; None when it did not answer in `timeout`."""
    started = time.perf_counter()
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=timeout)
    except httpx.HTTPError:
        return None
    return time.perf_counter() - started if response.status_code == 200 else None


def fds(process: subprocess.Popen[bytes]) -> int:
    return len(os.listdir(f"/proc/{process.pid}/fd"))


def rss_mib(process: subprocess.Popen[bytes]) -> float:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def open_connections(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    line = next(s for s in text.splitlines() if s.startswith("decidealot_open_connections "))
    return float(line.split()[1]) - 1  # less the scrape's own


def settle(process: subprocess.Popen[bytes], target: int, seconds: float = 20) -> int:
    """The process's descriptor count once it stops moving towards `target` (or reaches it)."""
    deadline = time.monotonic() + seconds
    last, still = -1, 0
    while time.monotonic() < deadline:
        now = fds(process)
        if now == target:
            return now
        still = still + 1 if now == last else 0
        if still >= 10:  # a second without change
            return now
        last = now
        time.sleep(0.1)
    return fds(process)


def connect(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def hold(idle: int) -> list[str]:
    rows = []
    with serving(DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS="600") as (port, process):
        time.sleep(1)
        base_fds, base_rss = fds(process), rss_mib(process)
        rows.append(f"| started, no connection | {base_fds} | {base_rss:.1f} | |")
        sockets = connect(port, idle)
        held = settle(process, base_fds + idle) - base_fds
        took = health(port, 5)
        rss = rss_mib(process)
        rows.append(
            f"| {idle} idle connections (no byte sent) | {base_fds + held} "
            f"({held / idle:.2f} per connection) | {rss:.1f} "
            f"({(rss - base_rss) * 1024 / idle:.1f} KiB per connection) | {_ms(took)} |"
        )
        for sock in sockets:
            sock.sendall(HALF_HEAD)
        time.sleep(1)
        rss = rss_mib(process)
        rows.append(
            f"| the same, each with half a request head sent | {fds(process)} | {rss:.1f} "
            f"({(rss - base_rss) * 1024 / idle:.1f} KiB per connection) | "
            f"{_ms(health(port, 5))} |"
        )
        for sock in sockets:
            sock.close()
        after = settle(process, base_fds)
        rows.append(f"| after the clients closed | {after} | {rss_mib(process):.1f} | |")
    return [
        f"### Holding {idle} connections (`hold`)",
        "",
        "| state | descriptors | resident memory, MiB | `/health` on a new connection |",
        "|---|---|---|---|",
        *rows,
    ]


def capacity(extra: int = 200) -> list[str]:
    limit = 4096
    with serving(DECIDEALOT_HEADER_READ_TIMEOUT_SECONDS="600") as (port, process):
        time.sleep(1)
        base_fds, base_rss = fds(process), rss_mib(process)
        sockets = connect(port, limit + extra)  # the kernel completes the handshake of each
        held = settle(process, base_fds + limit) - base_fds
        rss = rss_mib(process)
        took = health(port, 2)
        freed = extra + 100  # the queued ones are accepted first, then there is room
        for sock in sockets[:freed]:
            sock.close()
        time.sleep(1)
        after = health(port, 2)
        counted = open_connections(port)
        for sock in sockets[freed:]:
            sock.close()
    return [
        f"### DECIDEALOT_MAX_CONNECTIONS={limit} (the default), {limit + extra} opened "
        "(`capacity`)",
        "",
        f"- held by the process: {held} connections ({held + base_fds} descriptors); "
        f"resident memory {rss:.1f} MiB ({base_rss:.1f} MiB before)",
        f"- `/health` on connection {limit + extra + 1}: "
        f"{_ms(took) if took is not None else 'no answer in 2 s (queued in the kernel)'}",
        f"- after {freed} clients closed: `/health` {_ms(after)}; "
        f"`decidealot_open_connections` {counted:.0f}",
    ]


def timeouts(count: int = 200, drip: float = 2.0) -> list[str]:
    with serving() as (port, _):
        idle = connect(port, count)
        slow = connect(port, count)
        opened = time.monotonic()
        closed: dict[socket.socket, float] = {}
        sent = 0
        while len(closed) < 2 * count and time.monotonic() - opened < 120:
            if time.monotonic() - opened >= sent * drip:
                for sock in slow:
                    if sock not in closed:
                        with contextlib.suppress(OSError):
                            sock.send(HALF_HEAD[sent % len(HALF_HEAD) : sent % len(HALF_HEAD) + 1])
                sent += 1
            live = [s for s in idle + slow if s not in closed]
            readable, _, _ = select.select(live, [], [], 0.05)
            for sock in readable:
                with contextlib.suppress(OSError):
                    sock.recv(4096)
                closed[sock] = time.monotonic() - opened
        took = health(port, 5)
        for sock in idle + slow:
            sock.close()

    def spread(group: list[socket.socket]) -> str:
        times = sorted(closed[s] for s in group if s in closed)
        kept = len(group) - len(times)
        return f"{times[0]:.2f} / {statistics.median(times):.2f} / {times[-1]:.2f} s" + (
            f", {kept} never closed" if kept else ""
        )

    return [
        "### The default timeouts (`timeouts`): when the server closes a connection",
        "",
        "| connections | closed after (first / median / last, from connect) |",
        "|---|---|",
        f"| {count} that never send a byte | {spread(idle)} |",
        f"| {count} sending a header byte every {drip:g} s | {spread(slow)} |",
        "",
        f"`/health` on a new connection afterwards: {_ms(took)}.",
    ]


def _ms(seconds: float | None) -> str:
    return "no answer" if seconds is None else f"{seconds * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--sections", default="hold,capacity,timeouts")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * (4096 + 200 + args.idle)
    if soft < wanted:
        resource.setrlimit(
            resource.RLIMIT_NOFILE,
            (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard),
        )
    sections = {"hold": lambda: hold(args.idle), "capacity": capacity, "timeouts": timeouts}
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores seen\n")
    for name in args.sections.split(","):
        print("\n".join(sections[name]()) + "\n")


if __name__ == "__main__":
    main()
