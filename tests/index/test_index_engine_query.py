"""Key queries: RocketMQ's IndexServiceTest (a huge maximum), chains with collisions, time windows
(candidates at the index's 1-second resolution, lookups exact to the millisecond), the
newest-to-oldest file walk, confirmation (#3613) and exact mode."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Mapping, Sequence

import pytest

from index_svc.confirm import KeyedRecord, confirm_key, confirm_uniq, key_matches
from index_svc.engine import TIME_MAX_MS
from mqstore.dispatch import DispatchEntry
from mqstore.errors import Unavailable
from mqstore.formats.javahash import index_key_hash
from tests.index.model import T0, msg

from .conftest import EngineFactory

ALL = (0, TIME_MAX_MS)


def test_a_maximum_of_int_max_neither_throws_nor_allocates(make_engine: EngineFactory) -> None:
    # RocketMQ's IndexServiceTest; #7948 allocated a list of maxNum up front.
    engine = make_engine(slot_num=16, entry_num=64)
    engine.apply([msg(i * 100, T0 + i, keys="k") for i in range(20)])
    tracemalloc.start()
    try:
        found = engine.query("T", "k", *ALL, 2**31 - 1)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found == [i * 100 for i in reversed(range(20))]
    assert peak < 64 * 1024


def test_the_candidate_cap_bounds_a_query(make_engine: EngineFactory) -> None:
    engine = make_engine(entry_num=256, max_candidates=10, max_results=5, uniq_max_results=3)
    engine.apply([msg(i * 100, T0, keys="k", uniq="U") for i in range(30)])
    assert len(engine.query("T", "k", *ALL, 10**9)) == 10
    assert engine.query("T", "k", *ALL, 4) == [2900, 2800, 2700, 2600]
    assert len(engine.query_uniq("T", "U")) == 3
    assert engine.query("T", "k", *ALL, 0) == []
    assert engine.query("T", "k", 10, 5, 10) == []  # an empty range


def test_colliding_keys_share_a_chain_and_both_come_back_as_candidates(
    make_engine: EngineFactory,
) -> None:
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")
    engine = make_engine()
    engine.apply([msg(0, T0, keys="Aa"), msg(100, T0, keys="x"), msg(200, T0, keys="BB")])
    # Without confirmation "Aa" finds the "BB" message too: RocketMQ #3613.
    assert engine.query("T", "Aa", *ALL, 10) == [200, 0]
    assert engine.query("T", "BB", *ALL, 10) == [200, 0]
    assert engine.query("T", "x", *ALL, 10) == [100]


def records_of(entries: list[DispatchEntry]) -> dict[int, KeyedRecord]:
    return {e.commit_log_offset: e for e in entries}


def test_confirmation_keeps_only_messages_whose_topic_and_key_really_match() -> None:
    entries = [
        msg(0, keys="Aa"),
        msg(100, keys="BB"),
        msg(200, keys="x Aa y"),
        msg(300, keys="Aa", topic="Other"),
        msg(400, keys="AaX"),
        msg(500, uniq="Aa"),  # a unique id equal to the key is not a key match
    ]
    records = records_of(entries)
    candidates = [500, 400, 300, 200, 100, 0, 999]  # 999: no record (expired)
    assert confirm_key(candidates, records, "T", "Aa") == [200, 0]
    assert confirm_uniq(candidates, records, "T", "Aa") == [500]
    assert confirm_uniq(candidates, records, "Other", "Aa") == []
    assert not key_matches(msg(0, keys=""), "T", "")


class CountingFetch:
    def __init__(self, entries: list[DispatchEntry]) -> None:
        self.records = records_of(entries)
        self.calls: list[list[int]] = []

    def __call__(self, offsets: Sequence[int]) -> Mapping[int, KeyedRecord]:
        self.calls.append(list(offsets))
        return {o: self.records[o] for o in offsets if o in self.records}


def test_lookup_returns_only_true_matches_widening_past_collisions(
    make_engine: EngineFactory,
) -> None:
    # Two true "Aa" messages, then 20 newer "BB" messages that collide with them.
    entries = [msg(0, T0, keys="Aa"), msg(100, T0, keys="Aa")]
    entries += [msg(200 + i * 100, T0, keys="BB") for i in range(20)]
    engine = make_engine(entry_num=64)
    engine.apply(entries)
    fetch = CountingFetch(entries)
    assert engine.lookup("T", "Aa", *ALL, 2, fetch) == [100, 0]
    # windows of 2, 8 and 32 candidates; no offset is fetched twice
    fetched = [o for call in fetch.calls for o in call]
    assert len(fetched) == len(set(fetched)) == 22
    assert len(fetch.calls) == 3


def test_lookup_drops_candidates_the_log_no_longer_has(make_engine: EngineFactory) -> None:
    entries = [msg(0, T0, keys="k"), msg(100, T0, keys="k")]
    engine = make_engine()
    engine.apply(entries)
    fetch = CountingFetch(entries[1:])  # offset 0 expired from the log
    assert engine.lookup("T", "k", *ALL, 10, fetch) == [100]
    assert engine.lookup_uniq("T", "k", fetch) == []


def test_exact_mode_drops_hash_collisions_before_any_read(make_engine: EngineFactory) -> None:
    entries = [msg(0, T0, keys="Aa"), msg(100, T0, keys="BB"), msg(200, T0, uniq="BB")]
    entries += [msg(300 + i * 100, T0, keys=f"k{i}") for i in range(10)]  # roll over
    engine = make_engine(exact=True)
    engine.apply(entries)
    assert len(engine.file_names) == 2
    assert engine.query("T", "Aa", *ALL, 10) == [0]
    assert engine.query("T", "BB", *ALL, 10) == [200, 100]
    fetch = CountingFetch(entries)
    assert engine.lookup("T", "BB", *ALL, 10, fetch) == [100]
    assert fetch.calls == [[200, 100]]  # the "Aa" message was never read


def test_exact_mode_survives_a_reopen(make_engine: EngineFactory) -> None:
    engine = make_engine(exact=True)
    engine.apply([msg(i * 100, T0, keys="Aa" if i % 2 else "BB") for i in range(12)])
    engine.close()
    engine = make_engine(exact=True)
    assert engine.query("T", "Aa", *ALL, 100) == [1100, 900, 700, 500, 300, 100]


TIMED = [
    msg(0, T0, keys="first"),
    msg(100, T0 + 999, keys="k"),
    msg(200, T0 + 1_000, keys="k"),
    msg(300, T0 + 1_999, keys="k"),
    msg(400, T0 + 2_000, keys="k"),
]


def test_candidates_cover_every_second_the_range_touches(make_engine: EngineFactory) -> None:
    """The index keeps whole seconds from the file's begin (1_999 ms reads as 1 s): the walk
    takes every entry whose second overlaps the range, a superset of the exact answer."""
    engine = make_engine(entry_num=64)
    engine.apply(TIMED)
    k = ("T", "k")
    assert engine.query(*k, T0, T0, 10) == [100]  # 999 ms reads as begin + 0 s
    assert engine.query(*k, T0 + 1, T0 + 999, 10) == [100]
    assert engine.query(*k, T0 + 1_000, T0 + 1_000, 10) == [300, 200]
    assert engine.query(*k, T0 + 1_500, T0 + 1_999, 10) == [300, 200]
    assert engine.query(*k, T0 + 2_001, TIME_MAX_MS, 10) == [400]
    assert engine.query(*k, 0, T0 - 1, 10) == []
    assert engine.query(*k, T0 + 3_000, TIME_MAX_MS, 10) == []


@pytest.mark.parametrize(
    ("begin", "end", "expected"),
    [
        (T0, T0, []),  # nothing stored at begin itself but "first"
        (T0 + 999, T0 + 999, [100]),
        (T0 + 1, T0 + 999, [100]),
        (T0 + 1_000, T0 + 1_000, [200]),
        (T0 + 1_001, T0 + 1_999, [300]),  # 1_999 ms: lost at one-second resolution
        (T0 + 1_999, T0 + 1_999, [300]),
        (T0 + 1_500, T0 + 1_998, []),
        (T0 + 999, T0 + 2_000, [400, 300, 200, 100]),
        (T0 + 2_000, TIME_MAX_MS, [400]),
        (T0 + 2_001, TIME_MAX_MS, []),
        (0, T0 - 1, []),
    ],
)
def test_a_lookup_window_is_exact_to_the_millisecond(
    make_engine: EngineFactory, begin: int, end: int, expected: list[int]
) -> None:
    """A key lookup answers exactly the messages stored within [begin, end], both inclusive, to
    the millisecond: the candidates' records are read to confirm them, and their store times
    decide (RocketMQ's one-second resolution, from the file's begin, lost 1_999 ms here)."""
    engine = make_engine(entry_num=64)
    engine.apply(TIMED)
    assert engine.lookup("T", "k", begin, end, 10, CountingFetch(TIMED)) == expected


def test_files_are_searched_newest_first_and_only_when_their_times_overlap(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()  # 7 keys a file
    engine.apply([msg(i * 100, T0 + i * 10_000, keys="k") for i in range(21)])
    assert len(engine.file_names) == 3
    assert engine.query("T", "k", *ALL, 100) == [i * 100 for i in reversed(range(21))]
    assert engine.query("T", "k", *ALL, 3) == [2000, 1900, 1800]
    # the range of the middle file only
    assert engine.query("T", "k", T0 + 70_000, T0 + 130_000, 100) == [
        1300,
        1200,
        1100,
        1000,
        900,
        800,
        700,
    ]


def test_the_walk_stops_after_a_file_that_begins_before_the_range(
    make_engine: EngineFactory,
) -> None:
    # RocketMQ's rule: after searching a file whose begin time is below the query's begin, older
    # files are not searched. With a clock that stepped back, an older file can hold a later
    # time, and the rule misses it; mqstore keeps the rule (and documents it).
    engine = make_engine()
    old = [msg(i * 100, T0 + 500_000, keys=f"o{i}") for i in range(6)]
    old.append(msg(600, T0 + 500_000, keys="k"))
    new = [msg(700, T0, keys="k")] + [msg(800 + i * 100, T0 + 600_000, keys="k") for i in range(2)]
    engine.apply(old + new)
    assert len(engine.file_names) == 2
    assert engine.query("T", "k", T0 + 400_000, TIME_MAX_MS, 10) == [900, 800]
    assert engine.query("T", "k", 0, TIME_MAX_MS, 10) == [900, 800, 700, 600]


def test_a_closed_engine_refuses_queries(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.close()
    with pytest.raises(Unavailable):
        engine.query("T", "k", *ALL, 1)


def test_queries_run_safely_while_batches_are_applied(make_engine: EngineFactory) -> None:
    engine = make_engine(entry_num=32)
    entries = [msg(i * 100, T0 + i * 10, keys="k") for i in range(1_500)]
    stop = threading.Event()
    errors: list[BaseException] = []
    seen = [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                got = engine.query("T", "k", *ALL, 40)
                assert got == sorted(got, reverse=True)
                assert got == list(range(got[0], got[0] - 100 * len(got), -100)) if got else True
                seen[0] += 1
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(0, len(entries), 5):
            engine.apply(entries[i : i + 5])
            if i % 300 == 0:
                engine.delete_expired(i * 50)
        deadline = time.monotonic() + 30
        while seen[0] == 0 and not errors and time.monotonic() < deadline:
            time.sleep(0.001)  # a reader starved of the GIL still gets one query in
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert errors == []
    assert seen[0] > 0
    assert engine.query("T", "k", *ALL, 3) == [149_900, 149_800, 149_700]
