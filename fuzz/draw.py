"""Fuzz bytes to values, deterministically: the same bytes always draw the same values.

libFuzzer mutates bytes; a harness needs integers, strings and choices. `Draw` reads them off
the front of the input and never fails: once the bytes run out every draw returns its smallest
value (0, "", b"", the first choice), so any input is a valid test case and a shorter one is a
simpler one (which is what hypothesis shrinks towards when it feeds `st.binary()` in).

Integers come out at a listed edge (a limit, one past it, -1, the int32 extremes) about one draw
in four: bugs sit at boundaries, and a uniform draw from [0, 2**31) almost never hits 65,536.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

# Characters a topic or group may hold (RocketMQ's TopicValidator pattern)...
NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-%|"
# ...and pieces that must never be taken for one, or that stress an encoder.
ODD_PIECES = (
    "\x00",
    "\n",
    "\r",
    " ",
    "\t",
    "/",
    "\\",
    "..",
    ".",
    ":",
    "\x01",
    "\x02",
    "é",
    "中",
    "🙂",
    "\u202e",
    "\ufeff",
    "%RETRY%",
    "%DLQ%",
    "*",
    "||",
)
# Bytes per draw of a value of that width.
_WIDTH_BYTES = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8, 9: 16}
# One draw in EDGE_ONE_IN picks from the edges instead of the range.
EDGE_ONE_IN = 4


class Draw:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    @property
    def exhausted(self) -> bool:
        return self._pos >= len(self._data)

    def _take(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        self._pos += len(chunk)
        return chunk

    def byte(self) -> int:
        chunk = self._take(1)
        return chunk[0] if chunk else 0

    def boolean(self) -> bool:
        return bool(self.byte() & 1)

    def integer(self, lo: int, hi: int, edges: Sequence[int] = ()) -> int:
        """An integer in [lo, hi], or one of `edges` (which may lie outside it: that is their
        point) about one draw in EDGE_ONE_IN."""
        if edges and self.byte() % EDGE_ONE_IN == 0:
            return edges[self.byte() % len(edges)]
        span = hi - lo + 1
        if span <= 1:
            return lo
        width = _WIDTH_BYTES[min(9, (span.bit_length() + 7) // 8)]
        raw = int.from_bytes(self._take(width).ljust(width, b"\0"), "big")
        return lo + raw % span

    def choice(self, options: Sequence[T]) -> T:
        return options[self.byte() % len(options)]

    def blob(self, max_bytes: int, edges: Sequence[int] = ()) -> bytes:
        """Up to `max_bytes` of the input (fewer when it runs out); a length from `edges` is
        filled with a repeated byte rather than the input, so a long edge costs no input."""
        n = self.integer(0, max_bytes, edges)
        if n > max_bytes:
            return bytes([self.byte()]) * n
        return self._take(n)

    def text(self, max_chars: int, edges: Sequence[int] = ()) -> str:
        """Mostly name characters, sometimes an odd piece or any code point but a surrogate
        (protobuf strings are UTF-8: a surrogate cannot even be sent). A length from `edges`
        is one name character repeated."""
        n = self.integer(0, max_chars, edges)
        if n > max_chars or (edges and n in edges and self.boolean()):
            return self.choice(NAME_CHARS) * n
        out = []
        for _ in range(n):
            if self.exhausted:
                break
            kind = self.byte()
            if kind < 200:
                out.append(self.choice(NAME_CHARS))
            elif kind < 240:
                out.append(self.choice(ODD_PIECES))
            else:
                point = self.integer(0, 0x10FFFF)
                out.append(chr(point) if not 0xD800 <= point <= 0xDFFF else "?")
        return "".join(out)

    def rest(self) -> bytes:
        return self._take(len(self._data))
