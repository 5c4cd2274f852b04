"""Byte layouts: golden bytes pin each format; hypothesis checks the round trips."""

from __future__ import annotations

import ast
import bisect
import pathlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cq_svc import ack_segment, group_offsets
from cq_svc import rocks_layout as layout
from mqstore.errors import CorruptFile
from mqstore.formats import cq_checkpoint
from mqstore.formats.cq_time import (
    Boundary,
    bisect_stored_files,
    decode_time,
    encode_time,
    search_offset_by_time,
)
from mqstore.formats.cq_unit import BLANK_UNIT, UNIT, count_valid
from tests.cq.support import encode_units


def test_a_unit_is_rocketmqs_20_big_endian_bytes() -> None:
    assert encode_units([(0x0102030405060708, 0x11223344, 2598919)]) == bytes.fromhex(
        "010203040506070811223344000000000027a807"
    )
    assert bytes(8) + b"\x7f\xff\xff\xff" + bytes(8) == BLANK_UNIT


def test_the_valid_walk_stops_at_zero_negative_backwards_and_the_confirmed_offset() -> None:
    buf = encode_units([(100, 10, 0), (200, 10, 0), (300, 10, 0)]) + bytes(20)
    assert count_valid(buf, 0, len(buf)) == (60, 310)
    assert count_valid(buf, 0, len(buf), below_phy=300) == (40, 210)
    back = encode_units([(100, 10, 0), (50, 10, 0)])
    assert count_valid(back, 0, len(back)) == (20, 110)
    neg = encode_units([(100, 10, 0)]) + UNIT.pack(-1, 10, 0)
    assert count_valid(neg, 0, len(neg)) == (20, 110)


def test_a_time_entry_is_six_bytes_of_time_and_a_check_bound_to_its_unit() -> None:
    unit = encode_units([(100, 10, 7)])
    entry = encode_time(unit, 1_700_000_000_123)
    assert entry[:6] == (1_700_000_000_123).to_bytes(6, "big")
    assert decode_time(unit, entry) == 1_700_000_000_123
    other_unit = encode_units([(120, 10, 7)])
    assert decode_time(other_unit, entry) is None  # a stale entry of another unit
    assert decode_time(unit, bytes(8)) is None or decode_time(unit, bytes(8)) == 0
    assert decode_time(unit, encode_time(unit, -5)) == 0  # clamped


@given(
    phy=st.integers(0, 2**63 - 1),
    size=st.integers(1, 2**31 - 1),
    tags=st.integers(-(2**63), 2**63 - 1),
    t=st.integers(0, 2**48 - 1),
)
def test_time_entries_round_trip(phy: int, size: int, tags: int, t: int) -> None:
    unit = UNIT.pack(phy, size, tags)
    assert decode_time(unit, encode_time(unit, t)) == t


@pytest.mark.parametrize(
    ("target", "lower", "upper"),
    [(20000, 1001, 1000), (1, 100, 0), (2001, 201, 200), (2000, 200, 200)],
)
def test_the_search_reproduces_rocketmqs_lower_upper_table(
    target: int, lower: int, upper: int
) -> None:
    def time_at(i: int) -> int:
        return i * 10

    assert search_offset_by_time(time_at, 100, 1001, target, Boundary.LOWER) == lower
    assert search_offset_by_time(time_at, 100, 1001, target, Boundary.UPPER) == upper
    assert search_offset_by_time(time_at, 5, 5, target, Boundary.LOWER) == 0


@given(
    steps=st.lists(st.integers(0, 3), min_size=1, max_size=60),
    damaged=st.dictionaries(st.integers(0, 59), st.integers(0, 2**48 - 1), max_size=8),
    lo_cut=st.integers(0, 10),
    hi_cut=st.integers(0, 10),
    target=st.integers(-2, 200),
    per_file=st.integers(1, 16),
    pick=st.integers(-1, 59),
)
@settings(max_examples=300)
def test_a_search_led_by_unchecked_times_answers_as_the_checked_search(
    steps: list[int],
    damaged: dict[int, int],
    lo_cut: int,
    hi_cut: int,
    target: int,
    per_file: int,
    pick: int,
) -> None:
    """raw_at (the stored time, unchecked) only proposes: damaged entries hold any value
    there, and what the checked series (a damaged entry reads as the next good one's time)
    gives is the answer, with and without it, at every boundary."""
    good = [sum(steps[: i + 1]) for i in range(len(steps))]  # non-decreasing
    n = len(good)
    if 0 <= pick < n:
        target = good[pick]  # a time that is there: where LOWER and UPPER part

    def checked(i: int) -> int:
        for j in range(i, n):
            if j not in damaged:
                return good[j]
        return good[-1]

    def raw(i: int) -> int:
        return damaged.get(i, good[i])

    lo, hi = min(lo_cut, n), max(min(lo_cut, n), n - hi_cut)
    # The stored entries as time files of `per_file` entries (time in the top 48 bits), for
    # the bisect that reads them straight from the files' bytes.
    files = [
        b"".join(struct.pack(">Q", raw(i) << 16) for i in range(f, min(f + per_file, n)))
        for f in range(0, n, per_file)
    ]

    def raw_bisect(a: int, b: int, t: int, right: bool) -> int:
        return bisect_stored_files(
            lambda k: (files[k], k * per_file), per_file, a, b, t, right=right
        )

    for boundary in Boundary:
        want = search_offset_by_time(checked, lo, hi, target, boundary)
        assert search_offset_by_time(checked, lo, hi, target, boundary, raw_bisect) == want
        if not damaged and hi > lo:  # over a series that never goes down: one bisect's answer
            for right, whole in ((False, bisect.bisect_left), (True, bisect.bisect_right)):
                assert raw_bisect(lo, hi, target, right) == whole(good, target, lo, hi)


