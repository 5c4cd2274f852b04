"""decide_pull walks each run of units with the compiled core (formats/_core_pull.pxi); here
it, and that walk on its own, are pinned to RocketMQ's walk unit by unit (kept below as the
reference) over random queues: blanks, sizes near the byte cap, negative sizes, tag filters,
files that end mid-window and units no file holds."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cq_svc.store import PullResult, PullStatus, UnitRun, decide_pull
from mqstore.formats import _core
from mqstore.formats.cq_unit import BLANK_SIZE, UNIT, Unit
from tests.cq.support import encode_units

_SCAN_CHUNK_MIN = 64


@dataclass
class ListSource:
    """A queue held in a list: units[i] is queue offset lo + i; offsets in `missing` are held
    by no file (scan answers None there)."""

    lo: int
    units: list[Unit]
    one_file_per_pull: bool
    units_per_file: int
    missing: frozenset[int] = frozenset()

    def bounds(self) -> tuple[int, int]:
        if not self.units and self.lo == 0:
            return 0, 0
        return self.lo, self.lo + len(self.units)

    def _scan(self, offset: int, max_units: int) -> list[Unit] | None:
        if offset in self.missing:
            return None
        out = []
        for u in self.units[offset - self.lo : offset - self.lo + max_units]:
            if u.queue_offset in self.missing:
                break
            out.append(u)
            if self.one_file_per_pull and (u.queue_offset + 1) % self.units_per_file == 0:
                break
        return out

    def scan(self, offset: int, max_units: int) -> UnitRun | None:
        units = self._scan(offset, max_units)
        if units is None:
            return None
        first = units[0].queue_offset if units else 0
        return UnitRun(
            first, encode_units((u.commit_log_offset, u.size, u.tags_code) for u in units)
        )

    def roll_next(self, offset: int) -> int:
        return offset + 1


def reference_pull(
    source: ListSource,
    offset: int,
    max_messages: int,
    max_bytes: int,
    tags_codes: frozenset[int],
    *,
    max_filter_bytes: int,
    pull_bytes_cap: int,
) -> tuple[PullResult, list[Unit]]:
    """RocketMQ's getMessage scan, one unit at a time."""
    lo, hi = source.bounds()
    if hi == 0:
        return PullResult(PullStatus.NO_MESSAGE_IN_QUEUE, 0, lo, hi), []
    if offset < lo:
        return PullResult(PullStatus.OFFSET_TOO_SMALL, lo, lo, hi), []
    if offset == hi:
        return PullResult(PullStatus.OFFSET_OVERFLOW_ONE, offset, lo, hi), []
    if offset > hi:
        return PullResult(PullStatus.OFFSET_OVERFLOW_BADLY, hi, lo, hi), []
    max_pull_bytes = min(max(max_bytes, 100), pull_bytes_cap)
    window = min(max(max_filter_bytes, max_messages * 20) // 20, hi - offset)
    chunk = max(2 * max_messages, _SCAN_CHUNK_MIN) if tags_codes else max_messages + 1
    result = PullResult(PullStatus.NO_MATCHED_MESSAGE, offset, lo, hi)
    taken: list[Unit] = []
    total = 0
    at = offset

    def found() -> tuple[PullResult, list[Unit]]:
        if taken:
            result.status = PullStatus.FOUND
        return result, taken

    while at < offset + window:
        units = source._scan(at, min(chunk, offset + window - at))
        if units is None:
            if at == offset:
                return PullResult(PullStatus.OFFSET_FOUND_NULL, offset + 1, lo, hi), []
            break
        if not units:
            break
        for u in units:
            if u.is_blank:
                result.next_begin_offset = u.queue_offset + 1
                continue
            if taken and (len(taken) + 1 > max_messages or total + u.size > max_pull_bytes):
                return found()
            if total >= max_pull_bytes:
                return found()
            result.next_begin_offset = u.queue_offset + 1
            if tags_codes and u.tags_code not in tags_codes:
                result.filtered += 1
                continue
            taken.append(u)
            total += u.size
        at = units[-1].queue_offset + 1
        if source.one_file_per_pull and at % source.units_per_file == 0:
            break
    return found()


# Each example draws a queue of up to 300 units (~60 ms an example): 150 in `make test`;
# MQSTORE_PULL_EXAMPLES=N runs more (400 was the suite's number until 2026-11-28).
PULL_EXAMPLES = int(os.environ.get("MQSTORE_PULL_EXAMPLES", "150"))


@st.composite
def queues(draw: st.DrawFn, blanks: bool = True) -> tuple[ListSource, int]:
    lo = draw(st.integers(0, 40))
    n = draw(st.integers(0, 300))
    units = []
    phy = 1_000
    for i in range(n):
        if blanks and draw(st.integers(0, 9)) == 0:
            units.append(Unit(lo + i, 0, BLANK_SIZE, 0))
            continue
        size = draw(st.sampled_from([1, 60, 100, 250, 1_000, 4_000]))
        units.append(Unit(lo + i, phy, size, draw(st.integers(0, 4))))
        phy += size
    missing = frozenset(draw(st.lists(st.integers(lo, lo + max(n, 1)), max_size=2)) if n else [])
    source = ListSource(
        lo,
        units,
        one_file_per_pull=draw(st.booleans()),
        units_per_file=draw(st.sampled_from([7, 50, 1_000])),
        missing=missing,
    )
    offset = draw(st.integers(max(0, lo - 2), lo + n + 2))
    return source, offset


def pulls(*, plain: bool) -> st.SearchStrategy[tuple[object, ...]]:
    """decide_pull's arguments and limits; `plain`: a queue without blanks and no tag filter
    (the usual pull)."""
    return st.tuples(
        queues(blanks=not plain),
        st.integers(0, 80),  # 0: not what the service asks (it means "the default"), still exact
        st.sampled_from([0, 100, 500, 3_000, 20_000, 1 << 20]),
        st.just(frozenset()) if plain else st.frozensets(st.integers(0, 4), max_size=3),
        st.sampled_from([0, 400, 4_000]),
        st.sampled_from([250, 5_000, 1 << 20]),
    )


@settings(max_examples=PULL_EXAMPLES, deadline=None)
@given(pulls(plain=True))
def test_a_walk_without_blanks_or_filter_decides_as_rocketmq_unit_by_unit(
    pull: tuple[object, ...],
) -> None:
    """The usual pull: nothing to step over, every unit taken until the batch is full."""
    _decides_as_rocketmq(*pull)  # type: ignore[arg-type]


@settings(max_examples=PULL_EXAMPLES, deadline=None)
@given(pulls(plain=False))
def test_a_walk_with_blanks_and_filters_decides_as_rocketmq_unit_by_unit(
    pull: tuple[object, ...],
) -> None:
    _decides_as_rocketmq(*pull)  # type: ignore[arg-type]


def _decides_as_rocketmq(
    queue: tuple[ListSource, int],
    max_messages: int,
    max_bytes: int,
    tags: frozenset[int],
    max_filter_bytes: int,
    pull_bytes_cap: int,
) -> None:
    source, offset = queue
    limits = {"max_filter_bytes": max_filter_bytes, "pull_bytes_cap": pull_bytes_cap}
    got = decide_pull(source, offset, max_messages, max_bytes, tags, **limits)
    want, want_units = reference_pull(source, offset, max_messages, max_bytes, tags, **limits)
    assert (got.status, got.next_begin_offset, got.min_offset, got.max_offset) == (
        want.status,
        want.next_begin_offset,
        want.min_offset,
        want.max_offset,
    )
    assert got.filtered == want.filtered
    assert got.units == [
        Unit(u.queue_offset, u.commit_log_offset, u.size, u.tags_code) for u in want_units
    ]


def test_a_full_batch_stops_at_the_count_and_at_the_byte_cap() -> None:
    units = [Unit(i, 100 * i, 100, 1) for i in range(10)]
    source = ListSource(0, units, one_file_per_pull=False, units_per_file=1_000)
    by_count = decide_pull(source, 2, 3, 1 << 20, (), max_filter_bytes=0, pull_bytes_cap=1 << 20)
    assert [u.queue_offset for u in by_count.units] == [2, 3, 4]
    assert by_count.next_begin_offset == 5
    by_bytes = decide_pull(source, 0, 32, 250, (), max_filter_bytes=0, pull_bytes_cap=1 << 20)
    assert [u.queue_offset for u in by_bytes.units] == [0, 1]
    assert by_bytes.next_begin_offset == 2


def reference_walk(
    units: list[Unit],
    wanted: frozenset[int],
    count: int,
    total: int,
    max_messages: int,
    max_pull_bytes: int,
) -> tuple[int, list[Unit], int, int]:
    """reference_pull's walk over one run: (stop, taken, filtered, total after)."""
    taken: list[Unit] = []
    filtered = 0
    for i, u in enumerate(units):
        if u.is_blank:
            continue
        if count and (count + 1 > max_messages or total + u.size > max_pull_bytes):
            return i, taken, filtered, total
        if total >= max_pull_bytes:
            return i, taken, filtered, total
        if wanted and u.tags_code not in wanted:
            filtered += 1
            continue
        taken.append(u)
        count += 1
        total += u.size
    return len(units), taken, filtered, total


_I64 = st.integers(-(1 << 63), (1 << 63) - 1)
_UNITS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 1, 5_000, 1 << 62, -1]),  # phy (0 with BLANK_SIZE: a blank)
        st.sampled_from([BLANK_SIZE, BLANK_SIZE, -(1 << 31), -7, 0, 1, 60, 1_000, 4_000]),
        st.one_of(st.integers(-2, 4), _I64),
    ),
    max_size=120,
)


