"""A reliability diagram drawn straight to PNG with the standard library (zlib), so
`decidealot calibrate --plot` needs no plotting package: the diagonal of perfect calibration,
one curve per series (mean confidence against accuracy per confidence bin), a legend and axes,
lettered in a 5x7 pixel font."""

from __future__ import annotations

import itertools
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

Color = tuple[int, int, int]
SIZE, MARGIN, SCALE = 520, 64, 2
"""Image side, plot margin and the font's pixel scale."""
COLORS: tuple[Color, ...] = ((230, 120, 20), (30, 90, 200))
INK: Color = (40, 40, 40)
FAINT: Color = (200, 200, 200)

_GLYPHS = {
    "0": "01110 10001 10011 10101 11001 10001 01110",
    "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111",
    "3": "11110 00001 00001 01110 00001 00001 11110",
    "4": "00010 00110 01010 10010 11111 00010 00010",
    "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110",
    "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110",
    "9": "01110 10001 10001 01111 00001 00010 01100",
    ".": "00000 00000 00000 00000 00000 01100 01100",
    ":": "00000 01100 01100 00000 01100 01100 00000",
    "-": "00000 00000 00000 11111 00000 00000 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010",
    ")": "01000 00100 00010 00010 00010 00100 01000",
    " ": "00000 00000 00000 00000 00000 00000 00000",
    "a": "00000 00000 01110 00001 01111 10001 01111",
    "b": "10000 10000 10110 11001 10001 10001 11110",
    "c": "00000 00000 01110 10000 10000 10001 01110",
    "d": "00001 00001 01101 10011 10001 10001 01111",
    "e": "00000 00000 01110 10001 11111 10000 01110",
    "f": "00110 01001 01000 11100 01000 01000 01000",
    "g": "00000 01111 10001 10001 01111 00001 01110",
    "h": "10000 10000 10110 11001 10001 10001 10001",
    "i": "00100 00000 01100 00100 00100 00100 01110",
    "l": "01100 00100 00100 00100 00100 00100 01110",
    "n": "00000 00000 10110 11001 10001 10001 10001",
    "o": "00000 00000 01110 10001 10001 10001 01110",
    "r": "00000 00000 10110 11001 10000 10000 10000",
    "s": "00000 00000 01110 10000 01110 00001 11110",
    "t": "01000 01000 11100 01000 01000 01001 00110",
    "u": "00000 00000 10001 10001 10001 10011 01101",
    "w": "00000 00000 10001 10001 10101 10101 01010",
    "y": "00000 00000 10001 10001 01111 00001 01110",
    "C": "01110 10001 10000 10000 10000 10001 01110",
    "E": "11111 10000 10000 11110 10000 10000 11111",
}


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: Color, radius: int = 0) -> None:
        for yy in range(y - radius, y + radius + 1):
            for xx in range(x - radius, x + radius + 1):
                if 0 <= xx < self.width and 0 <= yy < self.height:
                    at = (yy * self.width + xx) * 3
                    self.pixels[at : at + 3] = bytes(color)

    def line(
        self, a: tuple[int, int], b: tuple[int, int], color: Color, width: int = 0, dash: int = 0
    ) -> None:
        steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for i in range(steps + 1):
            if dash and (i // dash) % 2:
                continue
            x = round(a[0] + (b[0] - a[0]) * i / steps)
            y = round(a[1] + (b[1] - a[1]) * i / steps)
            self.dot(x, y, color, width)

    def text(self, x: int, y: int, words: str, color: Color = INK) -> None:
        """`words` from its top-left corner; letters the font lacks are left blank."""
        for n, char in enumerate(words):
            rows = _GLYPHS.get(char, _GLYPHS[" "]).split()
            for r, bits in enumerate(rows):
                for c, bit in enumerate(bits):
                    if bit == "1":
                        for dy in range(SCALE):
                            for dx in range(SCALE):
                                left = x + (n * 6 + c) * SCALE + dx
                                self.dot(left, y + r * SCALE + dy, color)

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )


def draw(path: Path, series: Sequence[tuple[str, Sequence[tuple[float, float]]]]) -> None:
    """Write the diagram of `series` (name, [(mean confidence, accuracy) per non-empty bin])."""
    canvas = Canvas(SIZE, SIZE)
    side = SIZE - 2 * MARGIN

    def at(confidence: float, accuracy: float) -> tuple[int, int]:
        return MARGIN + round(confidence * side), SIZE - MARGIN - round(accuracy * side)

    for tick in (0.25, 0.5, 0.75):
        canvas.line(at(tick, 0), at(tick, 1), FAINT)
        canvas.line(at(0, tick), at(1, tick), FAINT)
    canvas.line(at(0, 0), at(1, 1), (150, 150, 150), dash=6)
    for corner in ((0, 0, 1, 0), (1, 0, 1, 1), (1, 1, 0, 1), (0, 1, 0, 0)):
        canvas.line(at(corner[0], corner[1]), at(corner[2], corner[3]), INK)
    for tick, label in ((0.0, "0"), (0.5, "0.5"), (1.0, "1")):
        x, y = at(tick, 0)
        canvas.text(x - len(label) * 6 * SCALE // 2, y + 8, label)
        x, y = at(0, tick)
        canvas.text(x - len(label) * 6 * SCALE - 6, y - 7, label)
    canvas.text(SIZE // 2 - 60, SIZE - MARGIN + 32, "confidence")
    canvas.text(MARGIN, MARGIN - 24, "accuracy")
    for n, (name, points) in enumerate(series):
        color = COLORS[n % len(COLORS)]
        pixels = [at(c, a) for c, a in points]
        for a, b in itertools.pairwise(pixels):
            canvas.line(a, b, color, width=1)
        for x, y in pixels:
            canvas.dot(x, y, color, radius=4)
        top = MARGIN + 12 + n * 22
        canvas.dot(MARGIN + 18, top + 7, color, radius=5)
        canvas.text(MARGIN + 32, top, name)
    path.write_bytes(canvas.png())
