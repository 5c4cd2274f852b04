"""What the engine reports for GetStatus: the store time of the newest record (found from the end
of the files after a restart) and of the first record at or after an offset."""

from __future__ import annotations

import struct
from pathlib import Path

from commitlog_testlib import append_each, message, open_log, reopen, segment_path

from commitlog_svc.commitlog import _last_record_in
from mqstore.formats.record import MAGIC_V1_BYTES, MAGIC_V2_BYTES, Record
from mqstore.storage.clock import ManualClock
from tests.commitlog.message_in import MessageIn

FILE = 4096


def test_the_newest_record_of_a_full_segment_is_the_one_before_its_blank(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    stored = append_each(log, [message(i) for i in range(30)])  # 222-byte records: 2 segments
    in_first = [s for s in stored if s.offset < FILE]
    log.close()
    with open(segment_path(log.config, 0), "rb") as f:
        first = f.read()
    found = _last_record_in(first, FILE, 0, FILE)
    assert isinstance(found, Record) and found.physical_offset == in_first[-1].offset


def test_magic_codes_inside_bodies_do_not_fool_the_backward_search(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    tricky = (MAGIC_V1_BYTES + MAGIC_V2_BYTES + struct.pack(">i", 200)) * 20
    [a, b] = append_each(log, [MessageIn("T", 0, tricky), MessageIn("T", 0, tricky + b"!")])
    log.close()
    with open(segment_path(log.config, 0), "rb") as f:
        data = f.read()
    found = _last_record_in(data, b.end, 0, FILE)
    assert isinstance(found, Record) and found.physical_offset == b.offset
    found = _last_record_in(data, a.end, 0, FILE)
    assert isinstance(found, Record) and found.physical_offset == a.offset


def test_newest_and_first_store_times_after_a_restart(tmp_path: Path) -> None:
    clock = ManualClock(1_000_000)
    log = open_log(tmp_path, clock=clock)
    stamps = []
    stored = []
    for i in range(25):
        clock.advance(1_000)
        stored += append_each(log, [message(i)])
        stamps.append(clock.now_ms())
    assert log.newest_store_timestamp_ms() == stamps[-1]
    log.close()
    log = reopen(log, clock=clock)
    assert log.newest_store_timestamp_ms() == stamps[-1]
    assert log.store_timestamp_at(0) == stamps[0]
    assert log.store_timestamp_at(stored[7].offset) == stamps[7]
    # an offset at the end-of-file blank moves on to the next segment's first record
    last_in_first = max((s for s in stored if s.offset < FILE), key=lambda s: s.offset)
    assert log.store_timestamp_at(last_in_first.end) == stamps[stored.index(last_in_first) + 1]
    assert log.store_timestamp_at(log.max_offset) == -1
    log.close()


def test_an_empty_log_has_no_newest_record(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.newest_store_timestamp_ms() == -1
    assert log.store_timestamp_at(0) == -1
    log.close()
