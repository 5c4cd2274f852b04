"""Planning helpers of format("mqstore") without a session: range splits and read limits."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from mqstore.spark.service_source import QueueRange, cap_offsets, split_ranges


def covered(parts: list[QueueRange]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in parts:
        out.setdefault(p.queue_id, []).extend(range(p.start, p.end))
    return out


def ranges(*sizes: int) -> list[QueueRange]:
    return [QueueRange("t", q, 10, 10 + n, True) for q, n in enumerate(sizes)]


def test_no_options_one_partition_per_non_empty_queue() -> None:
    parts = split_ranges(ranges(5, 0, 7), None, None)
    assert [(p.queue_id, p.start, p.end) for p in parts] == [(0, 10, 15), (2, 10, 17)]


@pytest.mark.parametrize("minimum", [1, 2, 3, 4, 7, 10, 50, 1000])
def test_min_partitions_is_met_when_there_are_enough_offsets(minimum: int) -> None:
    parts = split_ranges(ranges(100, 10, 1), minimum, None)
    assert len(parts) >= min(minimum, 111)
    assert covered(parts) == {0: list(range(10, 110)), 1: list(range(10, 20)), 2: [10]}
    # Shares follow the sizes: the big queue gets the most pieces.
    counts = {q: sum(1 for p in parts if p.queue_id == q) for q in range(3)}
    assert counts[0] >= counts[1] >= counts[2] == 1


@pytest.mark.parametrize("cap", [1, 3, 10, 99, 100, 1000])
def test_max_records_per_partition_bounds_every_piece(cap: int) -> None:
    parts = split_ranges(ranges(100, 7), None, cap)
    assert all(p.end - p.start <= cap for p in parts)
    assert covered(parts) == {0: list(range(10, 110)), 1: list(range(10, 17))}


def test_cap_offsets_shares_in_proportion_and_always_moves() -> None:
    assert cap_offsets({0: 0, 1: 0}, {0: 10, 1: 10}, 100) == {0: 10, 1: 10}
    assert cap_offsets({0: 0, 1: 0, 2: 0}, {0: 10, 1: 10, 2: 10}, 7) == {0: 3, 1: 2, 2: 2}
    assert cap_offsets({0: 5, 1: 0}, {0: 5, 1: 100}, 10) == {0: 5, 1: 10}
    # A limit below the number of queues still makes progress.
    assert sum(cap_offsets({0: 0, 1: 0, 2: 0}, {0: 9, 1: 9, 2: 9}, 1).values()) == 1
    # A queue new to the stream (not in start) counts from 0.
    assert cap_offsets({0: 4}, {0: 8, 5: 8}, 6) == {0: 6, 5: 4}
