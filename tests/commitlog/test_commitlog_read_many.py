"""CommitLog.read_blob cut into one answer a range (commitlog_testlib.read_many): many
(offset, size) ranges across segments in one call, each answered on its own (the record, or
the error a read of that range alone gives), nothing damaged served. Segments are 4 KiB, so 60
messages span several."""

from __future__ import annotations

from pathlib import Path

from commitlog_testlib import append_each, flip_bit, message, open_log, read_many

from mqstore.errors import CorruptRecord, InvalidArgument, OutOfRange
from mqstore.formats.record import Record, read_record


def test_ranges_across_segments_are_answered_each_on_its_own(tmp_path: Path) -> None:
    log = open_log(tmp_path / "store")
    stored = append_each(log, [message(i) for i in range(60)])
    assert len({s.offset // log.config.file_bytes for s in stored}) >= 3
    victim = stored[31]
    flip_bit(log.config, victim.offset + 94, 2)  # inside the body (after the 92-byte header)
    # Ask out of order, back and forth between segments, with bad ranges among good ones.
    picks = [stored[50], stored[2], victim, stored[33], stored[1], stored[59]]
    ranges = [(s.offset, s.size) for s in picks]
    ranges += [(log.max_offset, 100), (stored[3].offset, 0), (stored[4].offset, stored[4].size + 1)]
    got = read_many(log, ranges)
    assert len(got) == len(ranges)
    for s, answer in zip(picks, got, strict=False):
        if s is victim:
            assert isinstance(answer, CorruptRecord)
            continue
        assert isinstance(answer, bytes)
        record = read_record(answer, 0, len(answer), expected_offset=s.offset)
        assert isinstance(record, Record) and record.queue_offset == s.queue_offset
    assert isinstance(got[6], OutOfRange)
    assert isinstance(got[7], InvalidArgument)
    assert isinstance(got[8], CorruptRecord)  # one record and a byte of the next: not one record
    log.close()


def _verdict(answer: object) -> object:
    return answer if isinstance(answer, bytes) else type(answer)


def test_many_ranges_checked_together_get_the_verdicts_of_lone_reads(tmp_path: Path) -> None:
    """Enough ranges for the column checks (record_columns.py), with damage of every kind among
    them: each answer is what the one-by-one checks give the same range alone."""
    log = open_log(tmp_path / "store")
    stored = append_each(log, [message(i) for i in range(60)])
    flip_bit(log.config, stored[5].offset + 94, 2)  # body: the CRC fails
    flip_bit(log.config, stored[9].offset + 30, 0)  # PHYSICALOFFSET: not where it was read
    flip_bit(log.config, stored[12].offset + 4, 1)  # MAGIC
    flip_bit(log.config, stored[14].offset + 1, 0)  # TOTALSIZE
    flip_bit(log.config, stored[40].offset + stored[40].size - 1, 3)  # the properties' 0x02
    ranges = [(s.offset, s.size) for s in stored]
    ranges += [
        (stored[20].offset, stored[20].size + 1),  # one record and a byte of the next
        (stored[21].offset, stored[21].size - 1),  # a record cut short
        (stored[22].offset + 4, stored[22].size),  # inside a record
    ]
    got = read_many(log, ranges)
    alone = [read_many(log, [r])[0] for r in ranges]
    assert list(map(_verdict, got)) == list(map(_verdict, alone))
    corrupt = [i for i, answer in enumerate(got) if isinstance(answer, CorruptRecord)]
    assert corrupt == [5, 9, 12, 14, 40, 60, 61, 62]
    log.close()
