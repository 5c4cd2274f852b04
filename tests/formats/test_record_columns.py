"""check_records, the compiled check of many whole records (formats/_core_check.pxi), against
read_record, the reference: for every record, damaged ones included, the same verdict (passed,
or failed with read_record's reason) and the same fields."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats.record import (
    Bad,
    Record,
    encode_blank,
    encode_record,
    field_spans,
    read_record,
)
from mqstore.formats.record_columns import NOT_WHOLE, check_records

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
    store_v6 = draw(st.booleans())
    raw = encode_record(
        topic=topic,
        queue_id=draw(st.integers(0, 7)),
        body=body,
        properties=props,
        physical_offset=offset,
        queue_offset=draw(st.integers(0, 1 << 40)),
        sys_flag=(sysflag.BORNHOST_V6 if v6 else 0)
        | (sysflag.STOREHOST_V6 if store_v6 else 0)
        | draw(st.sampled_from([0, sysflag.COMPRESSED, sysflag.TRANSACTION_PREPARED_TYPE])),
        born_host=V6_HOST if v6 else b"\x7f\x00\x00\x01\x00\x00\x00\x00",
        store_host=V6_HOST if store_v6 else b"\x0a\x00\x00\x02\x00\x00\x27\x10",
        record_crc=record_crc,
    )
    return raw, offset


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    """A record as records() makes it, then maybe one byte changed (anywhere, or in the last
    20 bytes, where the CRC property sits), a field rewritten, the offset asked for moved, its
    slot cut or lengthened, or something else in its place (a blank, a few bytes)."""
    raw, offset = draw(records())
    kinds = ["none", "flip", "flip_tail", "field", "field", "offset", "cut", "longer", "other"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("flip", "flip_tail"):
        lowest = len(raw) - 20 if kind == "flip_tail" else 0
        at = draw(st.integers(lowest, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    elif kind == "field":  # any field's bytes rewritten (record.field_spans names them)
        _, start, end = draw(st.sampled_from([f for f in field_spans(raw) if f[2] > f[1]]))
        out = bytearray(raw)
        out[start:end] = draw(st.binary(min_size=end - start, max_size=end - start))
        raw = bytes(out)
    elif kind == "offset":
        offset += draw(st.integers(1, 5))
    elif kind == "cut":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif kind == "longer":
        raw += bytes(draw(st.integers(1, 9)))
    elif kind == "other":
        raw = draw(st.sampled_from([encode_blank(len(raw)), bytes(len(raw)), raw[:7]]))
    return raw, offset


@st.composite
def like_batch(draw: st.DrawFn) -> list[tuple[bytes, int]]:
    """A producer's batch: records of one size and layout at their own offsets (the columns
    read their fields as columns of a matrix), one of them maybe damaged."""
    raw, offset = draw(records())
    n = draw(st.integers(2, 100))
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


def reference(raw: bytes, offset: int, check_crc: bool) -> Record | str:
    """read_record's verdict of one record in a slot of its own: the Record, or why not."""
    got = read_record(raw, 0, len(raw), check_crc=check_crc, expected_offset=offset)
    if isinstance(got, Bad):
        return got.reason
    if isinstance(got, Record) and got.total_size == len(raw):
        return got
    return NOT_WHOLE  # a blank, or a record shorter than its slot


def agree(drawn: list[tuple[bytes, int]], with_offsets: bool, check_crc: bool) -> None:
    """check_records of the records end to end against read_record of each, with bodies and
    without, sizes and offsets as lists and as int64 arrays."""
    raws = [raw for raw, _ in drawn]
    offsets = [o for _, o in drawn] if with_offsets else None
    blob = b"".join(raws)
    sizes = [len(r) for r in raws]
    want = [reference(r, o if with_offsets else -1, check_crc) for r, o in drawn]
    lean = check_records(
        blob, np.array(sizes), offsets and np.array(offsets), bodies=False, check_crc=check_crc
    )
    got = check_records(blob, sizes, offsets, check_crc=check_crc)
    failed = {f.record_index: f.reason for f in got.failed}
    assert [(f.record_index, f.reason) for f in lean.failed] == sorted(failed.items())
    assert got.ok == (not failed) and lean.bodies == []
    at = 0
    flags_any = 0
    for i, (raw, w) in enumerate(zip(raws, want, strict=True)):
        assert (got.starts[i], got.ends[i]) == (at, at + len(raw))
        at += len(raw)
        if isinstance(w, str):
            assert failed.get(i) == w
            assert got.bodies[i] == b"" and got.queue_offsets[i] == 0
            continue
        assert i not in failed
        assert got.bodies[i] == w.body
        fields = (w.queue_id, w.queue_offset, w.physical_offset, w.sys_flag)
        assert (
            got.queue_ids[i],
            got.queue_offsets[i],
            got.physical_offsets[i],
            got.sys_flags[i],
        ) == fields
        assert (
            lean.queue_ids[i],
            lean.queue_offsets[i],
            lean.physical_offsets[i],
            lean.sys_flags[i],
        ) == fields
        flags_any |= w.sys_flag
    assert got.flags_any == lean.flags_any == flags_any


