"""Recovery, one test per row of the decision table in commitlog_svc/recovery.py:

    found at X                                  decision
    a valid record                              keep it, go on
    the end-of-file blank                       go on at the next file
    a bad record at X >= F                      data ends at X; later files deleted, rest zeroed
    a bad record at X < F, valid record at Y    report [X, Y), keep going, cut nothing
    a bad record at X < F, nothing valid after  data ends at X; durable bytes lost
    (no checkpoint)                             everything checked, nothing valid cut

F is the checkpoint's flushed offset. "X < F" states are built by closing cleanly (F = end) and
then damaging bytes on disk; "X >= F" states by appending with no timer due (nothing flushed or
checkpointed after open) and killing the store, so the checkpoint lags the data.

Then the queue-offset table after recovery, RocketMQ's testRecover scenarios, and the lock.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from commitlog_testlib import (
    NEVER_MS,
    TOPIC,
    Stored,
    append_each,
    assert_appends_resume,
    assert_log_holds,
    flip_bit,
    kill,
    message,
    next_queue_offsets,
    open_log,
    opened,
    placed_at,
    read_at,
    read_many,
    reopen,
    segment_names,
    sim_crash,
    zero_range,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.messages import PutStatus
from mqstore.errors import CorruptRecord, DataLoss, StoreLocked
from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.commitlog.message_in import MessageIn, as_batches

FILE = 4096


def _fill(log: CommitLog, count: int, start: int = 0) -> list[Stored]:
    return append_each(log, [message(i) for i in range(start, start + count)])


def _files_of(stored: list[Stored]) -> list[int]:
    return sorted({s.offset // FILE for s in stored})


def _lagging_store(tmp_path: Path) -> tuple[CommitLog, list[Stored], list[Stored], int]:
    """A killed store whose checkpoint vouches for the first 10 messages only; 30 more follow
    it across two more files. Returns (killed log, durable part, tail, F)."""
    log = open_log(tmp_path)
    durable = _fill(log, 10)
    log.close()
    log = open_log(tmp_path, flush_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
    flushed = log.max_offset
    tail = _fill(log, 30, start=10)
    assert len(_files_of(durable + tail)) >= 3, "the tail must reach a third file"
    kill(log)
    return log, durable, tail, flushed


# Messages 10..99 all encode to 242 bytes (222 and the whole-record CRC property): 16 fill a
# 4 KiB file, which then ends in a 224-byte blank, so record k sits at
# (k // 16) * 4096 + (k % 16) * 242.
UNIFORM = 242
PER_FILE = 16


def _uniform(log: CommitLog, count: int, already: int = 0) -> list[Stored]:
    stored = append_each(log, [message(10 + (already + k) % 90) for k in range(count)])
    assert {s.size for s in stored} == {UNIFORM}
    return stored


# -- the decision table ----------------------------------------------------------------------


def test_row_valid_records_are_all_kept_after_a_clean_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    stored = _fill(log, 40)
    end = log.max_offset
    log.close()

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert report.clean_exit and report.checkpoint_found
    assert report.end_offset == end == log.max_offset
    assert report.durable_offset == end
    assert report.corrupt == []
    assert report.truncated_bytes == 0 and report.durable_bytes_lost == 0
    assert_log_holds(log, stored, "clean restart")
    assert log.queue_offsets() == next_queue_offsets(stored)
    assert_appends_resume(log, stored)
    log.close()


def test_row_end_of_file_blank_sends_the_scan_on_to_the_next_file(tmp_path: Path) -> None:
    """The checkpoint lags in file 0, the data runs to file 2: the scan walks both blanks and
    keeps every record (nothing after F is bad)."""
    log, durable, tail, flushed = _lagging_store(tmp_path)
    end = tail[-1].end
    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert not report.clean_exit
    assert report.durable_offset == flushed < FILE
    assert report.start_offset == 0
    assert report.records_scanned == len(durable) + len(tail)
    assert report.end_offset == end == log.max_offset
    assert report.truncated_bytes == 0 and report.corrupt == []
    assert_log_holds(log, durable + tail, "lagging checkpoint")
    assert_appends_resume(log, durable + tail)
    log.close()


@pytest.mark.parametrize("victim", ["first_record_at_F", "record_mid_tail", "blank_at_F"])
def test_row_bad_record_at_or_after_flushed_offset_cuts_everything_after_it(
    tmp_path: Path, victim: str
) -> None:
    if victim == "blank_at_F":
        # F is the end of file 1's last record; the tail went to file 2 behind a blank at F
        log = open_log(tmp_path)
        durable = _uniform(log, 2 * PER_FILE)
        log.close()
        log = open_log(tmp_path, flush_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
        flushed = log.max_offset
        tail = _uniform(log, 5, already=2 * PER_FILE)
        kill(log)
        x = flushed
        assert tail[0].offset == 2 * FILE
        flip_bit(log.config, x + 4, 0)  # the blank's magic
        index = 0
    else:
        log, durable, tail, flushed = _lagging_store(tmp_path)
        if victim == "first_record_at_F":
            index = 0
            assert tail[0].offset == flushed  # X == F is still "at or after F"
        else:
            # a record in the second file, valid records after it there and in the third file
            second = [i for i, s in enumerate(tail) if s.offset // FILE == 1]
            index = second[len(second) // 2]
        x = tail[index].offset
        flip_bit(log.config, x + 88, 0)  # a body bit: the body CRC fails
    config = log.config
    assert any(s.offset // FILE > x // FILE for s in tail), "valid records follow in a later file"
    last_file = tail[-1].offset // FILE

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert report.durable_offset == flushed <= x
    assert report.end_offset == x == log.max_offset
    assert report.truncated_bytes > 0
    assert report.durable_bytes_lost == 0
    assert report.corrupt == []
    survivors = durable + tail[:index]
    assert_log_holds(log, survivors, "torn tail cut")
    # later files are deleted, the cut file is zero after X (on disk, not only in memory)
    names = segment_names(config)
    assert max(int(n) for n in names) == x - x % FILE < last_file * FILE
    assert read_at(config, x, FILE - x % FILE) == bytes(FILE - x % FILE)
    assert log.queue_offsets() == next_queue_offsets(survivors)
    assert_appends_resume(log, survivors)
    log.close()


@pytest.mark.parametrize("where", ["middle_of_the_last_file", "last_record_before_a_blank"])
def test_row_bad_record_below_flushed_offset_with_valid_records_after_is_reported_not_cut(
    tmp_path: Path, where: str
) -> None:
    log = open_log(tmp_path)
    if where == "middle_of_the_last_file":
        stored = _uniform(log, 2 * PER_FILE + 9)
        end = log.max_offset
        log.close()  # F = end: every record is below F
        index = 2 * PER_FILE + 4
        expected_range = (stored[index].offset, stored[index].end)  # Y: the next record
    else:
        # F at the end of file 1's last record; the tail after F starts in file 2, behind
        # file 1's blank. The victim is file 1's last record, below F.
        stored = _uniform(log, 2 * PER_FILE)
        log.close()
        log = open_log(tmp_path, flush_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
        flushed = log.max_offset
        stored += _uniform(log, 5, already=2 * PER_FILE)
        end = log.max_offset
        kill(log)
        index = 2 * PER_FILE - 1
        assert stored[index].end == flushed and stored[index + 1].offset == 2 * FILE
        expected_range = (stored[index].offset, 2 * FILE)  # Y: the next file's first record
    config = log.config
    victim = stored[index]
    flip_bit(config, victim.offset + 88 + 7, 3)  # a body bit: the CRC fails

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert victim.offset < report.durable_offset
    assert report.end_offset == end == log.max_offset
    assert [(c.start_offset, c.end_offset) for c in report.corrupt] == [expected_range]
    assert report.truncated_bytes == 0 and report.durable_bytes_lost == 0
    survivors = stored[:index] + stored[index + 1 :]
    records = []
    offset = log.min_offset
    while offset < log.max_offset:
        batch = log.scan(offset, check_crc=True)
        records.extend(batch.records)
        offset = batch.next_offset
    assert [r.physical_offset for r in records] == [s.offset for s in survivors]
    for s in survivors:
        assert log.read_record(s.offset).body == s.message.body
    with pytest.raises(CorruptRecord) as err:
        log.read_record(victim.offset)
    assert isinstance(err.value, DataLoss)
    assert err.value.offset == victim.offset
    # nothing was cut, so the queue offsets of every message stay taken
    assert log.queue_offsets() == next_queue_offsets(stored)
    assert_appends_resume(log, stored)
    log.close()


def _damaged_durable_tail(tmp_path: Path) -> tuple[CommitLog, list[Stored]]:
    log = open_log(tmp_path)
    stored = _fill(log, 40)
    log.close()
    flip_bit(log.config, stored[-1].offset + 90, 1)  # a body bit of the last record
    return reopen(log), stored


def test_row_bad_record_below_flushed_offset_with_nothing_valid_after_rolls_back(
    tmp_path: Path,
) -> None:
    log, stored = _damaged_durable_tail(tmp_path)
    victim = stored[-1]
    report = log.recovery
    assert report is not None
    assert report.durable_offset == victim.end  # the damaged record was durable
    assert report.end_offset == victim.offset == log.max_offset
    assert report.durable_bytes_lost > 0
    assert read_at(log.config, victim.offset, victim.size) == bytes(victim.size)
    assert_log_holds(log, stored[:-1], "durable tail damaged")
    result = log.append_batch(as_batches([message(999)]))
    assert result.offsets == [victim.offset]
    assert log.read_record(victim.offset).body == message(999).body
    log.close()


def test_row_bad_record_below_flushed_offset_with_nothing_valid_after_rolls_back_queue_offsets(
    tmp_path: Path,
) -> None:
    log, stored = _damaged_durable_tail(tmp_path)
    try:
        assert log.queue_offsets() == next_queue_offsets(stored[:-1])
    finally:
        log.close()


def _corrupt_checkpoint(data_dir: str) -> None:
    """Flip a bit in the checkpoint's last byte: its CRC32C no longer matches."""
    with open(os.path.join(data_dir, "checkpoint"), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))


