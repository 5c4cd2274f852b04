"""The index file's bytes: golden bytes built by hand, header and name codecs, and the chain
walk's stop conditions over hand-made buffers (rocketmq-store.md §4)."""

from __future__ import annotations

import datetime
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mqstore.formats import index_file as fmt
from mqstore.formats.javahash import index_key_hash
from mqstore.storage.simdisk import SimDisk
from tests.index.model import T0, msg

from .conftest import EngineFactory

S, N = 4, 8  # 4 slots, 8 entries: 216 bytes


def test_java_hashes_used_by_the_golden_file_are_what_the_jvm_computes() -> None:
    # By hand: ((84*31 + 35)*31 + 65)*31 + 97 = 2538191, and "BB" gives the same ("Aa" and "BB"
    # are Java's classic collision); "T#c" = (84*31 + 35)*31 + 99 = 81908.
    assert index_key_hash("T#Aa") == 2538191
    assert index_key_hash("T#BB") == 2538191
    assert index_key_hash("T#c") == 81908


def test_a_small_file_is_byte_for_byte_what_rocketmq_writes(
    make_engine: EngineFactory, sim: SimDisk
) -> None:
    engine = make_engine(slot_num=S, entry_num=N)
    engine.apply(
        [
            msg(0, T0, keys="Aa"),
            msg(100, T0 + 1_500, keys="BB"),
            msg(200, T0 + 3_000, keys="c", uniq="Aa"),
        ]
    )
    [name] = engine.file_names
    got = sim.read(f"{engine.config.index_dir}/{name}")

    h_aa, h_c = 2538191, 81908  # slots 3 and 0
    expected = bytearray(40 + 4 * S + 20 * N)
    # header: begin/end time, begin/end offset, 2 slots used, next entry number 5
    struct.pack_into(">qqqqii", expected, 0, T0, T0 + 3_000, 0, 200, 2, 5)
    # slots: slot 0 -> entry 4 ("T#c"), slot 3 -> entry 3 (the uniq key "Aa" of the third)
    struct.pack_into(">iiii", expected, 40, 4, 0, 0, 3)
    entries = 40 + 4 * S
    # entry n: key hash, commit-log offset, time diff in whole seconds, previous in the slot
    struct.pack_into(">iqii", expected, entries + 20 * 1, h_aa, 0, 0, 0)
    struct.pack_into(">iqii", expected, entries + 20 * 2, h_aa, 100, 1, 1)
    struct.pack_into(">iqii", expected, entries + 20 * 3, h_aa, 200, 3, 2)  # UNIQ_KEY first
    struct.pack_into(">iqii", expected, entries + 20 * 4, h_c, 200, 3, 0)
    assert got == bytes(expected)


def test_header_round_trips_and_a_count_below_one_loads_as_one() -> None:
    h = fmt.IndexHeader(T0, T0 + 5, 10, 20, 3, 7)
    assert fmt.decode_header(fmt.encode_header(h)) == h
    raw = fmt.encode_header(fmt.IndexHeader(index_count=0))
    assert fmt.decode_header(raw).index_count == 1
    raw = fmt.encode_header(fmt.IndexHeader(index_count=-5))
    assert fmt.decode_header(raw).index_count == 1


@given(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.integers(1, 2**31 - 1),
)
def test_header_codec_round_trips_any_values(ts: int, phy: int, used: int, count: int) -> None:
    h = fmt.IndexHeader(ts, ts, phy, phy, used, count)
    assert fmt.decode_header(fmt.encode_header(h)) == h


def test_file_size_and_positions_follow_the_layout() -> None:
    assert fmt.file_bytes(fmt.DEFAULT_SLOT_NUM, fmt.DEFAULT_ENTRY_NUM) == 420_000_040
    assert fmt.slot_pos(3) == 52
    assert fmt.entry_pos(4, 1) == 40 + 16 + 20


def _ms_of_name(name: str) -> int:
    """The creation time an index file's name says (name_of's inverse)."""
    if not fmt.NAME_PATTERN.match(name):
        raise ValueError(f"not an index file name: {name!r}")
    dt = datetime.datetime.strptime(name[:14], "%Y%m%d%H%M%S").replace(tzinfo=datetime.UTC)
    return int(dt.timestamp()) * 1000 + int(name[14:])


def test_file_names_are_the_creation_time_in_milliseconds() -> None:
    assert fmt.name_of(1_700_000_000_123) == "20231114221320123"
    assert _ms_of_name("20231114221320123") == 1_700_000_000_123
    assert fmt.name_of(0) == "19700101000000000"
    with pytest.raises(ValueError, match="not an index file name"):
        _ms_of_name("2023111422132012")


@given(st.integers(0, 253_402_300_799_998))  # up to the last millisecond of year 9999
def test_file_names_round_trip_and_sort_like_the_times(ms: int) -> None:
    name = fmt.name_of(ms)
    assert fmt.NAME_PATTERN.match(name)
    assert _ms_of_name(name) == ms
    assert fmt.name_of(ms + 1) > name


@pytest.mark.parametrize(
    ("store_ts", "begin", "expected"),
    [
        (T0 + 999, T0, 0),
        (T0 + 1_000, T0, 1),
        (T0 + 1_999, T0, 1),
        (T0 - 5_000, T0, 0),  # a store time before begin clamps to 0
        (T0, 0, 0),  # no begin time yet
        (T0 + (2**31) * 1000 + 5, T0, 2**31 - 1),  # clamped to Integer.MAX_VALUE
    ],
)
def test_time_diff_is_whole_seconds_clamped(store_ts: int, begin: int, expected: int) -> None:
    assert fmt.time_diff_s(store_ts, begin) == expected