@settings(max_examples=300, deadline=None)
@given(st.lists(damaged(), min_size=1, max_size=12), st.booleans(), st.booleans())
def test_each_record_gets_the_verdict_and_fields_of_read_record(
    drawn: list[tuple[bytes, int]], with_offsets: bool, check_crc: bool
) -> None:
    agree(drawn, with_offsets, check_crc)


@settings(max_examples=150, deadline=None)
@given(st.one_of(like_batch(), st.lists(damaged(), min_size=1, max_size=100)), st.booleans())
def test_many_records_get_the_verdicts_of_read_record(
    drawn: list[tuple[bytes, int]], with_offsets: bool
) -> None:
    agree(drawn, with_offsets, True)


def test_sizes_that_do_not_add_up_are_refused() -> None:
    raw = encode_record(topic="T", queue_id=0, body=b"b")
    for sizes in ([len(raw) + 1], [len(raw), -1], [1, len(raw) - 1 + 5], [len(raw), 0, 1]):
        with pytest.raises(ValueError):
            check_records(raw, sizes)
        with pytest.raises(ValueError):
            check_records(raw, np.array(sizes, dtype=np.int64))


def test_offsets_that_are_not_one_a_record_are_refused() -> None:
    """An array of one offset would broadcast over every record (found by a review)."""
    raw = encode_record(topic="T", queue_id=0, body=b"b")
    for n in (1, 2, 40):
        blob, sizes = raw * n, [len(raw)] * n
        for wrong in (0, n + 1):
            for offsets in (np.zeros(wrong, dtype=np.int64), [0] * wrong):
                with pytest.raises(ValueError):
                    check_records(blob, sizes, offsets)


def test_no_records_is_an_empty_verdict() -> None:
    got = check_records(b"", [])
    assert got.ok and got.bodies == [] and got.starts.tolist() == [] and got.flags_any == 0


def test_sizes_and_offsets_of_any_int_type_read_alike() -> None:
    """int32 arrays or numpy ints are read one by one, not as int64 bytes."""
    one = encode_record(topic="T", queue_id=0, body=b"b", physical_offset=0)
    raws = [one, encode_record(topic="T", queue_id=0, body=b"b", physical_offset=len(one))]
    sizes = [len(r) for r in raws]
    offsets = [0, sizes[0]]
    for kind in (np.int32, np.int64, np.uint64):
        got = check_records(
            b"".join(raws), np.array(sizes, dtype=kind), np.array(offsets, dtype=kind)
        )
        assert got.ok and got.ends.tolist() == [sizes[0], sum(sizes)]


def test_the_rarest_verdicts_are_read_records_too() -> None:
    """Damage the strategies seldom draw: IPv6 flags on a record too short for the hosts, and
    a body length that leaves no room for the topic's length (V1 and V2)."""
    small = encode_record(topic="T", queue_id=0, body=b"", record_crc=False)
    v6 = bytearray(small)
    v6[39] |= sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6
    drawn = [(bytes(v6), 0)]
    for topic in ("T", "%RETRY%" + "t" * 200):
        raw = bytearray(encode_record(topic=topic, queue_id=0, body=b"xy", record_crc=False))
        for spare in (0, 1):
            struct.pack_into(">i", raw, 84, len(raw) - 88 - spare)
            drawn.append((bytes(raw), 0))
    reasons = {reference(r, 0, True) for r, _ in drawn}
    assert {"total size 92 shorter than the header", "topic length runs past the record"} <= {
        r for r in reasons if isinstance(r, str)
    }
    agree(drawn, True, True)