def _lose_checkpoint(data_dir: str, how: str) -> None:
    if how == "deleted":
        os.remove(os.path.join(data_dir, "checkpoint"))
    elif how == "corrupt":
        _corrupt_checkpoint(data_dir)
    else:
        assert how == "foreign"
        os.remove(os.path.join(data_dir, "store.meta"))  # a new store id: checkpoint ignored


@pytest.mark.parametrize("checkpoint", ["deleted", "corrupt"])
def test_row_without_a_valid_checkpoint_a_bad_record_with_valid_records_after_is_not_cut(
    tmp_path: Path, checkpoint: str
) -> None:
    log = open_log(tmp_path)
    stored = _fill(log, 40)
    end = log.max_offset
    log.close()
    _lose_checkpoint(log.config.data_dir, checkpoint)
    victim = len(stored) - 4  # in the last file
    flip_bit(log.config, stored[victim].offset + 100, 2)  # body: CRC fails, fields still decode

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert not report.checkpoint_found
    assert [(c.start_offset, c.end_offset) for c in report.corrupt] == [
        (stored[victim].offset, stored[victim].end)
    ]
    assert report.end_offset == end == log.max_offset
    assert report.truncated_bytes == 0
    with pytest.raises(CorruptRecord):
        log.read_record(stored[victim].offset)
    for s in stored[:victim] + stored[victim + 1 :]:
        assert log.read_record(s.offset).body == s.message.body
    log.close()


