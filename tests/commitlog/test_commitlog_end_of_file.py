"""END_OF_FILE (rocketmq-store.md §1.7): when a record plus 8 bytes does not fit in what is left
of a segment, exactly 8 bytes of blank (TOTALSIZE = the bytes left, MAGIC = 0xCBD43194) are
written, the rest of the file stays zero, and the record goes to the start of the next file.
A batch never spans files, and a record never ends at, or within 8 bytes of, a file's end.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from commitlog_testlib import (
    Stored,
    append_batch_ok,
    append_each,
    assert_log_holds,
    open_log,
    read_at,
    reopen,
    segment_names,
)

from commitlog_svc.config import CommitLogConfig
from mqstore.formats.record import BLANK_MAGIC
from tests.commitlog.message_in import MessageIn

FILE = 4096
OVERHEAD = 112  # 91 + the 1-byte topic "T", no properties but the 20-byte record CRC


def _msg(size: int, i: int = 0) -> MessageIn:
    """A message whose record is exactly `size` bytes."""
    assert size >= OVERHEAD
    return MessageIn("T", i % 4, bytes([65 + i % 26]) * (size - OVERHEAD), flag=i)


def _blank_at(config: CommitLogConfig, offset: int) -> tuple[int, int]:
    size, magic = struct.unpack(">ii", read_at(config, offset, 8))
    return size, magic


def test_blank_is_exactly_8_bytes_and_the_record_goes_to_the_next_file(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    stored = append_each(log, [_msg(200, i) for i in range(20)])
    assert stored[-1].end == 4000
    [moved] = append_each(log, [_msg(200, 20)])
    config = log.config
    assert moved.offset == FILE
    assert _blank_at(config, 4000) == (FILE - 4000, BLANK_MAGIC)
    assert read_at(config, 4008, FILE - 4008) == bytes(FILE - 4008)  # only 8 bytes written
    assert log.read_record(FILE).body == _msg(200, 20).body
    log.close()
    # the blank survives a restart and recovery walks over it
    log = reopen(log)
    assert_log_holds(log, [*stored, moved], "after restart")
    assert _blank_at(config, 4000) == (FILE - 4000, BLANK_MAGIC)
    log.close()


@pytest.mark.parametrize(
    ("slack", "fits"),
    [(9, True), (8, True), (7, False), (1, False), (0, False)],
    ids=["room+9", "room+8-exactly", "room+7", "room+1", "would-end-at-file-end"],
)
def test_record_fits_only_with_8_bytes_to_spare(tmp_path: Path, slack: int, fits: bool) -> None:
    """19 records of 200 leave 296 bytes; a record of 296 - slack fits only if slack >= 8."""
    log = open_log(tmp_path)
    append_each(log, [_msg(200, i) for i in range(19)])
    room = FILE - log.max_offset
    assert room == 296
    [placed] = append_each(log, [_msg(room - slack, 19)])
    config = log.config
    if fits:
        assert placed.offset == FILE - room
        left = FILE - placed.end
        assert left == slack
        # the next record of any size does not fit: the blank fills exactly what is left
        [after] = append_each(log, [_msg(OVERHEAD, 20)])
        assert after.offset == FILE
        assert _blank_at(config, placed.end) == (left, BLANK_MAGIC)
    else:
        assert placed.offset == FILE
        assert _blank_at(config, FILE - room) == (room, BLANK_MAGIC)
    log.close()


def test_batch_that_does_not_fit_moves_whole_to_the_next_file(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_each(log, [_msg(200, i) for i in range(19)])
    room = FILE - log.max_offset
    # the first message alone would fit; the three together do not
    batch = [_msg(120, 19), _msg(120, 20), _msg(120, 21)]
    assert 120 + 8 <= room < 360 + 8
    stored = append_batch_ok(log, batch)
    assert [s.offset for s in stored] == [FILE, FILE + 120, FILE + 240]
    assert _blank_at(log.config, FILE - room) == (room, BLANK_MAGIC)
    assert read_at(log.config, FILE - room + 8, room - 8) == bytes(room - 8)
    log.close()


def _check_layout(config: CommitLogConfig, stored: list[Stored]) -> None:
    """Every record inside one file, at least 8 bytes before its end; every file that was left
    for the next ends in a blank covering the rest, after which it is zero."""
    by_file: dict[int, list[Stored]] = {}
    for s in stored:
        assert s.offset // FILE == (s.end - 1) // FILE, f"record at {s.offset} spans files"
        assert FILE - s.end % FILE >= 8, f"record at {s.offset} ends {FILE - s.end % FILE} short"
        by_file.setdefault(s.offset // FILE, []).append(s)
    files = sorted(by_file)
    assert files == list(range(files[0], files[-1] + 1))
    for f in files[:-1]:
        end = by_file[f][-1].end
        assert _blank_at(config, end) == (FILE * (f + 1) - end, BLANK_MAGIC)
        rest = FILE * (f + 1) - end - 8
        assert read_at(config, end + 8, rest) == bytes(rest)


@pytest.mark.parametrize("seed", range(3))
def test_random_sizes_and_batches_never_span_or_end_at_a_file_boundary(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    log = open_log(tmp_path)
    stored: list[Stored] = []
    i = 0
    while len(segment_names(log.config)) < 8:
        batch = []
        for _ in range(rng.randint(1, 4)):
            batch.append(_msg(OVERHEAD + rng.randint(0, 900), i))
            i += 1
        if sum(len(m.body) + OVERHEAD for m in batch) + 8 > FILE:
            continue
        stored.extend(append_batch_ok(log, batch))
    _check_layout(log.config, stored)
    log.close()
    log = reopen(log)
    assert_log_holds(log, stored, f"seed {seed}")
    log.close()
