"""The reader behind `mqstore log`: one test per row of logreader.py's table, in process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mqstore.formats.record import encode_blank
from mqstore.storage.logreader import (
    BadEntry,
    BlankEntry,
    Entry,
    LogDir,
    LogDirError,
    RecordEntry,
    list_segments,
)

from .segments import Msg, Placed, build_rocketmq_style, segment_name, tree_digest

FILE = 1024


def messages(n: int) -> list[Msg]:
    return [
        Msg(f"T{i % 2}", i % 3, f"body-{i}-".encode() * 20, {"KEYS": f"k{i}"}) for i in range(n)
    ]


def build(tmp_path: Path, n: int = 9, spare_files: int = 0) -> tuple[Path, list[Placed]]:
    directory = tmp_path / "log"
    placed = build_rocketmq_style(directory, FILE, messages(n), spare_files=spare_files)
    return directory, placed


def patch(directory: Path, offset: int, data: bytes) -> None:
    start = offset - offset % FILE
    path = directory / segment_name(start)
    raw = bytearray(path.read_bytes())
    raw[offset - start : offset - start + len(data)] = data
    path.write_bytes(bytes(raw))


def offsets(entries: Sequence[Entry]) -> list[int]:
    return [e.offset for e in entries if isinstance(e, RecordEntry)]


def scan(directory: Path, from_offset: int | None = None) -> list[Entry]:
    return list(LogDir(str(directory)).scan(from_offset))


def test_the_fixture_spans_files_with_blanks(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    assert len(list(directory.iterdir())) >= 3
    entries = scan(directory)
    assert offsets(entries) == [p.offset for p in placed]
    blanks = [e for e in entries if isinstance(e, BlankEntry)]
    assert len(blanks) == len(list(directory.iterdir())) - 1
    assert all((b.offset + b.total_size) % FILE == 0 for b in blanks)
    assert not any(isinstance(e, BadEntry) for e in entries)


def test_records_come_back_whole(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    records = [e.record for e in scan(directory) if isinstance(e, RecordEntry)]
    assert [r.body for r in records] == [p.msg.body for p in placed]
    assert [r.properties_dict() for r in records] == [p.msg.properties for p in placed]


def test_all_zero_spare_files_after_the_data_are_a_clean_end(tmp_path: Path) -> None:
    directory, placed = build(tmp_path, spare_files=2)
    entries = scan(directory)
    assert offsets(entries) == [p.offset for p in placed]
    assert not any(isinstance(e, BadEntry) for e in entries)


def test_a_bad_record_with_valid_records_after_it_resumes_at_the_next(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    patch(directory, placed[1].offset + 4, b"\x00\x00\x00\x00")  # its magic code
    entries = scan(directory)
    bad = [e for e in entries if isinstance(e, BadEntry)]
    assert len(bad) == 1
    assert bad[0].offset == placed[1].offset and bad[0].next_offset == placed[2].offset
    assert "magic" in bad[0].reason
    assert offsets(entries) == [p.offset for i, p in enumerate(placed) if i != 1]


def test_consecutive_bad_records_are_one_bad_range(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    assert placed[2].offset < FILE, "the three records must share the first file"
    patch(directory, placed[0].offset + 100, b"\xff")
    patch(directory, placed[1].offset + 100, b"\xff")
    bad = [e for e in scan(directory) if isinstance(e, BadEntry)]
    assert [(b.offset, b.next_offset) for b in bad] == [(placed[0].offset, placed[2].offset)]


def test_a_bad_last_record_of_a_file_resumes_in_the_next_file(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    last_in_first = max((p for p in placed if p.offset < FILE), key=lambda p: p.offset)
    patch(directory, last_in_first.offset + 100, b"\xff")
    bad = [e for e in scan(directory) if isinstance(e, BadEntry)]
    assert len(bad) == 1
    assert bad[0].offset == last_in_first.offset and bad[0].next_offset == FILE


def test_a_torn_tail_is_bad_with_nothing_after_it(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    last = placed[-1]
    patch(directory, last.offset + last.size - 10, bytes(10))  # the tail never written
    entries = scan(directory)
    assert isinstance(entries[-1], BadEntry)
    assert entries[-1].offset == last.offset and entries[-1].next_offset is None
    assert "nothing valid follows" in entries[-1].reason
    assert offsets(entries) == [p.offset for p in placed[:-1]]


def test_garbage_after_the_last_record_is_a_bad_tail(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    end = placed[-1].offset + placed[-1].size
    patch(directory, end + 30, b"stale bytes from before a truncation")
    entries = scan(directory)
    assert isinstance(entries[-1], BadEntry)
    assert entries[-1].offset == end and entries[-1].next_offset is None


def test_a_shifted_copy_of_a_record_after_the_end_is_not_read_as_a_record(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    last = placed[-1]
    end = last.offset + last.size
    copy = last.msg.encode(last.offset)  # valid bytes, but their offset field says elsewhere
    patch(directory, end, copy)
    entries = scan(directory)
    assert offsets(entries) == [p.offset for p in placed]
    assert isinstance(entries[-1], BadEntry) and entries[-1].offset == end
    assert entries[-1].record is not None  # what was there is shown, and refused


def test_a_zeroed_file_tail_with_records_in_later_files_is_bad(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    in_first = [p for p in placed if p.offset < FILE]
    # The last record and the blank of the first file are lost to zeros.
    patch(directory, in_first[-1].offset, bytes(FILE - in_first[-1].offset))
    bad = [e for e in scan(directory) if isinstance(e, BadEntry)]
    assert [(b.offset, b.next_offset) for b in bad] == [(in_first[-1].offset, FILE)]
    assert "zeroed" in bad[0].reason


def test_a_zeroed_file_tail_then_files_of_garbage_is_bad(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    last_file = max(p.offset for p in placed) // FILE * FILE
    (directory / segment_name(last_file + FILE)).write_bytes(b"\x17" * FILE)
    entries = scan(directory)
    assert isinstance(entries[-1], BadEntry) and entries[-1].next_offset is None
    assert entries[-1].offset == placed[-1].offset + placed[-1].size


def test_a_blank_whose_size_is_not_the_rest_of_the_file_is_bad(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    in_first = [p for p in placed if p.offset < FILE]
    blank_at = in_first[-1].offset + in_first[-1].size
    patch(directory, blank_at, encode_blank(FILE - blank_at - 1))
    entries = scan(directory)
    bad = [e for e in entries if isinstance(e, BadEntry)]
    assert [(b.offset, b.next_offset) for b in bad] == [(blank_at, FILE)]
    assert offsets(entries) == [p.offset for p in placed]


def test_a_missing_segment_file_is_a_bad_range_between_its_neighbours(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    assert len(list(directory.iterdir())) >= 3
    (directory / segment_name(FILE)).unlink()
    entries = scan(directory)
    bad = [e for e in entries if isinstance(e, BadEntry)]
    assert [(b.offset, b.next_offset) for b in bad] == [(FILE, 2 * FILE)]
    assert "no segment file" in bad[0].reason
    assert offsets(entries) == [p.offset for p in placed if not FILE <= p.offset < 2 * FILE]


def test_leading_files_deleted_by_retention_are_no_gap(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    (directory / segment_name(0)).unlink()
    entries = scan(directory)
    assert not any(isinstance(e, BadEntry) for e in entries)
    assert offsets(entries) == [p.offset for p in placed if p.offset >= FILE]
    assert LogDir(str(directory)).min_offset == FILE


def test_scan_from_an_offset(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    assert offsets(scan(directory, placed[4].offset)) == [p.offset for p in placed[4:]]
    assert offsets(scan(directory, 0)) == [p.offset for p in placed]
    assert scan(directory, 100 * FILE) == []


def test_scan_from_below_the_first_file_starts_at_it(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    (directory / segment_name(0)).unlink()
    assert offsets(scan(directory, 5)) == [p.offset for p in placed if p.offset >= FILE]


def test_scan_from_a_gap_starts_at_the_next_file(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    (directory / segment_name(FILE)).unlink()
    entries = scan(directory, FILE + 10)
    assert not any(isinstance(e, BadEntry) for e in entries)
    assert offsets(entries) == [p.offset for p in placed if p.offset >= 2 * FILE]


def test_the_segment_size_comes_from_the_files(tmp_path: Path) -> None:
    directory, _ = build(tmp_path)
    log = LogDir(str(directory))
    assert log.file_bytes == FILE


def test_a_zero_length_last_file_is_skipped_as_rocketmq_skips_it(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    (directory / segment_name(10 * FILE)).write_bytes(b"")
    assert offsets(scan(directory)) == [p.offset for p in placed]


def test_other_files_and_directories_are_ignored(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    (directory / "README").write_text("x")
    (directory / "0000000000000000000x").write_text("x")
    (directory / segment_name(50 * FILE)).mkdir()
    assert offsets(scan(directory)) == [p.offset for p in placed]


def test_mixed_file_sizes_are_refused(tmp_path: Path) -> None:
    directory, _ = build(tmp_path)
    with (directory / segment_name(0)).open("ab") as f:
        f.write(b"\x00")
    with pytest.raises(LogDirError, match="differ in size"):
        list_segments(str(directory))


def test_overlapping_segment_names_are_refused(tmp_path: Path) -> None:
    directory, _ = build(tmp_path)
    (directory / segment_name(FILE + 512)).write_bytes(bytes(FILE))
    with pytest.raises(LogDirError, match="starts inside"):
        list_segments(str(directory))


def test_an_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LogDirError, match="no segment files"):
        list_segments(str(tmp_path))
    with pytest.raises(LogDirError, match="not a directory"):
        list_segments(str(tmp_path / "missing"))


def test_a_store_root_is_read_through_its_commitlog_subdirectory(tmp_path: Path) -> None:
    root = tmp_path / "store"
    placed = build_rocketmq_style(root / "commitlog", FILE, messages(4), spare_files=0)
    log = LogDir(str(root))
    assert log.directory == str(root / "commitlog")
    assert offsets(list(log.scan())) == [p.offset for p in placed]


def test_a_segment_deleted_during_a_scan_is_reported_and_skipped(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    log = LogDir(str(directory))
    it = log.scan()
    first = next(it)
    assert isinstance(first, RecordEntry)
    (directory / segment_name(FILE)).unlink()  # retention deleted it after the listing
    rest = list(it)
    bad = [e for e in rest if isinstance(e, BadEntry)]
    assert len(bad) == 1 and bad[0].offset == FILE and "unreadable" in bad[0].reason
    assert offsets(rest)[-1] == placed[-1].offset


def test_a_scan_never_writes(tmp_path: Path) -> None:
    directory, placed = build(tmp_path)
    patch(directory, placed[3].offset + 99, b"\xee")
    before = tree_digest(directory)
    list(LogDir(str(directory)).scan())
    assert tree_digest(directory) == before


SPARSE_FILE = 1 << 20


def build_sparse(tmp_path: Path) -> tuple[Path, list[int]]:
    """Two 1 MiB segments made as RocketMQ's are: set to full length (sparse), records at the
    front of the first, the second a pre-created spare of nothing but holes."""
    directory = tmp_path / "sparse"
    directory.mkdir()
    placed = []
    with (directory / segment_name(0)).open("wb") as f:
        pos = 0
        for m in messages(5):
            raw = m.encode(pos)
            f.write(raw)
            placed.append(pos)
            pos += len(raw)
        f.truncate(SPARSE_FILE)
    with (directory / segment_name(SPARSE_FILE)).open("wb") as f:
        f.truncate(SPARSE_FILE)
    return directory, placed


def test_sparse_files_with_data_only_at_the_front_end_cleanly(tmp_path: Path) -> None:
    directory, placed = build_sparse(tmp_path)
    entries = scan(directory)
    assert offsets(entries) == placed
    assert not any(isinstance(e, BadEntry) for e in entries)


@pytest.mark.parametrize("where", [SPARSE_FILE - 1, 700_000, SPARSE_FILE + 123_456])
def test_one_stray_byte_deep_in_a_sparse_tail_is_seen(tmp_path: Path, where: int) -> None:
    directory, placed = build_sparse(tmp_path)
    start = where - where % SPARSE_FILE
    with (directory / segment_name(start)).open("r+b") as f:
        f.seek(where - start)
        f.write(b"\x01")
    entries = scan(directory)
    assert offsets(entries) == placed
    assert isinstance(entries[-1], BadEntry) and entries[-1].next_offset is None