@pytest.mark.parametrize("checkpoint", ["deleted", "corrupt"])
def test_row_without_a_valid_checkpoint_the_whole_log_is_checked_from_the_first_file(
    tmp_path: Path, checkpoint: str
) -> None:
    log = open_log(tmp_path)
    stored = _fill(log, 40)
    log.close()
    _lose_checkpoint(log.config.data_dir, checkpoint)
    victim = 5  # in file 0
    flip_bit(log.config, stored[victim].offset + 100, 2)

    log = reopen(log)
    try:
        report = log.recovery
        assert report is not None
        assert report.start_offset == 0
        assert report.records_scanned == len(stored) - 1
        assert [(c.start_offset, c.end_offset) for c in report.corrupt] == [
            (stored[victim].offset, stored[victim].end)
        ]
    finally:
        log.close()


def test_bad_record_in_a_file_before_the_scan_start_is_not_scanned_but_reads_as_data_loss(
    tmp_path: Path,
) -> None:
    """Recovery checks from the file holding F - 1 only (the files before were durable and
    checked before): damage in an older file shows at read time, as DATA_LOSS."""
    log = open_log(tmp_path)
    stored = _fill(log, 40)
    log.close()
    assert stored[-1].offset // FILE >= 1
    victim = 3  # in file 0
    flip_bit(log.config, stored[victim].offset + 95, 0)

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert report.start_offset == stored[-1].offset - stored[-1].offset % FILE > 0
    assert report.corrupt == []
    with pytest.raises(CorruptRecord):
        log.read_record(stored[victim].offset)
    assert isinstance(
        read_many(log, [(stored[victim].offset, stored[victim].size)])[0], CorruptRecord
    )
    assert log.read_record(stored[victim + 1].offset).body == stored[victim + 1].message.body
    log.close()


