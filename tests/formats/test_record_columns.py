"""check_records has two ways to its verdicts: numpy columns for many records, and one record at
a time in Python for a few (`_check_few`, up to SMALL_BATCH_RECORDS_MAX). Whichever runs, the
result is the same, and every record either path passes is one read_record accepts."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats.record import (
    Record,
    encode_record,
    read_record,
    record_crc_property,
    stored_record_crc,
)
from mqstore.formats.record_columns import (
    SMALL_BATCH_RECORDS_MAX,
    CheckedRecords,
    _check_columns,
    _check_few,
    check_records,
    stored_crcs,
)

V6_HOST = bytes(range(16)) + b"\x00\x00\x10\x00"


# The last pair of a record written without the whole-record CRC may look like its property:
# its own key or one a byte off (read as a property with a wrong CRC, or a damaged one), or a
# key two bytes off (not the property: the record reads with its body CRC).
LOOKALIKES = [
    b"__CRC32#\x010123456789\x02",
    b"__CRC32!\x010123456789\x02",
    b"_xCRC3x#\x010123456789\x02",
]


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes, int]:
    """(a whole record, the offset it claims), of any shape the format allows: long (V2)
    topics, IPv6 hosts, empty bodies and properties, large bodies, with the whole-record CRC
    (the store's default) or without it (older and RocketMQ's records, whose last property may
    look like the CRC's)."""
    topic = draw(st.sampled_from(["T", "orders", "%RETRY%" + "t" * 130, "a-b_c|d"]))
    body = draw(st.sampled_from([b"", b"x", b"body-%d", bytes(600)]))
    props = draw(st.sampled_from([b"", b"TAGS\x01a\x02", b"UNIQ_KEY\x01" + b"A" * 32 + b"\x02"]))
    record_crc = draw(st.booleans())
    if not record_crc and draw(st.integers(0, 3)) == 0:
        props += draw(st.sampled_from(LOOKALIKES))
    offset = draw(st.integers(0, 1 << 40))
    v6 = draw(st.booleans())
    raw = encode_record(
        topic=topic,
        queue_id=draw(st.integers(0, 7)),
        body=body,
        properties=props,
        physical_offset=offset,
        sys_flag=sysflag.BORNHOST_V6 if v6 else 0,
        born_host=V6_HOST if v6 else b"\x7f\x00\x00\x01\x00\x00\x00\x00",
        record_crc=record_crc,
    )
    return raw, offset


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    """A record as records() makes it, then maybe one byte changed (anywhere, or in the last
    20 bytes, where the CRC property sits), a field rewritten or the offset asked for moved."""
    raw, offset = draw(records())
    kind = draw(st.sampled_from(["none", "flip", "flip_tail", "field", "offset"]))
    if kind in ("flip", "flip_tail"):
        lowest = len(raw) - 20 if kind == "flip_tail" else 0
        at = draw(st.integers(lowest, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif kind == "field":
        at = draw(st.sampled_from([0, 4, 8, 36, 84]))  # size, magic, CRC, SYSFLAG, body length
        out = bytearray(raw)
        struct.pack_into(">i", out, at, draw(st.integers(-(1 << 31), (1 << 31) - 1)))
        raw = bytes(out)
    elif kind == "offset":
        offset += draw(st.integers(1, 5))
    return raw, offset


@st.composite
def like_batch(draw: st.DrawFn) -> list[tuple[bytes, int]]:
    """A producer's batch: records of one size and layout at their own offsets (the columns
    read their fields as columns of a matrix), one of them maybe damaged."""
    raw, offset = draw(records())
    n = draw(st.integers(2, 3 * SMALL_BATCH_RECORDS_MAX))
    out = []
    for i in range(n):
        one = bytearray(raw)
        struct.pack_into(">q", one, 28, offset + i * len(raw))  # PHYSICALOFFSET
        out.append((bytes(one), offset + i * len(raw)))
    if draw(st.booleans()):
        k = draw(st.integers(0, n - 1))
        at = draw(st.integers(draw(st.sampled_from([0, len(raw) - 20])), len(raw) - 1))
        bad = bytearray(out[k][0])
        bad[at] ^= draw(st.integers(1, 255))
        out[k] = (bytes(bad), out[k][1])
    return out


def same(a: CheckedRecords, b: CheckedRecords) -> None:
    assert a.ok.tolist() == b.ok.tolist()
    assert a.starts.tolist() == b.starts.tolist() and a.ends.tolist() == b.ends.tolist()
    assert a.bodies == b.bodies
    assert (a.head is None) == (b.head is None)
    if a.head is not None:
        assert a.head.tobytes() == b.head.tobytes()
        assert a.head.dtype == b.head.dtype


def all_agree(raws: list[bytes], offsets: list[int] | None, bodies: bool) -> CheckedRecords:
    """One record at a time, the columns, check_records, and check_records given int arrays
    (as cq_svc's local reads pass them): the same verdicts, whichever decides."""
    blob = b"".join(raws)
    sizes = [len(r) for r in raws]
    few = _check_few(blob, sizes, offsets, bodies)
    same(few, _check_columns(blob, sizes, offsets, bodies))
    same(few, check_records(blob, sizes, offsets, bodies=bodies))
    arrays = None if offsets is None else np.array(offsets, dtype=np.int64)
    same(few, check_records(blob, np.array(sizes), arrays, bodies=bodies))
    return few


@settings(max_examples=400, deadline=None)
@given(
    st.lists(damaged(), min_size=1, max_size=SMALL_BATCH_RECORDS_MAX),
    st.booleans(),
    st.booleans(),
    st.integers(0, 3),
)
def test_a_few_records_get_the_verdicts_of_the_columns_and_of_read_record(
    drawn: list[tuple[bytes, int]], bodies: bool, with_offsets: bool, short: int
) -> None:
    raws = [raw for raw, _ in drawn]
    if short and len(raws) > 1:
        raws[-1] = raws[-1][: 40 + short]  # one too short to gather from: all left over
    offsets = [o for _, o in drawn] if with_offsets else None
    few = all_agree(raws, offsets, bodies)
    for i, raw in enumerate(raws):
        if few.ok[i]:
            got = read_record(
                raw, 0, len(raw), expected_offset=-1 if offsets is None else offsets[i]
            )
            assert isinstance(got, Record) and got.total_size == len(raw)
            if bodies:
                assert few.bodies[i] == got.body


def test_sizes_that_do_not_add_up_are_refused_alike() -> None:
    raw, _ = encode_record(topic="T", queue_id=0, body=b"b"), 0
    for sizes in ([len(raw) + 1], [len(raw), -1], [1, len(raw) - 1 + 5]):
        for check in (_check_few, _check_columns):
            try:
                check(raw, sizes, None, True)
            except ValueError:
                continue
            raise AssertionError(f"{check.__name__} took sizes {sizes}")


def test_offsets_that_are_not_one_a_record_are_refused() -> None:
    """An array of one offset would broadcast over every record (found by a review)."""
    raw = encode_record(topic="T", queue_id=0, body=b"b")
    for n in (2, SMALL_BATCH_RECORDS_MAX + 1):  # one at a time, and as columns
        blob, sizes = raw * n, [len(raw)] * n
        for wrong in (1, 0, n + 1):
            for offsets in (np.zeros(wrong, dtype=np.int64), [0] * wrong):
                with pytest.raises(ValueError):
                    check_records(blob, sizes, offsets)


def test_no_records_is_an_empty_verdict_both_ways() -> None:
    for check in (_check_few, _check_columns):
        got = check(b"", [], None, True)
        assert got.ok.tolist() == [] and got.head is None and got.bodies == []
    assert np.array_equal(_check_few(b"", [], None, True).starts, np.zeros(0, dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(like_batch(), st.lists(damaged(), min_size=1, max_size=3 * SMALL_BATCH_RECORDS_MAX)),
    st.booleans(),
    st.booleans(),
)
def test_the_columns_of_many_records_give_the_verdicts_of_one_at_a_time(
    drawn: list[tuple[bytes, int]], bodies: bool, with_offsets: bool
) -> None:
    """Past SMALL_BATCH_RECORDS_MAX the columns decide, reading a batch of like records as a
    matrix; one record at a time decides alike."""
    all_agree([raw for raw, _ in drawn], [o for _, o in drawn] if with_offsets else None, bodies)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**31 - 1),
            st.lists(st.tuples(st.integers(0, 19), st.integers(0, 255)), max_size=3),
        ),
        min_size=1,
        max_size=80,
    ),
    st.booleans(),
)
def test_the_crc_property_columns_read_what_stored_record_crc_reads(
    drawn: list[tuple[int, list[tuple[int, int]]]], strided: bool
) -> None:
    """stored_crcs (numpy, many records) against record.stored_record_crc (one), over
    properties as written, with bytes changed, and unlike any (as a strided view of records
    too, as the recovery walk passes them)."""
    tails = []
    for crc, changes in drawn:
        tail = bytearray(record_crc_property(crc))
        for at, value in changes:
            tail[at] = value
        tails.append(bytes(tail))
    want = [stored_record_crc(t, 20, 20) for t in tails]
    if strided:
        rows = np.frombuffer(b"".join(b"pad" + t for t in tails), dtype=np.uint8)
        matrix = rows.reshape(len(tails), 23)[:, 3:]
    else:
        matrix = np.frombuffer(b"".join(tails), dtype=np.uint8).reshape(len(tails), 20)
    assert stored_crcs(matrix).tolist() == want