@pytest.mark.parametrize(
    ("begin", "end", "matched"),
    [
        (T0 - 10, T0 - 1, False),
        (T0 - 10, T0, True),
        (T0 + 5, T0 + 6, True),
        (T0 + 10, T0 + 20, True),
        (T0 + 11, T0 + 20, False),
        (T0 - 10, T0 + 20, True),
    ],
)
def test_time_match_is_overlap_of_closed_ranges(begin: int, end: int, matched: bool) -> None:
    h = fmt.IndexHeader(begin_ts_ms=T0, end_ts_ms=T0 + 10)
    assert fmt.is_time_matched(h, begin, end) is matched


# -- the chain walk's stop conditions, over hand-made files --------------------------------------


def hand_file(
    entries: dict[int, tuple[int, int, int, int]], slot_values: dict[int, int], count: int
) -> tuple[bytearray, fmt.IndexHeader]:
    buf = bytearray(fmt.file_bytes(S, N))
    header = fmt.IndexHeader(begin_ts_ms=T0, end_ts_ms=T0 + 100_000, index_count=count)
    buf[0:40] = fmt.encode_header(header)
    for slot, value in slot_values.items():
        struct.pack_into(">i", buf, 40 + 4 * slot, value)
    for n, values in entries.items():
        struct.pack_into(">iqii", buf, fmt.entry_pos(S, n), *values)
    return buf, header


def walk(buf: bytearray, header: fmt.IndexHeader, key_hash: int = 5, begin: int = 0) -> list[int]:
    return [phy for _n, phy in fmt.chain_matches(buf, S, header, key_hash, begin, 2**62)]


def test_chain_walk_follows_prev_to_the_end_of_the_chain() -> None:
    # key hash 5 -> slot 1; entries 1, 3, 4 on the chain; entry 3 is another key (hash 9)
    buf, h = hand_file({1: (5, 10, 0, 0), 3: (9, 30, 0, 1), 4: (5, 40, 0, 3)}, {1: 4}, 5)
    assert walk(buf, h) == [40, 10]


@pytest.mark.parametrize(
    ("case", "entries", "slots", "count", "expected"),
    [
        ("empty file: count <= 1", {1: (5, 10, 0, 0)}, {1: 1}, 1, []),
        ("slot value 0", {1: (5, 10, 0, 0)}, {}, 2, []),
        ("slot value negative", {1: (5, 10, 0, 0)}, {1: -1}, 2, []),
        ("slot value beyond the count", {1: (5, 10, 0, 0), 2: (5, 20, 0, 1)}, {1: 3}, 2, []),
        ("prev beyond the count", {1: (5, 10, 0, 0), 2: (5, 20, 0, 7)}, {1: 2}, 3, [20]),
        ("prev == current", {2: (5, 20, 0, 2)}, {1: 2}, 3, [20]),
        ("prev above current", {1: (5, 10, 0, 2), 2: (5, 20, 0, 1)}, {1: 1}, 3, [10]),
        ("time diff < 0", {1: (5, 10, 0, 0), 2: (5, 20, -1, 1)}, {1: 2}, 3, []),
    ],
)
def test_chain_walk_stops_where_rocketmq_stops(
    case: str,
    entries: dict[int, tuple[int, int, int, int]],
    slots: dict[int, int],
    count: int,
    expected: list[int],
) -> None:
    buf, h = hand_file(entries, slots, count)
    assert walk(buf, h) == expected, case


def test_chain_walk_stops_at_the_first_entry_older_than_the_range() -> None:
    # newest first: entry 3 at +30 s, entry 2 at +10 s (older than begin), entry 1 at +40 s
    # (a clock that stepped back): the walk stops at entry 2 and never sees entry 1.
    buf, h = hand_file({1: (5, 10, 40, 0), 2: (5, 20, 10, 1), 3: (5, 30, 30, 2)}, {1: 3}, 4)
    assert walk(buf, h, begin=T0 + 20_000) == [30]
    assert walk(buf, h, begin=T0) == [30, 20, 10]


def test_chain_walk_is_lazy_so_a_huge_maximum_costs_nothing() -> None:
    buf, h = hand_file({1: (5, 10, 0, 0), 2: (5, 20, 0, 1)}, {1: 2}, 3)
    matches = fmt.chain_matches(buf, S, h, 5, 0, 2**62)
    assert next(matches) == (2, 20)


def test_rebuilt_slots_hold_the_newest_entry_of_each_slot() -> None:
    buf, _h = hand_file(
        {1: (5, 10, 0, 0), 2: (6, 20, 0, 0), 3: (9, 30, 0, 1), 4: (8, 40, 0, 0)}, {}, 5
    )
    entries = np.frombuffer(buf, dtype=fmt.ENTRY_DTYPE, count=N, offset=fmt.entries_pos(S))
    slots, used = fmt.rebuild_slots(entries, S, 5)
    assert list(slots) == [4, 3, 2, 0]  # 8%4=0 -> 4; 5,9 -> slot 1 -> 3; 6 -> slot 2 -> 2
    assert used == 3
    slots, used = fmt.rebuild_slots(entries, S, 3)
    assert list(slots) == [0, 1, 2, 0]
    assert used == 2