@pytest.mark.parametrize("mode", ["drop", "keep"])
def test_power_loss_with_a_lagging_checkpoint_keeps_exactly_what_reached_the_disk(
    mode: str,
) -> None:
    """Async flush, nothing flushed after open (F = end of the first 12 messages), power loss:
    "drop" loses every unflushed sector, so the log ends at F; "keep" writes them all, so all
    20 messages after F come back (found and applied by the scan from F)."""
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock)
    durable = _fill(log, 12)
    log.close()
    log = open_log("/store", disk=disk, clock=clock, flush_interval_ms=NEVER_MS)
    flushed_f = log.max_offset
    tail = _fill(log, 20, start=12)
    flushed = sim_crash(log, disk, random.Random(0), mode)  # type: ignore[arg-type]
    assert flushed == flushed_f == durable[-1].end
    log = reopen(log, disk=disk, clock=clock)
    report = log.recovery
    assert report is not None
    assert not report.clean_exit
    assert report.durable_offset == flushed_f
    survivors = durable if mode == "drop" else durable + tail
    assert log.max_offset == survivors[-1].end
    assert report.durable_bytes_lost == 0 and report.corrupt == []
    assert_log_holds(log, survivors, mode)
    assert log.queue_offsets() == next_queue_offsets(survivors)
    assert_appends_resume(log, survivors)
    log.close()


# -- the queue-offset table ------------------------------------------------------------------


def _table_messages(start: int, count: int) -> list[MessageIn]:
    out = []
    for i in range(start, start + count):
        topic = TOPIC if i % 5 else "OtherTopic"
        out.append(message(i, topic=topic, queues=3 if start == 0 else 5))
    return out


@pytest.mark.parametrize(
    "checkpoint",
    [
        "clean",
        "lagging",
        "corrupt",
        "deleted",
        "foreign",
    ],
)
def test_queue_offsets_after_recovery_are_last_stored_plus_one(
    tmp_path: Path, checkpoint: str
) -> None:
    """Whatever the checkpoint holds (exact, older than the tail, corrupt, missing, from another
    store), the next queue offset of every queue is its last stored queue offset + 1. The tail
    brings queues the checkpoint never saw and a PREPARED message, which takes no offset."""
    log = open_log(tmp_path)
    first = append_each(log, _table_messages(0, 12))
    log.close()
    log = open_log(tmp_path, flush_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
    tail_messages = _table_messages(12, 25)
    tail_messages.insert(
        7,
        MessageIn(TOPIC, 1, b"half a transaction", sys_flag=sysflag.TRANSACTION_PREPARED_TYPE),
    )
    tail = append_each(log, tail_messages)
    prepared = tail[7]
    assert prepared.queue_offset == 0
    stored = first + tail
    expected = next_queue_offsets(stored)
    assert log.queue_offsets() == expected
    data_dir = log.config.data_dir
    if checkpoint == "lagging":
        kill(log)
    else:
        log.close()
        if checkpoint != "clean":
            _lose_checkpoint(data_dir, checkpoint)

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert report.checkpoint_found == (checkpoint in ("clean", "lagging"))
    if checkpoint == "lagging":
        assert report.durable_offset == first[-1].end < tail[-1].end
    assert log.queue_offsets() == expected
    assert_log_holds(log, stored, checkpoint)
    for key, nxt in expected.items():
        result = log.append_batch(as_batches([MessageIn(key[0], key[1], b"after recovery")]))
        assert result.queue_offsets == [nxt], key
    log.close()


def test_queue_offsets_after_a_power_loss_roll_back_with_the_lost_tail() -> None:
    """Async flush, nothing flushed after open: a crash that drops unflushed sectors loses the
    whole tail, and the queue offsets it took are given out again."""
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock)
    first = append_each(log, _table_messages(0, 12))
    log.close()
    log = open_log("/store", disk=disk, clock=clock, flush_interval_ms=NEVER_MS)
    append_each(log, _table_messages(12, 20))
    sim_crash(log, disk, random.Random(1), "drop")
    log = reopen(log, disk=disk, clock=clock)
    assert log.max_offset == first[-1].end
    assert log.queue_offsets() == next_queue_offsets(first)
    assert_log_holds(log, first, "after power loss")
    assert_appends_resume(log, first)
    log.close()


# -- RocketMQ DefaultMessageStoreTest.testRecover --------------------------------------------