def test_rocksdb_keys_follow_rocketmqs_layout() -> None:
    prefix = layout.queue_prefix("TopicA", 3)
    key = layout.unit_key(prefix, 42)
    assert key == (
        (6).to_bytes(4, "big")
        + b"\x01TopicA\x01"
        + (3).to_bytes(4, "big")
        + b"\x01"
        + (42).to_bytes(8, "big")
    )
    assert len(key) == 19 + 6
    assert layout.decode_unit_key(key) == ("TopicA", 3, 42)
    okey = layout.offset_key("TopicA", layout.MAX, 3)
    assert okey == (6).to_bytes(4, "big") + b"\x01TopicA\x01max\x01" + (3).to_bytes(4, "big")
    assert len(okey) == 14 + 6
    assert layout.decode_offset_key(okey) == ("TopicA", b"max", 3)
    assert layout.UNIT_VALUE.size == 28
    assert layout.offset_key("CHECKPOINT_TOPIC", b"max", 0) == layout.CHECKPOINT_KEY


def test_rocksdb_keys_sort_by_queue_offset() -> None:
    prefix = layout.queue_prefix("T", 1)
    keys = [layout.unit_key(prefix, o) for o in (0, 1, 255, 256, 70_000, 2**40)]
    assert keys == sorted(keys)
    long_topic = "x" * 300  # RocketMQ's testForEach: topics past 256 bytes parse
    assert layout.decode_offset_key(layout.offset_key(long_topic, layout.MIN, 9)) == (
        long_topic,
        b"min",
        9,
    )


def test_the_checkpoint_round_trips_and_rejects_damage() -> None:
    ckpt = cq_checkpoint.CqCheckpoint(b"s" * 16, 1234, 99, 5)
    data = cq_checkpoint.encode(ckpt)
    assert cq_checkpoint.decode(data) == ckpt
    for pos in (0, 10, len(data) - 1):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptFile):
            cq_checkpoint.decode(bytes(bad))


@given(
    st.dictionaries(
        st.integers(0, 16 * 5 - 1),
        st.tuples(st.sampled_from([1, 2]), st.integers(0, 65535), st.integers(0, 2**62)),
    )
)
def test_ack_segments_round_trip(slots: dict[int, tuple[int, int, int]]) -> None:
    for seg in range(5):
        mine = {o: s for o, s in slots.items() if seg * 16 <= o < (seg + 1) * 16}
        assert ack_segment.decode_segment(ack_segment.encode_segment(seg, 16, slots), 16) == mine


@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=20),
            st.text(max_size=20),
            st.integers(0, 9),
            st.integers(-1, 2**62),
        ),
        max_size=20,
    )
)
def test_offset_records_round_trip_and_any_cut_keeps_a_whole_prefix(
    items: list[tuple[str, str, int, int]],
) -> None:
    data = b"".join(group_offsets.encode_record((g, t, q), o) for g, t, q, o in items)
    records, good = group_offsets.decode_records(data)
    assert records == [((g, t, q), o) for g, t, q, o in items]
    assert good == len(data)
    if data:
        cut = len(data) - 1
        kept, good = group_offsets.decode_records(data[:cut])
        assert kept == records[: len(kept)] and len(kept) == len(records) - 1


def test_cq_svc_imports_no_other_service() -> None:
    root = pathlib.Path(__file__).resolve().parents[2] / "cq_svc"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("commitlog_svc", "index_svc")), (path.name, name)


def test_an_empty_range_of_time_files_is_its_start_read_from_no_file() -> None:
    """lo == hi at a file's end names no file to read (found by a review: it asked for the
    next file, which is not there)."""
    one = struct.pack(">Q", 5 << 16) * 4  # one file of 4 entries, offsets 0-3
    files = {0: (one, 0)}
    for right in (False, True):
        assert bisect_stored_files(files.__getitem__, 4, 4, 4, 5, right=right) == 4
        assert bisect_stored_files(files.__getitem__, 4, 0, 4, 5, right=right) == (
            4 if right else 0
        )
