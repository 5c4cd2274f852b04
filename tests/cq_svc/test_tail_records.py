"""TailRecords (cq_svc/tail_records.py) on its own: what a lookup answers from the frames held,
and what it refuses to answer."""

from __future__ import annotations

import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cq_svc.tail_records import TailRecords


def i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class Log:
    """Frames of records laid back to back from offset 0, each record's bytes random, and the
    truth to compare lookups with."""

    def __init__(self, tail: TailRecords) -> None:
        self.tail = tail
        self.at = 0
        self.records: dict[int, bytes] = {}

    def frame(self, sizes: list[int], gap: int = 0) -> list[int]:
        self.at += gap
        offsets = []
        for size in sizes:
            offsets.append(self.at)
            self.records[self.at] = os.urandom(size)
            self.at += size
        blob = b"".join(self.records[o] for o in offsets)
        self.tail.add(i64(offsets), i64(sizes), blob)
        return offsets

    def ask(self, offsets: list[int]) -> bytes | None:
        return self.tail.lookup(i64(offsets), i64([len(self.records[o]) for o in offsets]))

    def truth(self, offsets: list[int]) -> bytes:
        return b"".join(self.records[o] for o in offsets)


def test_a_lookup_answers_the_records_in_the_order_asked_across_frames() -> None:
    log = Log(TailRecords(1 << 20))
    first = log.frame([10, 20, 30, 40])
    second = log.frame([5, 6], gap=100)  # an end-of-file blank between two frames
    for asked in (
        first,
        first[1:3],
        [first[3], second[0]],
        [second[1], first[0], first[2]],  # not ascending: several queues' ranges in one Read
        [first[0], first[2], second[1]],
    ):
        assert log.ask(asked) == log.truth(asked)


def test_any_range_not_held_makes_the_whole_lookup_a_miss() -> None:
    tail = TailRecords(1 << 20)
    log = Log(tail)
    offsets = log.frame([10, 20, 30])
    assert tail.lookup(i64([offsets[0], offsets[1] + 1]), i64([10, 19])) is None  # inside one
    assert tail.lookup(i64([offsets[0]]), i64([11])) is None  # another size
    assert tail.lookup(i64([offsets[2] + 30]), i64([5])) is None  # past the end
    assert tail.lookup(i64([]), i64([])) is None
    later = Log(TailRecords(1 << 20))
    later.at = 1000
    held = later.frame([10])
    assert later.tail.lookup(i64([0]), i64([10])) is None  # below every frame
    assert later.ask(held) == later.truth(held)


def test_the_oldest_frames_go_beyond_the_bound() -> None:
    tail = TailRecords(100, chunk_bytes_min=0)  # a chunk per frame
    log = Log(tail)
    old = log.frame([30, 30])
    middle = log.frame([30])
    assert tail.nbytes == 90 and tail.chunks == 2
    new = log.frame([40])
    assert tail.nbytes == 70 and tail.chunks == 2
    assert log.ask(old[:1]) is None
    assert log.ask(middle + new) == log.truth(middle + new)
    log.frame([101])  # larger than the whole bound: not held, the others stay
    assert log.ask(new) == log.truth(new)


def test_clear_and_a_moved_minimum_forget_what_they_must() -> None:
    tail = TailRecords(1 << 20, chunk_bytes_min=0)
    log = Log(tail)
    a = log.frame([10, 10])
    b = log.frame([10, 10])
    tail.drop_below(a[1])  # inside the first frame: its first record goes, the second stays
    assert log.ask(a[:1]) is None
    assert log.ask(a[1:] + b) == log.truth(a[1:] + b)
    tail.drop_below(b[0])
    assert tail.chunks == 1 and log.ask(a[1:]) is None
    tail.clear()
    assert tail.chunks == 0 and tail.nbytes == 0 and log.ask(b) is None
    c = log.frame([7])  # held again after a clear
    assert log.ask(c) == log.truth(c)


def test_a_frame_that_goes_back_replaces_what_was_held() -> None:
    tail = TailRecords(1 << 20, chunk_bytes_min=0)
    log = Log(tail)
    log.frame([10, 10, 10])
    log.at = 10  # the log lost its tail and was written again from 10
    again = log.frame([5, 5])
    assert tail.chunks == 1
    assert log.ask(again) == log.truth(again)
    assert tail.lookup(i64([0]), i64([10])) is None


def test_small_frames_merge_into_few_chunks_and_still_answer_each_record() -> None:
    tail = TailRecords(1 << 20, chunk_bytes_min=1_000)
    log = Log(tail)
    frames = [log.frame([30, 40, 50], gap=7 * (i % 2)) for i in range(60)]  # 7,200 bytes
    assert tail.chunks <= 8 and tail.nbytes == 60 * 120
    for asked in (frames[0], frames[59], frames[10][1:] + frames[11][:1], [frames[40][2]]):
        assert log.ask(asked) == log.truth(asked)
    # Merged chunks go whole when the bound needs it; the newest frame is always held.
    small = TailRecords(500, chunk_bytes_min=200)
    log = Log(small)
    for _ in range(30):
        newest = log.frame([60, 70])
        assert small.nbytes <= 500 and log.ask(newest) == log.truth(newest)


def test_malformed_frames_are_not_held_and_off_holds_nothing() -> None:
    tail = TailRecords(1 << 20)
    tail.add(i64([0, 10]), i64([10, 10]), b"x" * 19)  # records do not add up
    tail.add(i64([10, 0]), i64([10, 10]), b"x" * 20)  # offsets do not ascend
    assert tail.chunks == 0
    off = TailRecords(0)
    assert not off.enabled
    off.add(i64([0]), i64([3]), b"abc")
    assert off.chunks == 0 and off.lookup(i64([0]), i64([3])) is None


@settings(max_examples=150, deadline=None)
@given(
    frames=st.lists(
        st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(0, 30)),
        min_size=1,
        max_size=8,
    ),
    bound=st.integers(40, 600),
    picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    minimum=st.integers(0, 400),
    chunk_min=st.sampled_from([0, 50, 200]),
)
def test_a_lookup_is_the_truth_or_a_miss(
    frames: list[tuple[list[int], int]],
    bound: int,
    picks: list[int],
    minimum: int,
    chunk_min: int,
) -> None:
    """Whatever was held and dropped, a lookup answers exactly the records asked, or None; and
    a record in the newest frame (if it fits the bound and the minimum) is always answered."""
    tail = TailRecords(bound, chunk_bytes_min=chunk_min)
    log = Log(tail)
    for sizes, gap in frames:
        newest = log.frame(sizes, gap)
    tail.drop_below(minimum)
    every = sorted(log.records)
    asked = [every[p % len(every)] for p in picks]
    got = log.ask(asked)
    assert got is None or got == log.truth(asked)
    if sum(frames[-1][0]) <= bound and newest[0] >= minimum:
        assert log.ask(newest) == log.truth(newest)