ROCKETMQ_BODY = b"Once, there was a chance for me!"  # 32 bytes


def _rocketmq_message(i: int) -> MessageIn:
    props = encode_properties({"TAGS": "TAG1", "KEYS": str(1_700_000_000_000 + i)})
    return MessageIn("FooBar", 0, ROCKETMQ_BODY, props)


def _damage_commit_log(config: CommitLogConfig, offset: int) -> None:
    """RocketMQ's damageCommitLog: read the body length at offset + 84, zero 16 bytes at the
    topic-length position after the body."""
    body_len = int.from_bytes(read_at(config, offset + 84, 4), "big")
    zero_range(config, offset + 88 + body_len, offset + 88 + body_len + 16)


def _rocketmq_store(tmp_path: Path, scenario: str) -> tuple[CommitLog, list[Stored]]:
    """100 messages in queue FooBar/0, closed; then damaged and/or an abort file, reopened.
    Written as RocketMQ writes them by default: without the whole-record CRC."""
    log = open_log(tmp_path, record_crc=False)
    stored = append_each(log, [_rocketmq_message(i) for i in range(100)])
    assert {s.size for s in stored} == {158}  # 91 + 32 + 6 + 29, as RocketMQ's records
    assert log.queue_offset("FooBar", 0) == 100
    log.close()
    config = log.config
    if scenario != "plain_restart":
        _damage_commit_log(config, stored[-1].offset)
    if scenario == "damaged_last_with_abort":
        with open(os.path.join(config.data_dir, "abort"), "w") as f:
            f.write("12345")
    return reopen(log), stored


@pytest.mark.parametrize("scenario", ["plain_restart", "damaged_last", "damaged_last_with_abort"])
def test_rocketmq_test_recover(tmp_path: Path, scenario: str) -> None:
    """Plain restart keeps the max offset; a damaged last message (with or without the abort
    file) rolls the max offset back to the previous message's end; appends work after."""
    log, stored = _rocketmq_store(tmp_path, scenario)
    report = log.recovery
    assert report is not None
    assert report.clean_exit == (scenario != "damaged_last_with_abort")
    if scenario == "plain_restart":
        assert log.max_offset == stored[-1].end
        assert log.queue_offset("FooBar", 0) == 100
        survivors = stored
    else:
        assert log.max_offset == stored[-2].end == stored[-1].offset
        survivors = stored[:-1]
    assert_log_holds(log, survivors, scenario)
    end = survivors[-1].end
    result = log.append_batch(as_batches([_rocketmq_message(1000)]))
    assert result.status is PutStatus.PUT_OK
    assert result.offsets == [placed_at(end, 158, FILE)]
    assert log.read_record(result.offsets[0]).body == ROCKETMQ_BODY
    log.close()
    assert not os.path.exists(os.path.join(log.config.data_dir, "abort"))


@pytest.mark.parametrize("scenario", ["damaged_last", "damaged_last_with_abort"])
def test_rocketmq_test_recover_rolls_the_queue_offset_back_by_one(
    tmp_path: Path, scenario: str
) -> None:
    log, _ = _rocketmq_store(tmp_path, scenario)
    try:
        assert log.queue_offset("FooBar", 0) == 99
        assert log.append_batch(as_batches([_rocketmq_message(1000)])).queue_offsets == [99]
    finally:
        log.close()


# -- the lock --------------------------------------------------------------------------------


def test_a_second_open_of_the_same_store_raises_store_locked_until_the_first_closes(
    tmp_path: Path,
) -> None:
    first = open_log(tmp_path)
    stored = _fill(first, 3)
    second = CommitLog(first.config)
    with pytest.raises(StoreLocked):
        opened(second)
    assert not second.running
    # the failed open changed nothing for the owner
    more = _fill(first, 2, start=3)
    assert_log_holds(first, stored + more, "owner after a refused second open")
    first.close()
    opened(second)
    assert_log_holds(second, stored + more, "second after the first closed")
    second.close()


def test_sync_flush_store_recovers_every_acknowledged_message_after_power_loss() -> None:
    """Under sync flush, an append returns PUT_OK only when durable: a crash that drops every
    unflushed sector keeps all of them."""
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.SYNC)
    stored = _fill(log, 30)
    sim_crash(log, disk, random.Random(0), "drop")
    log = reopen(log, disk=disk, clock=clock)
    assert log.max_offset == stored[-1].end
    assert_log_holds(log, stored, "sync flush after power loss")
    assert log.queue_offsets() == next_queue_offsets(stored)
    log.close()
