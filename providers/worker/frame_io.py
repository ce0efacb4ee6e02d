"""The worker's end of the frame pipes: fds 0 and 1 taken for frames, writes serialised.

Nothing else may write to stdout (stray prints go to stderr, which the gateway forwards to its
log), so the pipes are private handles and fds 0 and 1 are pointed elsewhere.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import BinaryIO

from decidealot.frames import FromWorker, encode


class FrameWriter:
    """Serialises frame writes from the reader, prepare and compute threads."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def write(self, frame: FromWorker) -> None:
        """Raises what msgpack raises for a frame it cannot carry; nothing is written then."""
        data = encode(frame)
        try:
            with self._lock:
                self._stream.write(data)
                self._stream.flush()
        except (BrokenPipeError, ValueError):
            os._exit(0)  # the gateway is gone: nobody is waiting for answers


def take_frame_pipes() -> tuple[BinaryIO, BinaryIO]:
    """Private handles on the frame pipes; fds 0 and 1 become /dev/null and stderr."""
    frames_in = os.fdopen(os.dup(0), "rb")
    frames_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (lives as long as the process)
    sys.stdout = sys.stderr
    return frames_in, frames_out
