"""Recovery of the producer table (producers.py) from the records after the checkpoint.

The checkpoint's snapshot covers every request stored below its offset F. Requests stored after
F carry their MQS_PSEQ tag in their first record; recovery finds those records and applies them
in log order. A segment without the tag's bytes costs one C-speed search; only in a segment
that holds them are the record boundaries followed (_core.chain) and the tagged records read.

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

from commitlog_svc.producers import TAG_PREFIX, ProducerTable
from commitlog_svc.replica_chunk import tagged_requests
from mqstore.formats import _core, sysflag
from mqstore.formats.record import Record, find_next_record, read_record
from mqstore.formats.record_batch import QueueTable, forget_unused_queues
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)


def rebuild_from_tags(
    queue: MappedFileQueue, producers: ProducerTable, start: int, end: int
) -> int:
    """Apply the tags of the records in [start, end) (start: a record boundary) to `producers`,
    a segment's chain of records at a time (replica_chunk.tagged_requests, the tagged records'
    CRCs checked); bytes that do not frame a record (corruption) are stepped over to the next
    valid record, and a request running into them is not remembered. Returns the offset of a
    request that survived only in part (the log's tail from there is to be cut), else -1."""
    applied = 0
    for mf in list(queue.files):
        base = mf.file_from_offset
        if mf.file_end_offset <= start or base >= end:
            continue
        buf = mf.buf
        pos, hi = max(start - base, 0), min(end - base, mf.wrote_position)
        while 0 <= pos < hi:
            requests, partial, stop = tagged_requests(buf, pos, hi, base, check_crc=True)
            for producer_id, request in requests:
                producers.apply(producer_id, request)
            applied += len(requests)
            if partial >= 0 and stop == hi:
                return partial  # the log ends inside the request
            if buf.find(TAG_PREFIX, stop, hi) < 0:
                break  # no tag beyond the chain's stop (the blank, or corruption)
            pos = find_next_record(buf, stop, hi, base)
    if applied:
        log.info("producer table: %d requests rebuilt from records after %d", applied, start)
    return -1


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
        starts, _ = _core.chain(mf.buf, max(start - base, 0), hi, base)
        for at in starts.tolist():
            found = read_record(mf.buf, at, hi, check_crc=False)
            if isinstance(found, Record) and sysflag.gets_queue_offset(found.sys_flag):
                queues = table.setdefault(found.topic, {})
                queues[found.queue_id] = min(
                    queues.get(found.queue_id, found.queue_offset), found.queue_offset
                )
    forget_unused_queues(table, [t for t, queues in table.items() if 0 in queues.values()])
