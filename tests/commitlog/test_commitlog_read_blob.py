"""CommitLog.read_blob: the answers of lone reads, laid end to end, for any mix of ranges.

Every range gets what reading it alone gives: its bytes when they are one whole record that
passes read_record's checks as read from that offset (then they stand in the blob, in request
order, with their size in `served`), else InvalidArgument (size not positive), OutOfRange
(below the minimum, at or past the end, past a segment's readable data) or CorruptRecord. The
model reads each range with CommitLog.read (MappedFile.read, not read_blob's slices) and judges
it with read_record. read_many, cut from the same answer, must agree with it.

The store is on a SimDisk (its maps are bytearrays) with 4 KiB segments: about 18 records a
segment, so runs cross segment boundaries; the first two segments are expired away so that
there are offsets below the minimum; a few records are damaged in place (body, PHYSICALOFFSET,
TOTALSIZE) and a few have topics over 127 characters (V2 magic, which the column checks leave
to read_record).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from commitlog_testlib import (
    HEADER_FIELDS,
    Stored,
    append_each,
    config_for,
    message,
    open_log,
    read_at,
    read_many,
    sim_write_at,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from mqstore.errors import CorruptRecord, DataLoss, InvalidArgument, MqstoreError, OutOfRange
from mqstore.formats.record import Record, read_record
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.commitlog.message_in import MessageIn

FILE = 4096
RESERVED_MS = 72 * 3_600_000
LONG_TOPIC = "%RETRY%" + "r" * 125  # over 127 characters: a V2 record


@dataclass(frozen=True)
class Store:
    log: CommitLog
    disk: SimDisk
    expired: list[Stored]  # below the minimum now
    kept: list[Stored]  # in order of offset
    damaged: frozenset[int]  # offsets of records damaged in place


def _message(i: int) -> MessageIn:
    body_bytes = (1, 40, 100, 260)[i % 4]
    return message(i, body_bytes=body_bytes, topic=LONG_TOPIC if i % 11 == 5 else "TopicTest")


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    """Built once for the module (the tests only read it); closed by hand, not through
    commitlog_testlib.OPENED, which conftest empties after every test."""
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    config = config_for("/store", flush=FlushMode.SYNC, delete_when_hours=())
    log = CommitLog(config, disk=disk, clock=clock)
    log.open()
    try:
        old = append_each(log, [_message(i) for i in range(40)])  # segments 0 and 1 full
        clock.advance(RESERVED_MS + 1)
        new = append_each(log, [_message(i) for i in range(40, 120)])
        assert log.clean_expired(manual=True).deleted_files >= 2
        expired = [s for s in old + new if s.offset < log.min_offset]
        kept = [s for s in old + new if s.offset >= log.min_offset]
        assert expired and len({s.offset // FILE for s in kept}) >= 4
        damaged = {}
        for k, (field, bit) in enumerate([("BODY", 1), ("PHYSICALOFFSET", 0), ("TOTALSIZE", 2)]):
            victim = kept[7 + 19 * k]
            at = victim.offset + (90 if field == "BODY" else HEADER_FIELDS[field][0] + 3)
            (byte,) = _read_live(disk, log, at, 1)
            sim_write_at(disk, log.config, at, bytes([byte ^ (1 << bit)]))
            damaged[victim.offset] = field
        yield Store(log, disk, expired, kept, frozenset(damaged))
    finally:
        log.close()


def _read_live(disk: SimDisk, log: CommitLog, offset: int, nbytes: int) -> bytes:
    mf = log.queue.find_mapped_file_by_offset(offset)
    assert mf is not None
    pos = offset - mf.file_from_offset
    return bytes(mf.buf[pos : pos + nbytes])


def lone_read(log: CommitLog, offset: int, size: int) -> bytes | type[MqstoreError]:
    """What reading (offset, size) alone gives: the model read_blob must match."""
    if size <= 0:
        return InvalidArgument
    try:
        raw = log.read(offset, size)
    except OutOfRange:
        return OutOfRange
    found = read_record(raw, 0, size, check_crc=True, expected_offset=offset)
    return raw if isinstance(found, Record) and found.total_size == size else CorruptRecord


def ranges_of(store: Store) -> st.SearchStrategy[list[tuple[int, int]]]:
    """Mixes of ranges: runs of neighbours (across segment boundaries too), lone records, and
    every kind of bad range, in any order."""
    kept, expired, log = store.kept, store.expired, store.log
    index = st.integers(0, len(kept) - 1)

    def run(start: int, length: int) -> list[tuple[int, int]]:
        return [(s.offset, s.size) for s in kept[start : start + length]]

    def shifted(i: int, delta: int) -> list[tuple[int, int]]:
        return [(kept[i].offset + delta, kept[i].size)]

    def resized(i: int, delta: int) -> list[tuple[int, int]]:
        return [(kept[i].offset, kept[i].size + delta)]

    piece = st.one_of(
        st.builds(run, index, st.integers(1, 40)),
        st.builds(run, index, st.just(1)),
        st.builds(shifted, index, st.integers(1, 200)),  # not where a record starts
        st.builds(resized, index, st.integers(-100, 300).filter(bool)),  # wrong size
        st.builds(lambda i: [(kept[i].offset, 0)], index),
        st.builds(lambda i: [(kept[i].offset, -1)], index),
        st.sampled_from([[(s.offset, s.size)] for s in expired]),  # below the minimum
        st.builds(lambda k: [(log.max_offset + k, 100)], st.integers(0, 3 * FILE)),
        st.builds(lambda k: [(-k, 100)], st.integers(1, 10)),
    )
    return st.lists(piece, max_size=12).map(lambda pieces: [r for p in pieces for r in p])


def assert_matches_lone_reads(log: CommitLog, ranges: list[tuple[int, int]]) -> None:
    offsets, sizes = [o for o, _ in ranges], [z for _, z in ranges]
    expected = [lone_read(log, o, z) for o, z in ranges]
    blob, served, errors = log.read_blob(offsets, sizes)
    assert blob == b"".join(e for e in expected if isinstance(e, bytes))
    assert served.tolist() == [len(e) if isinstance(e, bytes) else 0 for e in expected]
    assert {i: type(e) for i, e in errors.items()} == {
        i: e for i, e in enumerate(expected) if not isinstance(e, bytes)
    }
    many = read_many(log, ranges)
    assert [m if isinstance(m, bytes) else type(m) for m in many] == expected


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_mix_of_ranges_gets_the_answers_of_lone_reads(
    store: Store, data: st.DataObject
) -> None:
    assert_matches_lone_reads(store.log, data.draw(ranges_of(store)))


def test_every_record_at_once_serves_all_but_the_damaged(store: Store) -> None:
    ranges = [(s.offset, s.size) for s in store.kept]
    blob, served, errors = store.log.read_blob([o for o, _ in ranges], [z for _, z in ranges])
    assert {store.kept[i].offset for i in errors} == store.damaged
    assert all(isinstance(e, CorruptRecord) for e in errors.values())
    good = [s for s in store.kept if s.offset not in store.damaged]
    assert blob == b"".join(store.log.read(s.offset, s.size) for s in good)
    assert served.tolist() == [0 if s.offset in store.damaged else s.size for s in store.kept]
    assert_matches_lone_reads(store.log, ranges)


@pytest.mark.parametrize("count", [1, 2, 8])
def test_a_damaged_record_is_cut_out_alone_or_among_others(store: Store, count: int) -> None:
    """The damaged record first of one range, or of several: it is not in the blob."""
    first = next(i for i, s in enumerate(store.kept) if s.offset in store.damaged)
    ranges = [(s.offset, s.size) for s in store.kept[first : first + count]]
    _, served, errors = store.log.read_blob([o for o, _ in ranges], [z for _, z in ranges])
    assert list(errors) == [0] and served[0] == 0
    assert_matches_lone_reads(store.log, ranges)


def test_no_ranges_is_an_empty_answer(store: Store) -> None:
    blob, served, errors = store.log.read_blob([], [])
    assert (blob, served.tolist(), errors) == (b"", [], {})
    assert read_many(store.log, []) == []


def test_a_segment_deleted_under_the_read_is_data_loss_for_its_ranges(tmp_path: Path) -> None:
    """A segment that can no longer be held (retention shut it down) answers DataLoss for each
    range in it; ranges in other segments are served."""
    log = open_log(tmp_path / "store", flush=FlushMode.SYNC)
    stored = append_each(log, [message(i) for i in range(40)])
    gone = log.queue.find_mapped_file_by_offset(stored[0].offset)
    assert gone is not None
    in_gone = [s for s in stored if gone.file_from_offset <= s.offset < gone.file_end_offset]
    others = [s for s in stored if s.offset >= gone.file_end_offset]
    assert in_gone and others
    original = read_at(log.config, others[0].offset, others[0].size)
    gone.shutdown()
    ranges = [(others[0].offset, others[0].size), *((s.offset, s.size) for s in in_gone)]
    blob, served, errors = log.read_blob([o for o, _ in ranges], [z for _, z in ranges])
    assert blob == original
    assert served.tolist() == [others[0].size] + [0] * len(in_gone)
    assert sorted(errors) == list(range(1, len(ranges)))
    assert all(isinstance(e, DataLoss) for e in errors.values())
