"""Recovery of the producer table (producers.py) from the records after the checkpoint.

The checkpoint's snapshot covers every request stored below its offset F. Requests stored after
F carry their MQS_PSEQ tag in their first record; recovery finds those records and applies them
in log order. A segment without the tag's bytes costs one C-speed search; only a segment that
holds them is walked record by record.

What a tag can find after a crash:

    the request's records              decision
    all there                          remembered: its retry is a duplicate
    the first ones only (torn write)   cut from its first record on: it was never acknowledged
                                       (a sync append is answered after the flush covering its
                                       last byte) and it lies above F (a checkpoint never splits
                                       a write), so its retry stores it whole, once
    not parseable (corruption)         not remembered; the damage is recovery's to report
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator

from commitlog_svc.producers import TAG_PREFIX, ProducerTable, decode_tag
from mqstore.formats import _core, sysflag
from mqstore.formats.commitlog_checkpoint import ProducerRequest
from mqstore.formats.properties import PRODUCER_SEQ
from mqstore.formats.record import (
    MAGIC_V1,
    MAGIC_V2,
    Blank,
    Record,
    find_next_record,
    read_record,
)
from mqstore.formats.record_batch import QueueTable
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

_SIZE_MAGIC = struct.Struct(">ii")
PARTIAL = -2  # records_end: the log ends inside the request


def rebuild_from_tags(
    queue: MappedFileQueue, producers: ProducerTable, start: int, end: int
) -> int:
    """Apply the tags of the records in [start, end) to `producers`. Returns the offset of a
    request that survived only in part (the log's tail from there is to be cut), else -1."""
    applied = 0
    for record in tagged_records(queue, start, end):
        tag = decode_tag(record.properties_dict().get(PRODUCER_SEQ, ""))
        if tag is None:
            continue
        stored = tag.count - len(tag.refused)
        end_offset = records_end(queue, record.physical_offset, stored, end)
        if end_offset == PARTIAL:
            return record.physical_offset
        if end_offset < 0:
            continue  # its records do not parse (corruption): nothing to answer a retry with
        producers.apply(
            tag.producer_id,
            ProducerRequest(
                tag.sequence, tag.count, record.physical_offset, end_offset, tag.refused
            ),
        )
        applied += 1
    if applied:
        log.info("producer table: %d requests rebuilt from records after %d", applied, start)
    return -1


def records_end(queue: MappedFileQueue, offset: int, stored: int, end: int) -> int:
    """End of `stored` consecutive records from `offset` (one request's: one write, one
    segment); PARTIAL when the log ends before the last of them, -1 when they do not parse."""
    mf = queue.find_mapped_file_by_offset(offset)
    if mf is None:
        return -1
    base = mf.file_from_offset
    limit = min(end, mf.file_end_offset) - base
    pos = offset - base
    buf = mf.read_buf
    for _ in range(stored):
        if pos >= limit:
            return PARTIAL
        if pos + 8 > limit:
            return -1
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic not in (MAGIC_V1, MAGIC_V2) or total <= 0 or pos + total > limit:
            return -1
        pos += total
    return base + pos


def tagged_records(queue: MappedFileQueue, start: int, end: int) -> Iterator[Record]:
    """Records in [start, end) (start: a record boundary) whose bytes hold the MQS_PSEQ key."""
    for mf in list(queue.files):
        base = mf.file_from_offset
        if mf.file_end_offset <= start or base >= end:
            continue
        lo = max(start - base, 0)
        hi = min(end - base, mf.read_position)
        buf = mf.read_buf
        hit = buf.find(TAG_PREFIX, lo, hi)
        pos = lo
        while hit >= 0 and pos < hi:
            found = read_record(buf, pos, hi, check_crc=True, expected_offset=base + pos)
            if isinstance(found, Record):
                if pos + found.total_size > hit:
                    yield found
                    hit = buf.find(TAG_PREFIX, pos + found.total_size, hi)
                pos += found.total_size
                continue
            if isinstance(found, Blank):
                break
            resume = find_next_record(buf, pos, hi, base)  # a corrupt record: skip it
            if resume < 0:
                break
            pos = resume
            if hit < pos:
                hit = buf.find(TAG_PREFIX, pos, hi)


def lower_queue_offsets(queue: MappedFileQueue, table: QueueTable, start: int, end: int) -> None:
    """Give back the queue offsets of the records in [start, end) (start: a record boundary),
    the log's last ones (about to be cut): each queue they touched restarts at the first offset
    among them (the log gives each queue's offsets in order). Recovery's cut of a request that
    survived in part, and a replica's truncation."""
    for mf in list(queue.files):
        base = mf.file_from_offset
        if mf.file_end_offset <= start or base >= end:
            continue
        hi = min(end - base, mf.file_size)
        starts, _ = _core.chain(mf.read_buf, max(start - base, 0), hi, base)
        for at in starts.tolist():
            found = read_record(mf.read_buf, at, hi, check_crc=False)
            if isinstance(found, Record) and sysflag.gets_queue_offset(found.sys_flag):
                queues = table.setdefault(found.topic, {})
                queues[found.queue_id] = min(
                    queues.get(found.queue_id, found.queue_offset), found.queue_offset
                )
    # A queue given back to 0 never held a message: no entry for it (as undo_queue_offsets).
    for topic in [t for t, queues in table.items() if 0 in queues.values()]:
        queues = table[topic]
        for queue_id in [q for q, n in queues.items() if n == 0]:
            del queues[queue_id]
        if not queues:
            del table[topic]
