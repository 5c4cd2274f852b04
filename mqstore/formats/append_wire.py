"""Plain-Python references of the producer's two per-message passes the compiled core makes
(formats/_core_append.pxi), pinned to them by tests/formats/test_append_wire.py.

The core also writes an AppendRequest and an AppendResponse as wire bytes straight from their
columns, and reads an AppendResponse back into columns (the producer's requests and the commit
log's answers never go through a protobuf message filled field by field, nor its answers through
one read a number at a time). Their specification is the protobuf runtime itself: the tests pin
the core's bytes to what it serializes from the same fields and the core's reading to what it
parses, any bytes included.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate


def share_bounds(
    bodies: Sequence[bytes],
    properties: Sequence[bytes],
    overhead: int,
    share_messages: int,
    share_bytes: int,
) -> list[tuple[int, int, int]]:
    """Split messages into shares of at most share_messages and about share_bytes (a message
    heavier than share_bytes makes a share of its own), a message weighing its body, its
    properties and `overhead`: (first, end, weight) each."""
    n = len(bodies)
    if len(properties) != n:
        raise ValueError(f"{len(properties)} properties for {n} bodies")
    if share_messages < 1:
        raise ValueError("a share holds at least one message")
    weights = [len(b) + len(p) + overhead for b, p in zip(bodies, properties, strict=True)]
    totals = [0, *accumulate(weights)]
    shares: list[tuple[int, int, int]] = []
    first = 0
    while first < n:
        end = min(n, first + share_messages)
        if totals[end] - totals[first] > share_bytes:
            # The longest run from `first` within share_bytes (at least one message).
            lo, hi = first + 1, end
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if totals[mid] - totals[first] <= share_bytes:
                    lo = mid
                else:
                    hi = mid - 1
            end = lo
        shares.append((first, end, totals[end] - totals[first]))
        first = end
    return shares


def widest_bytes(items: Sequence[object]) -> int:
    """The length of the longest item (0 for none), or -1 when an item is not exactly bytes:
    a send_batch's bodies and properties checked and measured in one pass."""
    if any(type(item) is not bytes for item in items):
        return -1
    return max(map(len, items), default=0)  # type: ignore[arg-type]
