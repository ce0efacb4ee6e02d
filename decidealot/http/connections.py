"""The open HTTP connections on a port, counted from the kernel's tables: granian accepts and
holds them in native code and tells Python nothing of them, and an idle or half-sent one never
reaches the ASGI app, so no layer above could count it.

A connection is a TCP socket of the network namespace (a container's own) whose local port is
the server's, which is not listening and which a process holds (its inode is not 0: not one
closed and lingering, nor one the kernel has queued but the server not accepted): the server's
accepted sockets, since the kernel never gives a port a listener holds to an outgoing
connection. Reading the tables takes about 10 ms per thousand sockets in them, in a thread at
each scrape. Linux only; elsewhere: None.
"""

from __future__ import annotations

from pathlib import Path

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"  # the state column's TCP_LISTEN


def open_connections(port: int) -> int | None:
    """Connections open on `port`, accepted and not yet closed."""
    suffix = f":{port:04X}"
    count = 0
    read = False
    for table in _TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        read = True
        for line in lines:
            # sl, local address, remote address, state, queues, timer, retransmits, uid,
            # timeout, inode, ...
            fields = line.split(None, 10)
            if fields[1].endswith(suffix) and fields[3] != _LISTEN and fields[9] != "0":
                count += 1
    return count if read else None
