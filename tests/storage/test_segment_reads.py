"""mqstore.storage.segment_reads: copy_runs, and LiveLog reading a commit-log directory another
process writes. LiveLog only copies bytes (the caller checks records), so the segments here hold
random bytes; what matters is which bytes come back, and when nothing does."""

from __future__ import annotations

import bisect
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.formats import _core
from mqstore.formats.commitlog_checkpoint import StoreMeta, encode_meta
from mqstore.storage.segment_reads import LiveLog, copy_runs

SEGMENT_BYTES = 4096
STORE_ID = b"S" * 16


def _arr(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _write_segment(root: Path, start: int, data: bytes) -> Path:
    seg_dir = root / "commitlog"
    seg_dir.mkdir(parents=True, exist_ok=True)
    path = seg_dir / f"{start:020d}"
    path.write_bytes(data)
    return path


@pytest.fixture
def log_dir(tmp_path: Path) -> tuple[Path, bytes]:
    """Three full segments of random bytes; the stream they make, offset = index."""
    stream = os.urandom(3 * SEGMENT_BYTES)
    for k in range(3):
        _write_segment(
            tmp_path, k * SEGMENT_BYTES, stream[k * SEGMENT_BYTES : (k + 1) * SEGMENT_BYTES]
        )
    (tmp_path / "store.meta").write_bytes(encode_meta(StoreMeta(STORE_ID, 1, SEGMENT_BYTES)))
    return tmp_path, stream


@given(
    data=st.binary(min_size=64, max_size=512),
    cuts=st.lists(st.integers(0, 511), min_size=2, max_size=30),
)
@settings(max_examples=200, deadline=None)
def test_copy_runs_is_each_range_in_turn(data: bytes, cuts: list[int]) -> None:
    points = sorted({c % len(data) for c in cuts})
    if len(points) < 2:
        return
    begin = _arr(points[:-1])
    end = _arr(points[1:])
    # Drop every third range so that some runs break.
    keep = np.arange(len(begin)) % 3 != 2
    begin, end = begin[keep], end[keep]
    if not len(begin):
        return
    pieces = copy_runs(data, begin, end)
    assert b"".join(pieces) == b"".join(data[b:e] for b, e in zip(begin, end, strict=True))
    breaks = int((begin[1:] != end[:-1]).sum())
    assert len(pieces) == breaks + 1


def test_reads_ranges_in_any_order_across_segments(log_dir: tuple[Path, bytes]) -> None:
    root, stream = log_dir
    live = LiveLog(str(root))
    offsets = [2 * SEGMENT_BYTES + 10, 100, 150, SEGMENT_BYTES + 5, 0, 2 * SEGMENT_BYTES + 40]
    sizes = [30, 50, 20, 4000, 100, 8]
    got = live.read(_arr(offsets), _arr(sizes))
    assert got == b"".join(stream[o : o + z] for o, z in zip(offsets, sizes, strict=True))
    assert live.store_id() == STORE_ID


def test_a_range_crossing_a_segment_end_or_outside_the_files_is_not_answered(
    log_dir: tuple[Path, bytes],
) -> None:
    root, _ = log_dir
    live = LiveLog(str(root))
    assert live.read(_arr([SEGMENT_BYTES - 10]), _arr([20])) is None
    assert live.read(_arr([3 * SEGMENT_BYTES]), _arr([10])) is None
    assert live.read(_arr([0, 3 * SEGMENT_BYTES + 1]), _arr([10, 10])) is None  # all or nothing
    assert live.read(_arr([0]), _arr([0])) is None
    assert live.read(_arr([]), _arr([])) is None


def test_a_new_segment_is_found_and_a_short_one_never_mapped(log_dir: tuple[Path, bytes]) -> None:
    root, stream = log_dir
    live = LiveLog(str(root))
    assert live.read(_arr([0]), _arr([10])) == stream[:10]
    newest = os.urandom(SEGMENT_BYTES)
    _write_segment(root, 3 * SEGMENT_BYTES, newest)
    assert live.read(_arr([3 * SEGMENT_BYTES + 7]), _arr([9])) == newest[7:16]
    # A file still being preallocated (shorter than the distance to the next start): not read.
    _write_segment(root, 4 * SEGMENT_BYTES, b"x" * 100)
    _write_segment(root, 5 * SEGMENT_BYTES, os.urandom(SEGMENT_BYTES))
    assert live.read(_arr([4 * SEGMENT_BYTES]), _arr([10])) is None
    assert live.read(_arr([5 * SEGMENT_BYTES]), _arr([10])) is not None


def test_a_deleted_or_replaced_segment_is_never_read_from_its_old_mapping(
    log_dir: tuple[Path, bytes],
) -> None:
    root, stream = log_dir
    live = LiveLog(str(root))
    at = SEGMENT_BYTES + 100
    assert live.read(_arr([at]), _arr([50])) == stream[at : at + 50]
    path = root / "commitlog" / f"{SEGMENT_BYTES:020d}"
    path.unlink()
    assert live.read(_arr([at]), _arr([50])) is None
    replacement = os.urandom(SEGMENT_BYTES)
    _write_segment(root, SEGMENT_BYTES, replacement)  # a new inode under the same name
    assert live.read(_arr([at]), _arr([50])) == replacement[100:150]


def test_below_the_minimum_nothing_is_answered(log_dir: tuple[Path, bytes]) -> None:
    root, stream = log_dir
    live = LiveLog(str(root))
    assert live.read(_arr([10, SEGMENT_BYTES + 10]), _arr([5, 5])) is not None
    assert live.mapped == 2
    live.drop_below(SEGMENT_BYTES)
    assert live.mapped == 1
    assert live.read(_arr([10]), _arr([5])) is None
    assert (
        live.read(_arr([SEGMENT_BYTES + 10]), _arr([5]))
        == stream[SEGMENT_BYTES + 10 : SEGMENT_BYTES + 15]
    )
    live.forget(0)  # a handshake: everything again from the files
    assert live.mapped == 0
    assert live.read(_arr([10]), _arr([5])) == stream[10:15]


def test_mappings_are_bounded(log_dir: tuple[Path, bytes]) -> None:
    root, stream = log_dir
    live = LiveLog(str(root), maps_max=2)
    for k in (0, 1, 2, 0):
        at = k * SEGMENT_BYTES + 1
        assert live.read(_arr([at]), _arr([3])) == stream[at : at + 3]
        assert live.mapped <= 2


def test_no_store_meta_or_no_directory(tmp_path: Path) -> None:
    live = LiveLog(str(tmp_path / "absent"))
    assert live.store_id() is None
    assert live.read(_arr([0]), _arr([1])) is None
    (tmp_path / "store.meta").write_bytes(b"not a meta file")
    assert LiveLog(str(tmp_path)).store_id() is None


def test_a_newest_segment_that_grew_since_it_was_mapped_is_mapped_again(tmp_path: Path) -> None:
    """A file system where preallocation fills the file in steps: the newest segment is listed
    and mapped short, then reaches its size; reads past the old end get the whole range."""
    grown = os.urandom(2 * SEGMENT_BYTES)
    path = _write_segment(tmp_path, 0, grown[:SEGMENT_BYTES])
    live = LiveLog(str(tmp_path))
    assert live.read(_arr([10]), _arr([100])) == grown[10:110]
    with open(path, "ab") as f:
        f.write(grown[SEGMENT_BYTES:])
    at = SEGMENT_BYTES - 50
    assert live.read(_arr([at, SEGMENT_BYTES + 10]), _arr([100, 400])) == (
        grown[at : at + 100] + grown[SEGMENT_BYTES + 10 : SEGMENT_BYTES + 410]
    )


def test_a_mapping_made_while_the_minimum_moves_past_it_is_not_kept(
    log_dir: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = log_dir
    live = LiveLog(str(root))
    real_mmap = mmap.mmap

    def racing_mmap(*args: object, **kwargs: object) -> mmap.mmap:
        live.drop_below(SEGMENT_BYTES)  # retention moved on between the checks and the map
        return real_mmap(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("mqstore.storage.segment_reads.mmap.mmap", racing_mmap)
    live.read(_arr([10]), _arr([5]))
    assert live.mapped == 0


@given(
    segment=st.integers(0, 2),
    at=st.integers(0, SEGMENT_BYTES - 1),
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=12),
    gap_after=st.integers(-1, 11),
)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_ranges_one_after_another_read_as_what_they_hold(
    log_dir: tuple[Path, bytes], segment: int, at: int, lengths: list[int], gap_after: int
) -> None:
    """The usual pull: records that follow each other in one segment (read as one slice),
    and the same with a gap after one of them (read range by range), or running on into the
    next segment; a range across a segment's end is not answered."""
    root, stream = log_dir
    live = LiveLog(str(root))
    offsets, position = [], segment * SEGMENT_BYTES + at
    for i, length in enumerate(lengths):
        offsets.append(position)
        position += length + (7 if i == gap_after else 0)
    got = live.read(_arr(offsets), _arr(lengths))
    pairs = list(zip(offsets, lengths, strict=True))
    if any((o + z - 1) // SEGMENT_BYTES != o // SEGMENT_BYTES for o, z in pairs) or (
        offsets[-1] + lengths[-1] > 3 * SEGMENT_BYTES
    ):
        assert got is None  # a range across a segment's end, or past the log's
    else:
        assert got == b"".join(stream[o : o + z] for o, z in zip(offsets, lengths, strict=True))


def _segment_runs_reference(
    offsets: list[int], sizes: list[int], starts: list[int]
) -> tuple[list[int], list[int], list[int]] | None:
    """_core.segment_runs range by range: each range's segment (the last start at or before
    it), None unless every size is positive and every range lies whole in a listed segment;
    a range that starts where the one before ended in the same segment extends its run."""
    runs: list[list[int]] = []
    previous: tuple[int, int] | None = None  # the range before: its segment and end
    for offset, size in zip(offsets, sizes, strict=True):
        if size <= 0:
            return None
        k = bisect.bisect_right(starts, offset) - 1
        if k < 0 or k >= len(starts) - 1 or offset + size > starts[k + 1]:
            return None
        if previous == (k, offset):
            runs[-1][2] = offset + size - starts[k]
        else:
            runs.append([k, offset - starts[k], offset + size - starts[k]])
        previous = (k, offset + size)
    return [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]


@given(
    starts=st.lists(st.integers(0, 400), min_size=1, max_size=6, unique=True).map(sorted),
    ranges=st.lists(st.tuples(st.integers(-20, 450), st.integers(-2, 60)), max_size=40),
    runs_of=st.integers(1, 5),
)
@settings(max_examples=500, deadline=None)
def test_segment_runs_is_the_walk_range_by_range(
    starts: list[int], ranges: list[tuple[int, int]], runs_of: int
) -> None:
    # Runs: every range but each runs_of-th one starts where the one before ended.
    offsets: list[int] = []
    sizes: list[int] = []
    for i, (drawn, size) in enumerate(ranges):
        offsets.append(offsets[-1] + sizes[-1] if offsets and i % runs_of else drawn)
        sizes.append(size)
    got = _core.segment_runs(_arr(offsets), _arr(sizes), _arr(starts))
    assert got == _segment_runs_reference(offsets, sizes, starts)


def test_segment_runs_refuses_columns_of_two_lengths() -> None:
    with pytest.raises(ValueError):
        _core.segment_runs(_arr([0, 1]), _arr([1]), _arr([0, 10]))
