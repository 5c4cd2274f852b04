"""_core.chain (_core_check.pxi) follows exactly the chain a
record-by-record walk of TOTALSIZE in Python follows (framing: TOTALSIZE, magic, own offset),
over the logs the recovery-walk tests build: every record shape, records planted inside bodies
at their own position, damage of every kind, blanks, and an `end` that falls anywhere, inside a
record included."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats._core import chain
from mqstore.formats.record import (
    PHYSICAL_OFFSET_POS,
    RECORD_BYTES_MIN,
    encode_blank,
    encode_record,
)
from tests.formats.test_record_walk import DAMAGE, build_log, damage

_SIZE_MAGIC = struct.Struct(">ii")


def reference(buf: bytes | bytearray, pos: int, end: int, base: int) -> tuple[list[int], int]:
    """One record at a time: the definition chain is held to."""
    starts = []
    while end - pos >= RECORD_BYTES_MIN:
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        own = struct.unpack_from(">q", buf, pos + PHYSICAL_OFFSET_POS)[0]
        if magic not in (-626843481, -626843477) or not 91 <= total <= end - pos:
            break
        if own != base + pos:
            break
        starts.append(pos)
        pos += total
    return starts, pos


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 80),
    layout=st.sampled_from(["mixed", "same_body", "uniform", "uniform"]),
    kinds=DAMAGE,
    base=st.sampled_from([0, 4096, (1 << 40) + 12]),
    blank=st.booleans(),
    cut=st.floats(0, 1),
)
def test_chain_follows_the_chain_a_walk_follows(
    seed: int,
    count: int,
    layout: str,
    kinds: list[str],
    base: int,
    blank: bool,
    cut: float,
) -> None:
    rng = random.Random(seed)
    data = build_log(rng, base, count, layout=layout)
    if blank:
        data += encode_blank(64) + bytes(56)
    data = damage(rng, data, kinds)
    end = int(len(data) * cut) if rng.random() < 0.5 else len(data)
    starts, stop = chain(bytes(data), 0, end, base)
    want, want_stop = reference(data, 0, end, base)
    assert starts.tolist() == want
    assert stop == want_stop


def test_a_record_planted_in_a_body_at_its_own_place_is_not_taken_for_a_boundary() -> None:
    """A producer may write, inside a body, a whole record whose offset field names the place it
    lands on: it frames as a record there, but the chain steps over it."""
    out = bytearray()
    for i in range(40):
        at = len(out)
        body = bytearray(random.Random(i).randbytes(300))
        inner = encode_record(topic="A", queue_id=0, body=b"x", physical_offset=at + 88 + 10)
        body[10 : 10 + len(inner)] = inner
        out += encode_record(topic="T", queue_id=0, body=bytes(body), physical_offset=at)
    starts, stop = chain(bytes(out), 0, len(out), 0)
    assert starts.tolist() == reference(out, 0, len(out), 0)[0]
    assert len(starts) == 40 and stop == len(out)


def test_a_chain_of_thousands_of_records_and_ranges_outside_the_buffer() -> None:
    """The starts grow past any first guess; a range outside the buffer is refused."""
    one = encode_record(topic="T", queue_id=0, body=b"b")
    out = bytearray()
    for _ in range(5000):
        out += encode_record(topic="T", queue_id=0, body=b"b", physical_offset=len(out))
    starts, stop = chain(out, 0, len(out), 0)
    assert starts.tolist() == list(range(0, len(out), len(one))) and stop == len(out)
    assert chain(out, 10, 10, 0)[0].tolist() == []
    for pos, end in ((-1, 10), (5, 4), (0, len(out) + 1)):
        with pytest.raises(ValueError):
            chain(out, pos, end, 0)
