"""The open HTTP connections on a port, counted from the kernel's tables: granian accepts and
holds them in native code and tells Python nothing of them, and an idle or half-sent one never
reaches the ASGI app, so no layer above could count it.

A connection is a TCP socket this process holds (a `socket:[inode]` link in /proc/self/fd)
whose local port is the server's and which is not listening. Linux only; elsewhere: None.
"""

from __future__ import annotations

import os
from pathlib import Path

_FDS = Path("/proc/self/fd")
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # the state column's TCP_LISTEN


def open_connections(port: int) -> int | None:
    """Connections this process holds on `port`, accepted and not yet closed."""
    try:
        names = os.listdir(_FDS)
    except OSError:
        return None
    inodes: set[str] = set()
    for name in names:
        try:
            link = os.readlink(_FDS / name)
        except OSError:  # closed since the listing
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    suffix = f":{port:04X}"
    count = 0
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # sl, local address, remote address, state, ..., inode (the tenth field)
            if (
                len(fields) > 9
                and fields[1].endswith(suffix)
                and fields[3] != _LISTEN
                and fields[9] in inodes
            ):
                count += 1
    return count