@settings(max_examples=PULL_EXAMPLES, deadline=None)
@given(
    first=st.integers(0, 1 << 40),
    raw_units=_UNITS,
    wanted=st.frozensets(st.one_of(st.integers(-2, 4), _I64), max_size=4),
    stride=st.sampled_from([20, 28, 33]),
    count=st.integers(0, 6),
    total=st.integers(-5_000, 6_000),
    max_messages=st.integers(0, 40),
    max_pull_bytes=st.sampled_from([0, 100, 2_500, 60_000, 1 << 40]),
)
def test_the_compiled_walk_over_one_run_is_rocketmqs_unit_by_unit(
    first: int,
    raw_units: list[tuple[int, int, int]],
    wanted: frozenset[int],
    stride: int,
    count: int,
    total: int,
    max_messages: int,
    max_pull_bytes: int,
) -> None:
    """Blanks, non-blanks of the blank's size, negative and zero sizes, any tags code, a batch
    already part full or past its cap, and units stored with trailing bytes (rocks: 28)."""
    units = [Unit(first + i, phy, size, tags) for i, (phy, size, tags) in enumerate(raw_units)]
    pad = b"\xa5" * (stride - UNIT.size)
    data = b"".join(UNIT.pack(phy, size, tags) + pad for phy, size, tags in raw_units)
    out = np.full((4, len(units)), -9, dtype=np.int64)
    codes = np.array(sorted(wanted), dtype=np.int64)
    stop, taken, filtered, after = _core.pull_walk(
        data, stride, first, codes, count, total, max_messages, max_pull_bytes, out
    )
    want_stop, want_taken, want_filtered, want_after = reference_walk(
        units, wanted, count, total, max_messages, max_pull_bytes
    )
    assert (stop, taken, filtered, after) == (
        want_stop,
        len(want_taken),
        want_filtered,
        want_after,
    )
    got = [Unit(*row) for row in out[:, :taken].T.tolist()]
    assert got == want_taken


def test_the_compiled_walk_refuses_a_short_stride_or_out_buffer() -> None:
    data = UNIT.pack(1, 10, 0) * 3
    none = np.zeros(0, dtype=np.int64)
    with pytest.raises(ValueError, match="stride"):
        _core.pull_walk(data, 8, 0, none, 0, 0, 32, 1 << 20, np.empty((4, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="out buffer"):
        _core.pull_walk(data, 20, 0, none, 0, 0, 32, 1 << 20, np.empty((4, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="whole entries"):
        _core.pull_walk(data[:-1], 20, 0, none, 0, 0, 32, 1 << 20, np.empty((4, 3), dtype=np.int64))
