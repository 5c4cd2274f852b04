"""CommitLog.scan, the dispatch source: iteration over files and blanks, the record and byte
limits, end_offset, the confirm offset (sync: flushed; async: written), and a corrupt record in
the middle skipped and reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from commitlog_testlib import (
    Stored,
    append_each,
    flip_bit,
    message,
    on_flush_thread_of,
    open_log,
    reopen,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.commitlog.message_in import as_batches

FILE = 4096
WAIT_S = 10.0


def _collect(
    log: CommitLog, start: int, max_records: int = 1024, max_bytes: int = 4 << 20
) -> tuple[list[int], list[int]]:
    """Scan from `start` to the end in calls within the limits; (offsets, next offsets)."""
    offsets: list[int] = []
    nexts: list[int] = []
    offset = start
    while offset < log.confirm_offset:
        batch = log.scan(offset, max_records=max_records, max_bytes=max_bytes)
        assert batch.start_offset == offset
        assert not batch.corrupt
        assert batch.next_offset > offset
        offsets.extend(r.physical_offset for r in batch.records)
        nexts.append(batch.next_offset)
        offset = batch.next_offset
    return offsets, nexts


@pytest.fixture
def filled(tmp_path: Path) -> tuple[CommitLog, list[Stored]]:
    log = open_log(tmp_path)
    stored = append_each(log, [message(i) for i in range(60)])
    assert stored[-1].offset // FILE >= 3
    return log, stored


def test_scan_walks_every_record_over_the_blanks_in_order(
    filled: tuple[CommitLog, list[Stored]],
) -> None:
    log, stored = filled
    offsets, nexts = _collect(log, 0)
    assert offsets == [s.offset for s in stored]
    assert nexts[-1] == log.max_offset
    records = log.scan(0, max_records=len(stored)).records
    assert [(r.queue_id, r.queue_offset, r.body) for r in records] == [
        (s.message.queue_id, s.queue_offset, s.message.body) for s in stored
    ]
    empty = log.scan(log.max_offset)
    assert empty.records == [] and empty.next_offset == log.max_offset
    log.close()


@pytest.mark.parametrize("max_records", [1, 5, 17])
def test_scan_returns_at_most_max_records_and_continues_where_it_stopped(
    filled: tuple[CommitLog, list[Stored]], max_records: int
) -> None:
    log, stored = filled
    first = log.scan(0, max_records=max_records)
    assert [r.physical_offset for r in first.records] == [s.offset for s in stored[:max_records]]
    assert first.next_offset == stored[max_records - 1].end or (
        first.next_offset == stored[max_records].offset
    )
    offsets, _ = _collect(log, 0, max_records=max_records)
    assert offsets == [s.offset for s in stored]
    log.close()


@pytest.mark.parametrize("max_bytes", [1, 221, 222, 1000, 5000])
def test_scan_max_bytes_is_exceeded_by_at_most_the_last_record(
    filled: tuple[CommitLog, list[Stored]], max_bytes: int
) -> None:
    log, stored = filled
    batch = log.scan(0, max_bytes=max_bytes)
    sizes = [r.total_size for r in batch.records]
    assert sizes, "a scan always makes progress"
    assert sum(sizes[:-1]) < max_bytes <= sum(sizes)
    offsets, _ = _collect(log, 0, max_bytes=max_bytes)
    assert offsets == [s.offset for s in stored]
    log.close()


@pytest.mark.parametrize("k", [0, 1, 18, 19, 40])
def test_scan_stops_at_end_offset_on_a_record_boundary(
    filled: tuple[CommitLog, list[Stored]], k: int
) -> None:
    log, stored = filled
    end = stored[k].offset
    batch = log.scan(0, end_offset=end, max_records=1000)
    assert [r.physical_offset for r in batch.records] == [s.offset for s in stored[:k]]
    assert batch.corrupt == []
    assert batch.next_offset <= end
    # from where it stopped, the rest follows
    rest = log.scan(batch.next_offset, max_records=1000).records
    assert [r.physical_offset for r in rest][:3] == [s.offset for s in stored[k : k + 3]]
    log.close()


# Run in a child process: a scan that never returns must fail this test, not hang the session.
_SCAN_IN_CHILD = """
import json, sys
from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
log = CommitLog(CommitLogConfig.for_tests(sys.argv[1], checkpoint_interval_ms=600_000))
log.open()
batch = log.scan(0, end_offset=int(sys.argv[2]), max_records=1000)
print(json.dumps({
    "records": [r.physical_offset for r in batch.records],
    "corrupt": [[c.start_offset, c.end_offset] for c in batch.corrupt],
    "next": batch.next_offset,
}))
log.close()
"""


def test_scan_with_end_offset_inside_a_record_stops_before_it_without_reporting_corruption(
    filled: tuple[CommitLog, list[Stored]],
) -> None:
    log, stored = filled
    log.close()
    end = stored[5].offset + 10
    try:
        child = subprocess.run(
            [sys.executable, "-c", _SCAN_IN_CHILD, log.config.data_dir, str(end)],
            capture_output=True,
            text=True,
            timeout=20,  # the scan takes milliseconds; Python's start-up a second or two
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"scan(0, end_offset={end}) did not return")
    batch = json.loads(child.stdout)
    assert batch["records"] == [s.offset for s in stored[:5]]
    assert batch["corrupt"] == []
    assert batch["next"] == stored[5].offset


def test_async_scan_sees_records_as_soon_as_written_before_any_flush() -> None:
    clock = ManualClock()  # no timer fires: nothing is flushed after open
    log = open_log("/store", disk=SimDisk(clock_ms=clock.now_ms), clock=clock)
    stored = append_each(log, [message(i) for i in range(5)])
    assert log.flushed_offset == 0 < log.max_offset == log.confirm_offset
    assert [r.physical_offset for r in log.scan(0).records] == [s.offset for s in stored]
    log.close()


def test_sync_scan_shows_nothing_before_it_is_durable() -> None:
    """ReputMessageServiceTest: under sync flush the dispatch end is the flushed offset. A flush
    held back by a failpoint keeps the waiting append's record out of the scan."""
    # a long sync timeout: the held flush must not turn into FLUSH_DISK_TIMEOUT on a slow box
    log = open_log("/store", disk=SimDisk(), flush=FlushMode.SYNC, sync_flush_timeout_ms=60_000)
    stored = append_each(log, [message(i) for i in range(3)])
    gate, hit = threading.Event(), threading.Event()

    def hold(name: str) -> None:
        hit.set()
        gate.wait(WAIT_S)

    results = []
    with failpoints.armed("commitlog.before_flush", on_flush_thread_of(log, hold)):
        writer = threading.Thread(
            target=lambda: results.append(log.append_batch(as_batches([message(3)])))
        )
        writer.start()
        try:
            assert hit.wait(WAIT_S)
            deadline = time.monotonic() + WAIT_S
            while log.max_offset == stored[-1].end:  # written, flush held
                assert time.monotonic() < deadline
                time.sleep(0.002)
            assert log.confirm_offset == log.flushed_offset == stored[-1].end
            assert [r.physical_offset for r in log.scan(0).records] == [s.offset for s in stored]
        finally:
            gate.set()
            writer.join()
    assert results[0].ok
    assert len(log.scan(0).records) == 4
    log.close()


def test_scan_skips_a_corrupt_middle_record_and_reports_it(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    stored = append_each(log, [message(i) for i in range(12)])
    log.close()
    header_victim, body_victim = stored[4], stored[8]
    flip_bit(log.config, header_victim.offset + 3, 0)  # TOTALSIZE
    flip_bit(log.config, body_victim.offset + 120, 0)  # body: only the CRC tells
    log = reopen(log)
    batch = log.scan(0, check_crc=True)
    assert [(c.start_offset, c.end_offset) for c in batch.corrupt] == [
        (header_victim.offset, header_victim.end),
        (body_victim.offset, body_victim.end),
    ]
    assert [r.physical_offset for r in batch.records] == [
        s.offset for s in stored if s not in (header_victim, body_victim)
    ]
    assert batch.next_offset == log.max_offset
    # without the CRC check (RocketMQ's reput does not check it either) only the header damage
    # is seen: the record with the damaged body is dispatched
    fast = log.scan(0, check_crc=False)
    assert [c.start_offset for c in fast.corrupt] == [header_victim.offset]
    assert body_victim.offset in [r.physical_offset for r in fast.records]
    log.close()
