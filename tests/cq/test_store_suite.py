"""One suite, both stores: RocketMQ's ConsumeQueue tests (§9) and the rules of §3 and §6.2."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cq_svc.config import StoreKind
from cq_svc.store import PullResult, PullStatus, put_entries
from mqstore.dispatch import DispatchEntry
from mqstore.errors import InvalidArgument
from mqstore.formats import sysflag
from mqstore.formats.cq_time import Boundary
from tests.cq.support import StoreHarness, entries, last_offset, phys


def test_rebuild_repeatedly_changes_nothing(harness: StoreHarness) -> None:
    store = harness.store
    batch = entries(120)
    assert put_entries(store, batch) == 120
    before = store.read_units("T", 0, 0, 200)
    assert put_entries(store, batch) == 0
    assert put_entries(store, batch[30:70]) == 0
    assert put_entries(store, batch[100:] + entries(5, start=120)) == 5
    assert store.max_offset("T", 0) == 125
    assert store.read_units("T", 0, 0, 120) == before
    assert phys(store.read_units("T", 0, 118, 10)) == [
        11800,
        11900,
        12000,
        12100,
        12200,
        12300,
        12400,
    ]


def test_units_survive_a_clean_reopen(harness: StoreHarness) -> None:
    put_entries(harness.store, entries(77, tags_code=5))
    before = harness.store.read_units("T", 0, 0, 100)
    store = harness.reopen()
    assert store.max_offset("T", 0) == 77
    assert store.read_units("T", 0, 0, 100) == before
    assert store.confirmed_offset == 76 * 100 + 100
    assert put_entries(store, entries(3, start=77)) == 3
    assert store.max_offset("T", 0) == 80


def test_correct_min_offset_gives_rocketmqs_numbers(
    make_harness: Callable[..., StoreHarness],
) -> None:
    h = make_harness(units_per_file=1000)
    store = h.store
    put_entries(store, entries(10_000))
    store.correct_min_offset(500)  # RocketMQ's setMinLogicOffset(100 bytes) = unit 5
    assert store.min_offset("T", 0) == 5
    store.correct_min_offset(2000)
    assert store.min_offset("T", 0) == 20
    store.correct_min_offset(10_000 * 100)
    assert store.min_offset("T", 0) == 10_000
    assert store.max_offset("T", 0) == 10_000


def test_a_queue_starting_mid_file_keeps_its_min_after_reopen_and_correction(
    harness: StoreHarness,
) -> None:
    # RocketMQ's testFillBankThenCorrectMinOffset: a queue whose first offset is 100.
    put_entries(harness.store, entries(1, start=100, phy_base=5000))
    assert harness.store.min_offset("T", 0) == 100
    assert harness.store.max_offset("T", 0) == 101
    store = harness.reopen()
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (100, 101)
    store.correct_min_offset(1)
    assert store.min_offset("T", 0) == 100
    result = store.pull("T", 0, 0, 32, 1 << 20)
    assert (result.status, result.next_begin_offset) == (PullStatus.OFFSET_TOO_SMALL, 100)
    assert [u.queue_offset for u in store.read_units("T", 0, 100, 5)] == [100]


def test_truncate_dirty_drops_units_at_or_beyond_the_offset_and_replay_restores_them(
    harness: StoreHarness,
) -> None:
    store = harness.store
    batch = entries(120)
    put_entries(store, batch)
    original = store.read_units("T", 0, 0, 120)
    assert store.truncate_dirty(5000) == 70
    assert store.max_offset("T", 0) == 50
    assert last_offset(store, "T", 0) == 5000
    assert store.truncate_dirty(5000) == 0
    assert put_entries(store, batch) == 70
    assert store.read_units("T", 0, 0, 120) == original
    store = harness.reopen()
    assert store.read_units("T", 0, 0, 120) == original


def test_truncate_inside_a_file_and_to_empty(harness: StoreHarness) -> None:
    store = harness.store
    put_entries(store, entries(30, phy_base=1000))
    assert store.truncate_dirty(1000 + 100 * 12 + 1) == 17
    assert store.max_offset("T", 0) == 13
    assert store.truncate_dirty(0) == 13
    assert store.max_offset("T", 0) == 0
    assert last_offset(store, "T", 0) == -1
    put_entries(store, entries(30, phy_base=1000))
    assert store.max_offset("T", 0) == 30


def test_delete_expired_moves_min_past_units_below_the_log_minimum(harness: StoreHarness) -> None:
    store = harness.store
    put_entries(store, entries(120))
    store.delete_expired(5100)
    assert store.min_offset("T", 0) == 51
    assert store.max_offset("T", 0) == 120
    result = store.pull("T", 0, 10, 32, 1 << 20)
    assert (result.status, result.next_begin_offset) == (PullStatus.OFFSET_TOO_SMALL, 51)
    assert phys(store.read_units("T", 0, 51, 1)) == [5100]
    store = harness.reopen()
    store.correct_min_offset(5100)
    assert store.min_offset("T", 0) == 51
    assert phys(store.read_units("T", 0, 0, 1)) == [5100]


def test_a_queue_wholly_below_the_log_minimum_is_empty_at_its_max(harness: StoreHarness) -> None:
    store = harness.store
    put_entries(store, entries(20))
    store.correct_min_offset(10_000)
    assert store.min_offset("T", 0) == store.max_offset("T", 0) == 20
    assert last_offset(store, "T", 0) == -1
    assert store.pull("T", 0, 20, 32, 1 << 20).status is PullStatus.OFFSET_OVERFLOW_ONE


def test_last_offset_is_the_end_of_the_newest_record(harness: StoreHarness) -> None:
    store = harness.store
    assert last_offset(store, "T", 0) == -1
    put_entries(store, entries(7, size=33))
    assert last_offset(store, "T", 0) == 600 + 33


@pytest.mark.parametrize(
    ("offset", "status", "next_begin"),
    [
        (2, PullStatus.OFFSET_TOO_SMALL, 5),
        (40, PullStatus.OFFSET_OVERFLOW_ONE, 40),
        (41, PullStatus.OFFSET_OVERFLOW_BADLY, 40),
        (5, PullStatus.FOUND, 8),
    ],
)
def test_pull_range_checks_follow_get_message(
    harness: StoreHarness, offset: int, status: PullStatus, next_begin: int
) -> None:
    store = harness.store
    put_entries(store, entries(40))
    store.correct_min_offset(500)
    result = store.pull("T", 0, offset, 3, 1 << 20)
    assert (result.status, result.next_begin_offset) == (status, next_begin)
    assert (result.min_offset, result.max_offset) == (5, 40)


def test_pull_on_an_unknown_queue_is_no_message_in_queue(harness: StoreHarness) -> None:
    result = harness.store.pull("Nope", 3, 7, 32, 1 << 20)
    assert (result.status, result.next_begin_offset) == (PullStatus.NO_MESSAGE_IN_QUEUE, 0)
    assert harness.store.list_queues("Nope") == []


def test_pull_returns_what_to_fetch_limited_by_count_and_bytes(harness: StoreHarness) -> None:
    store = harness.store
    put_entries(store, entries(40, size=100))
    by_count = store.pull("T", 0, 0, 4, 1 << 20)
    assert _fetched(by_count) == [(0, 100), (100, 100), (200, 100), (300, 100)]
    assert by_count.next_begin_offset == 4
    by_bytes = store.pull("T", 0, 0, 32, 250)
    assert _fetched(by_bytes) == [(0, 100), (100, 100)]
    assert by_bytes.next_begin_offset == 2
    tiny = store.pull("T", 0, 0, 32, 1)  # maxPullSize is at least 100 bytes
    assert _fetched(tiny) == [(0, 100)]


def test_pull_filters_by_tags_code_and_skips_misses(harness: StoreHarness) -> None:
    store = harness.store
    batch = [DispatchEntry("T", 0, i, 100 * i, 100, 7 if i % 3 == 0 else 8, i) for i in range(40)]
    put_entries(store, batch)
    result = store.pull("T", 0, 1, 3, 1 << 20, tags_codes={7})
    assert [u.queue_offset for u in result.units] == [3, 6, 9]
    assert result.next_begin_offset == 10
    assert result.filtered == 6
    none = store.pull("T", 0, 1, 3, 1 << 20, tags_codes={99})
    assert none.status is PullStatus.NO_MATCHED_MESSAGE
    assert none.next_begin_offset == 40  # the whole scan window was skipped
    assert store.pull("T", 0, 1, 3, 1 << 20, tags_codes=()).status is PullStatus.FOUND


def test_queues_and_topics_are_listed(harness: StoreHarness) -> None:
    store = harness.store
    for t, q in [("A", 0), ("A", 3), ("B", 1), ("A", 12)]:
        put_entries(store, entries(2, topic=t, queue_id=q))
    assert store.list_queues("A") == [0, 3, 12]
    assert store.list_topics() == ["A", "B"]
    store = harness.reopen()
    assert store.list_queues("A") == [0, 3, 12]
    assert store.list_queues("B") == [1]


def test_entries_that_skip_the_consume_queue_still_advance_the_confirmed_offset(
    harness: StoreHarness,
) -> None:
    prepared = DispatchEntry("T", 0, 0, 0, 100, 0, 0, sys_flag=sysflag.TRANSACTION_PREPARED_TYPE)
    assert put_entries(harness.store, [prepared], batch_end_offset=180) == 0
    assert harness.store.max_offset("T", 0) == 0
    assert harness.store.flush() == 180


def test_a_gap_in_queue_offsets_is_filled_with_blanks_that_pulls_skip(
    harness: StoreHarness,
) -> None:
    store = harness.store
    put_entries(store, entries(5))
    put_entries(store, entries(2, start=8))
    assert store.max_offset("T", 0) == 10
    result = store.pull("T", 0, 4, 32, 1 << 20)
    assert [u.queue_offset for u in result.units] == [4, 8, 9]
    with pytest.raises(InvalidArgument):
        put_entries(store, entries(1, start=10 + 10_000))


def test_reset_drops_every_queue(harness: StoreHarness) -> None:
    put_entries(harness.store, entries(10))
    harness.store.flush()
    harness.store.reset(b"x" * 16)
    assert harness.store.store_id == b"x" * 16
    assert harness.store.max_offset("T", 0) == 0
    assert harness.store.confirmed_offset == 0
    store = harness.reopen()
    assert store.store_id == b"x" * 16
    assert store.list_topics() == []


def test_bad_topic_names_never_become_paths(harness: StoreHarness) -> None:
    with pytest.raises(InvalidArgument):
        put_entries(harness.store, entries(1, topic="../etc"))


# -- time lookups --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timestamp", "lower", "upper"),
    [(20000, 1001, 1000), (1, 100, 100), (2001, 201, 200), (2000, 200, 200)],
)
def test_offset_by_time_follows_rocketmqs_table_clamped_to_the_queue(
    harness: StoreHarness, timestamp: int, lower: int, upper: int
) -> None:
    # RocksDBConsumeQueueTableTest: units 100..1000, store time = offset * 10. The table's
    # UPPER(1) = 0 is clamped to the queue's minimum, as ConsumeQueueStore does.
    put_entries(harness.store, entries(901, start=100, time_step=10, phy_base=0))
    store = harness.store
    assert store.get_offset_by_time("T", 0, timestamp, Boundary.LOWER) == lower
    assert store.get_offset_by_time("T", 0, timestamp, Boundary.UPPER) == upper


def test_equal_times_across_a_file_boundary_resolve_to_the_first_and_last(
    harness: StoreHarness,
) -> None:
    times = [10] * 40 + [20] * 20 + [30] * 10  # the 20s span units 40..59, files of 50
    batch = [DispatchEntry("T", 0, i, 100 * i, 100, 0, t) for i, t in enumerate(times)]
    put_entries(harness.store, batch)
    for reopen in (False, True):
        store = harness.reopen() if reopen else harness.store
        assert store.get_offset_by_time("T", 0, 20, Boundary.LOWER) == 40
        assert store.get_offset_by_time("T", 0, 20, Boundary.UPPER) == 59
        assert store.get_offset_by_time("T", 0, 15, Boundary.LOWER) == 40
        assert store.get_offset_by_time("T", 0, 15, Boundary.UPPER) == 39
        assert store.get_offset_by_time("T", 0, 10, Boundary.LOWER) == 0


def test_store_times_going_backwards_index_the_running_maximum(harness: StoreHarness) -> None:
    raw = [100, 300, 200, 400, 400, 150, 500]  # indexed: 100 300 300 400 400 400 500
    put_entries(
        harness.store, [DispatchEntry("T", 0, i, 10 * i, 10, 0, t) for i, t in enumerate(raw)]
    )
    for reopen in (False, True):
        store = harness.reopen() if reopen else harness.store
        assert [u.store_timestamp_ms for u in store.read_units("T", 0, 0, 10)] == [
            100,
            300,
            300,
            400,
            400,
            400,
            500,
        ]
        lookup = store.get_offset_by_time
        # LOWER never skips a message stored at or after T: nothing before it is >= T.
        for t in range(0, 600, 25):
            lo = lookup("T", 0, t, Boundary.LOWER)
            assert all(x < t for x in raw[:lo]), t
            up = lookup("T", 0, t, Boundary.UPPER)
            assert all(x <= t for x in raw[: up + 1]) or up == 0, t
        assert lookup("T", 0, 200, Boundary.LOWER) == 1
        assert lookup("T", 0, 400, Boundary.UPPER) == 5
        assert lookup("T", 0, 450, Boundary.LOWER) == 6


def test_offset_by_time_on_an_unknown_queue_is_zero(harness: StoreHarness) -> None:
    assert harness.store.get_offset_by_time("T", 9, 1234, Boundary.LOWER) == 0
    assert harness.store.get_offset_by_time("T", 9, 1234, Boundary.UPPER) == 0


def test_offset_by_time_ignores_units_below_the_minimum(harness: StoreHarness) -> None:
    put_entries(harness.store, entries(100, time_step=10))
    harness.store.delete_expired(3000)
    assert harness.store.min_offset("T", 0) == 30
    assert harness.store.get_offset_by_time("T", 0, 0, Boundary.LOWER) == 30
    assert harness.store.get_offset_by_time("T", 0, 455, Boundary.LOWER) == 46


def test_rocksdb_and_file_stores_are_both_exercised(harness: StoreHarness) -> None:
    assert harness.kind in (StoreKind.FILE, StoreKind.ROCKSDB)


def _fetched(result: PullResult) -> list[tuple[int, int]]:
    """(commit-log offset, size) of each unit a pull takes: what its Read asks for."""
    return [(u.commit_log_offset, u.size) for u in result.units]
