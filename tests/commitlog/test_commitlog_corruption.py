"""Corruption table on real segment files (etcd/Kafka style): damage bytes of a closed store,
reopen it, and assert exactly which records survive and that appends resume at the new end.

The store: 30 messages of 242 bytes each (16 in file 0, 14 in file 1), closed cleanly, so the
checkpoint's flushed offset F is the end of the last record and every record is durable.

- the tail truncated (zeroed from byte k to the end) at every byte of the last record;
- a 4 KiB page zeroed in the middle of the last segment (16 KiB segments for that case);
- one bit flipped in each field of a middle record;
- garbage after the last record.

The records end with the whole-record CRC property (__CRC32#, 20 bytes: record.py), so a bit
flipped in any field is found. The same flips in a store written without it (RocketMQ's
default, and mqstore's logs before it: 222-byte records, one CRC over the body) show what the
body CRC alone cannot see (QUEUEID, FLAG, QUEUEOFFSET, the timestamps, hosts, RECONSUMETIMES,
PREPAREDTXOFFSET, most SYSFLAG bits, TOPIC and PROPERTIES bytes): those rows assert that such
a record still reads, with the flipped value, and are named "undetected".
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from commitlog_testlib import (
    NEVER_MS,
    Stored,
    append_each,
    assert_appends_resume,
    assert_log_holds,
    config_for,
    flip_bit,
    kill,
    message,
    next_queue_offsets,
    open_log,
    opened,
    read_at,
    read_many,
    reopen,
    segment_names,
    write_at,
    zero_range,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from mqstore.errors import CorruptRecord, DataLoss, StoreLocked
from mqstore.formats.record import Record
from mqstore.storage import log_repair
from mqstore.storage.mapped_file import offset_to_file_name
from mqstore.storage.mapped_file_queue import ShortSegmentError

FILE = 4096
COUNT = 30
PLAIN_SIZE = 222  # 91 + body 100 + topic "TopicTest" 9 + properties 22
SIZE = PLAIN_SIZE + 20  # and the whole-record CRC property
BODY = 88
TOPIC_LEN = BODY + 100
TOPIC_AT = TOPIC_LEN + 1
PROPS_LEN = TOPIC_AT + 9
PROPS_AT = PROPS_LEN + 2
LAST = COUNT - 1
MIDDLE = 22  # in file 1, the file recovery scans (it holds F - 1), with records after it


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Stored]]:
    """The closed store every case starts from (copied, never changed)."""
    path = tmp_path_factory.mktemp("pristine")
    log = open_log(path)
    stored = append_each(log, [message(10 + i) for i in range(COUNT)])
    assert {s.size for s in stored} == {SIZE}
    assert [s.offset // FILE for s in stored].count(0) == 16
    log.close()
    return path, stored


@pytest.fixture(scope="module")
def pristine_plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Stored]]:
    """The same store written without the whole-record CRC (the body CRC alone). Reopened, it
    is opened with the CRC on, as after an upgrade: what it appends then carries the CRC."""
    path = tmp_path_factory.mktemp("pristine-plain")
    log = open_log(path, record_crc=False)
    stored = append_each(log, [message(10 + i) for i in range(COUNT)])
    assert {s.size for s in stored} == {PLAIN_SIZE}
    assert [s.offset // FILE for s in stored].count(0) == 18
    log.close()
    return path, stored


@pytest.fixture(scope="module")
def pristine_lagging(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Stored]]:
    """The same 30 messages, but the store was killed after the last one without a flush or a
    checkpoint since the 29th: the last record lies above F (the crash case)."""
    path = tmp_path_factory.mktemp("pristine-lagging")
    log = open_log(path)
    stored = append_each(log, [message(10 + i) for i in range(COUNT - 1)])
    log.close()
    log = open_log(path, flush_interval_ms=NEVER_MS, checkpoint_interval_ms=NEVER_MS)
    stored += append_each(log, [message(10 + COUNT - 1)])
    kill(log)
    return path, stored


def _copy(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> tuple[CommitLogConfig, list[Stored]]:
    source, stored = pristine
    target = tmp_path / "store"
    shutil.copytree(source, target)
    return config_for(target), stored


def _open(config: CommitLogConfig) -> CommitLog:
    return opened(CommitLog(config))


def _scan_offsets(log: CommitLog) -> list[int]:
    offsets: list[int] = []
    offset = log.min_offset
    while offset < log.max_offset:
        batch = log.scan(offset, check_crc=True)
        offsets.extend(r.physical_offset for r in batch.records)
        offset = batch.next_offset
    return offsets


# -- the tail truncated at every byte of the last record -------------------------------------


def _truncation_cases() -> list[object]:
    cases: list[object] = []
    for k in range(SIZE):
        cases.append(pytest.param(k, id=f"k{k}-in-properties" if k >= PROPS_AT else f"k{k}"))
    return cases


@pytest.mark.parametrize("f", ["last-below-F", "last-above-F"])
@pytest.mark.parametrize("k", _truncation_cases())
def test_last_record_torn_at_byte_k_is_cut_and_everything_before_survives(
    request: pytest.FixtureRequest, tmp_path: Path, k: int, f: str
) -> None:
    """Below F (closed cleanly, then damaged): durable bytes lost, the log rolls back. Above F
    (killed before a checkpoint covered it): a torn write, cut. Either way the record goes."""
    source = request.getfixturevalue("pristine" if f == "last-below-F" else "pristine_lagging")
    config, stored = _copy(source, tmp_path)
    last = stored[LAST]
    zero_range(config, last.offset + k, last.end)

    log = _open(config)
    report = log.recovery
    assert report is not None
    assert log.max_offset == report.end_offset == last.offset, f"torn at {k}: the record goes"
    if f == "last-below-F":
        assert report.durable_offset == last.end  # durable bytes were damaged
    else:
        assert report.durable_offset == last.offset and report.durable_bytes_lost == 0
    assert read_at(config, last.offset, SIZE) == bytes(SIZE)  # nothing of it is left
    assert_log_holds(log, stored[:LAST], f"torn at {k}")
    assert_appends_resume(log, stored[:LAST])
    log.close()


@pytest.mark.parametrize("k", [0, 3])  # the record reads as all zeros
def test_durable_bytes_lost_counts_every_byte_between_the_cut_and_f(
    pristine: tuple[Path, list[Stored]], tmp_path: Path, k: int
) -> None:
    config, stored = _copy(pristine, tmp_path)
    last = stored[LAST]
    zero_range(config, last.offset + k, last.end)
    log = _open(config)
    try:
        report = log.recovery
        assert report is not None
        assert report.durable_bytes_lost == report.durable_offset - report.end_offset == SIZE
    finally:
        log.close()


# -- segment files shorter than the segment size ------------------------------------------


def _segment(config: CommitLogConfig, index: int) -> str:
    return os.path.join(config.commitlog_dir, offset_to_file_name(index * FILE))


@pytest.mark.parametrize(
    "kept",
    [
        1,  # nothing whole is left in it: the log ends where it begins
        SIZE,  # exactly its first record
        SIZE + 100,  # in the middle of its second record
        5 * SIZE,  # at a record boundary
        11 * SIZE + 221,  # one byte short of its last record
        FILE - 100,  # past every record: only zeros were lost
    ],
)
def test_a_short_newest_segment_is_a_torn_tail_extended_recovered_and_reported(
    pristine: tuple[Path, list[Stored]], tmp_path: Path, kept: int
) -> None:
    """A file system that lost the newest segment's tail (or an operator's partial copy): the
    segment is extended with zeros to its size and recovered as a torn tail; the records whole
    in what is left survive, the report and a log line say so, appends resume. (Before: the
    store refused to load.)"""
    config, stored = _copy(pristine, tmp_path)
    newest = _segment(config, 1)
    os.truncate(newest, kept)
    survivors = [s for s in stored if s.end <= FILE + kept]
    end = survivors[-1].end if survivors[-1].offset >= FILE else FILE

    log = _open(config)
    report = log.recovery
    assert report is not None
    assert os.path.getsize(newest) == FILE
    assert (report.short_segment, report.short_segment_bytes) == (newest, kept)
    assert log.max_offset == report.end_offset == end
    assert report.durable_bytes_lost == stored[LAST].end - end  # F was the last record's end
    assert_log_holds(log, survivors, f"kept {kept}")
    assert_appends_resume(log, survivors)
    log.close()
    log = _open(config)  # and it stays mended
    assert log.recovery is not None and log.recovery.short_segment == ""
    log.close()


def test_a_short_older_segment_refuses_to_load_naming_it_and_the_repair(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    """Not the newest: the lost bytes lie between records that are not, no restart can mend
    that. The start is refused, naming the file and `mqstore log repair`; nothing on disk
    changes, and the lock is free again so that a second attempt says the same."""
    config, _ = _copy(pristine, tmp_path)
    older = _segment(config, 0)
    os.truncate(older, 2_000)
    sizes = {
        n: os.path.getsize(os.path.join(config.commitlog_dir, n)) for n in segment_names(config)
    }
    for _ in range(2):
        with pytest.raises(ShortSegmentError) as refused:
            _open(config)
        assert older in str(refused.value) and "2000 bytes" in str(refused.value)
        assert f"mqstore log repair {config.data_dir}" in str(refused.value)
    after = {
        n: os.path.getsize(os.path.join(config.commitlog_dir, n)) for n in segment_names(config)
    }
    assert after == sizes


def test_the_repair_ends_the_log_in_the_short_older_segment_and_keeps_what_it_moves(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    """`log_repair.repair`: the later segments move aside (with a copy of the damaged one), the
    next start mends the damaged one as a torn tail: the log ends after its last whole record,
    the loss of durable bytes is reported, queue offsets are rebuilt, appends resume."""
    config, stored = _copy(pristine, tmp_path)
    older = _segment(config, 0)
    os.truncate(older, 2_000)
    survivors = [s for s in stored if s.end <= 2_000]
    in_first = [s for s in stored if s.offset < FILE]
    assert 0 < len(survivors) < len(in_first) < COUNT  # the cut is inside segment 0

    plan = log_repair.plan(config.data_dir)
    assert plan.damaged is not None and plan.damaged.path == older
    assert [f.name for f in plan.moved] == [offset_to_file_name(FILE)]
    assert (plan.end_offset, plan.old_end_offset) == (survivors[-1].end, stored[LAST].end)
    assert plan.records_lost == COUNT - len(
        in_first
    )  # the later segment's; file 0's lost tail is unknown
    assert segment_names(config) == [offset_to_file_name(0), offset_to_file_name(FILE)]

    done, aside = log_repair.repair(config.data_dir)
    assert done.damaged == plan.damaged
    assert segment_names(config) == [offset_to_file_name(0)]
    assert sorted(os.listdir(aside)) == [offset_to_file_name(0), offset_to_file_name(FILE)]
    assert os.path.getsize(os.path.join(aside, offset_to_file_name(FILE))) == FILE

    log = _open(config)
    report = log.recovery
    assert report is not None and report.short_segment == older
    assert log.max_offset == survivors[-1].end
    assert report.durable_bytes_lost == stored[LAST].end - survivors[-1].end
    assert_log_holds(log, survivors, "repaired")
    assert_appends_resume(log, survivors)
    log.close()
    assert not log_repair.plan(config.data_dir).needed


def test_the_repair_refuses_a_running_store(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    config, _ = _copy(pristine, tmp_path)
    log = _open(config)
    try:
        with pytest.raises(StoreLocked):
            log_repair.repair(config.data_dir)
    finally:
        log.close()


# -- a zeroed page in the middle of the last segment ------------------------------------------


def test_zeroed_page_in_the_last_segment_loses_only_the_records_it_touches(
    tmp_path: Path,
) -> None:
    file_bytes = 16 * 1024
    log = open_log(tmp_path, file_bytes=file_bytes)
    stored = append_each(log, [message(10 + i % 90) for i in range(133)])
    log.close()
    config = log.config
    last_file = stored[-1].offset - stored[-1].offset % file_bytes
    assert last_file > 0 and stored[-1].end - last_file > 3 * FILE
    page_start, page_end = last_file + FILE, last_file + 2 * FILE
    zero_range(config, page_start, page_end)
    touched = [i for i, s in enumerate(stored) if s.offset < page_end and s.end > page_start]
    survivors = [s for i, s in enumerate(stored) if i not in touched]
    first_lost = stored[touched[0]]
    next_valid = stored[touched[-1] + 1]

    log = reopen(log)
    report = log.recovery
    assert report is not None
    assert log.max_offset == stored[-1].end  # nothing after the page is cut
    assert [(c.start_offset, c.end_offset) for c in report.corrupt] == [
        (first_lost.offset, next_valid.offset)
    ]
    assert report.truncated_bytes == 0
    assert _scan_offsets(log) == [s.offset for s in survivors]
    for s in survivors:
        assert log.read_record(s.offset).body == s.message.body
    assert first_lost.offset < page_start  # its header is intact: it reads as DATA_LOSS
    with pytest.raises(CorruptRecord):
        log.read_record(first_lost.offset)
    for i in touched:
        assert isinstance(read_many(log, [(stored[i].offset, stored[i].size)])[0], CorruptRecord)
    assert log.queue_offsets() == next_queue_offsets(stored)
    assert_appends_resume(log, stored)
    log.close()


def test_reading_a_reported_corrupt_record_with_a_damaged_magic_is_data_loss(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    config, stored = _copy(pristine, tmp_path)
    victim = stored[MIDDLE]
    flip_bit(config, victim.offset + 7, 0)  # MAGIC
    log = _open(config)
    try:
        report = log.recovery
        assert report is not None
        assert [c.start_offset for c in report.corrupt] == [victim.offset]
        with pytest.raises(DataLoss):
            log.read_record(victim.offset)
    finally:
        log.close()


# -- one bit flipped in each field of a middle record -----------------------------------------


@dataclasses.dataclass(frozen=True)
class Flip:
    field: str
    pos: int  # byte within the record
    bit: int
    detected: bool  # without the whole-record CRC (with it, every flip is)
    attr: str = ""  # Record attribute that shows an undetected flip


def _num(field: str, pos: int, width: int, attr: str, detected: bool, bit: int = 0) -> Flip:
    return Flip(field, pos + width - 1, bit, detected, attr)  # bit of the last (low) byte


CRC_AT = PROPS_AT + 22  # the whole-record CRC property, after the producer's 22 bytes
CRC_FLIPS = [
    Flip("CRC-PROPERTY-key", CRC_AT, 0, True),
    Flip("CRC-PROPERTY-separator", CRC_AT + 8, 1, True),
    Flip("CRC-PROPERTY-digit", CRC_AT + 9, 0, True),
    Flip("CRC-PROPERTY-last-digit", CRC_AT + 18, 3, True),
    Flip("CRC-PROPERTY-end", CRC_AT + 19, 0, True),
]


FLIPS = [
    _num("TOTALSIZE", 0, 4, "", True),
    _num("MAGIC", 4, 4, "", True),
    _num("BODYCRC", 8, 4, "", True),
    _num("QUEUEID", 12, 4, "queue_id", False),
    _num("FLAG", 16, 4, "flag", False),
    _num("QUEUEOFFSET", 20, 8, "queue_offset", False),
    _num("PHYSICALOFFSET", 28, 8, "", True),
    _num("SYSFLAG-compressed-bit", 36, 4, "sys_flag", False),
    _num("SYSFLAG-prepared-bit", 36, 4, "sys_flag", False, bit=2),
    _num("SYSFLAG-bornhost-v6-bit", 36, 4, "", True, bit=4),
    _num("BORNTIMESTAMP", 40, 8, "born_timestamp_ms", False),
    _num("BORNHOST", 48, 8, "born_host", False),
    _num("STORETIMESTAMP", 56, 8, "store_timestamp_ms", False),
    _num("STOREHOST", 64, 8, "store_host", False),
    _num("RECONSUMETIMES", 72, 4, "reconsume_times", False),
    _num("PREPAREDTXOFFSET", 76, 8, "prepared_tx_offset", False),
    _num("BODYLENGTH", 84, 4, "", True),
    Flip("BODY-first-byte", BODY, 0, True),
    Flip("BODY-last-byte", TOPIC_LEN - 1, 7, True),
    Flip("TOPICLENGTH", TOPIC_LEN, 0, True),
    Flip("TOPIC-low-bit", TOPIC_AT, 0, False, "topic"),
    Flip("TOPIC-high-bit-invalid-utf8", TOPIC_AT, 7, True),
    _num("PROPERTIESLENGTH", PROPS_LEN, 2, "", True),
    Flip("PROPERTIES", PROPS_AT, 0, False, "properties"),
]


def _flipped(record: Record, flip: Flip) -> Record:
    """The record as it must read back after an undetected flip."""
    value = getattr(record, flip.attr)
    new: Any
    if isinstance(value, int):
        new = value ^ (1 << flip.bit)
    elif isinstance(value, bytes):
        # hosts end with the port's low byte; properties start at the flipped byte
        index = len(value) - 1 if flip.attr.endswith("host") else 0
        new = value[:index] + bytes([value[index] ^ (1 << flip.bit)]) + value[index + 1 :]
    else:
        raw = value.encode()
        new = (bytes([raw[0] ^ (1 << flip.bit)]) + raw[1:]).decode()
    return dataclasses.replace(record, **{flip.attr: new})


@pytest.mark.parametrize(
    ("flip", "record_crc"),
    [pytest.param(f, True, id=f.field) for f in FLIPS + CRC_FLIPS]
    + [
        pytest.param(
            f, False, id="no-record-crc-" + f.field + ("" if f.detected else "-undetected")
        )
        for f in FLIPS
    ],
)
def test_bit_flip_in_a_durable_middle_record(
    request: pytest.FixtureRequest, tmp_path: Path, flip: Flip, record_crc: bool
) -> None:
    """Recovery's row "a bad record below F, a valid record later": a flip in any field of a
    record with the whole-record CRC is reported as corrupt, never read, and the log keeps
    every other record. Without the CRC only what the body CRC and the lengths cover is."""
    config, stored = _copy(
        request.getfixturevalue("pristine" if record_crc else "pristine_plain"), tmp_path
    )
    victim = stored[MIDDLE]
    before = _open(config)
    original = before.read_record(victim.offset)
    before.close()
    flip_bit(config, victim.offset + flip.pos, flip.bit)

    log = _open(config)
    report = log.recovery
    assert report is not None
    assert log.max_offset == stored[-1].end, "a durable middle record never cuts the log"
    assert report.truncated_bytes == 0 and report.durable_bytes_lost == 0
    others = stored[:MIDDLE] + stored[MIDDLE + 1 :]
    for s in others:
        assert log.read_record(s.offset).body == s.message.body
    if flip.detected or record_crc:
        assert [(c.start_offset, c.end_offset) for c in report.corrupt] == [
            (victim.offset, victim.end)
        ]
        assert _scan_offsets(log) == [s.offset for s in others]
        assert isinstance(read_many(log, [(victim.offset, victim.size)])[0], CorruptRecord)
        with pytest.raises(CorruptRecord):
            log.read_record(victim.offset)
    else:
        assert report.corrupt == []
        assert _scan_offsets(log) == [s.offset for s in stored]
        assert log.read_record(victim.offset) == _flipped(original, flip)
    assert_appends_resume(log, stored)
    log.close()


# -- garbage after the last record ------------------------------------------------------------


def _stale_copy(config: CommitLogConfig, stored: list[Stored]) -> bytes:
    """A whole valid record from earlier in the log: right CRC, wrong PHYSICALOFFSET."""
    return read_at(config, stored[3].offset, SIZE)


GARBAGE = {
    "random-bytes": lambda config, stored: random.Random(7).randbytes(500),
    "ones": lambda config, stored: b"\xff" * 300,
    "stale-record-copy": _stale_copy,
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_after_the_last_record_is_cut_and_every_record_survives(
    pristine: tuple[Path, list[Stored]], tmp_path: Path, kind: str
) -> None:
    config, stored = _copy(pristine, tmp_path)
    end = stored[-1].end
    garbage = GARBAGE[kind](config, stored)
    write_at(config, end, garbage)

    log = _open(config)
    report = log.recovery
    assert report is not None
    assert log.max_offset == end
    assert report.corrupt == [] and report.durable_bytes_lost == 0
    assert report.truncated_bytes >= len(garbage.rstrip(b"\0"))
    assert read_at(config, end, len(garbage)) == bytes(len(garbage))  # zeroed on disk
    assert_log_holds(log, stored, kind)
    assert_appends_resume(log, stored)
    log.close()


def test_garbage_segment_file_after_the_last_one_is_deleted(
    pristine: tuple[Path, list[Stored]], tmp_path: Path
) -> None:
    config, stored = _copy(pristine, tmp_path)
    extra = os.path.join(config.commitlog_dir, offset_to_file_name(2 * FILE))
    with open(extra, "wb") as f:
        f.write(random.Random(3).randbytes(FILE))

    log = _open(config)
    assert log.max_offset == stored[-1].end
    assert segment_names(config) == [offset_to_file_name(0), offset_to_file_name(FILE)]
    assert_log_holds(log, stored, "garbage file")
    assert_appends_resume(log, stored)
    log.close()
