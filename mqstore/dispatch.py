"""Dispatch entries: what the commit log tells its subscribers about each stored message.

One entry per message, built from the record by `entry_from_record`; consume queues use the
position fields, the index uses keys and the unique id. The gRPC dispatch batch (a later issue)
carries these columns packed; engines take them as `DispatchEntry` objects or as columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.formats import sysflag
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from mqstore.formats.record import Record


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 1 us more
# per object with this many fields, measured), and one is made per message on hot paths. Treat
# it as a value: nothing assigns to its fields; unsafe_hash keeps it hashable as before.
@dataclass(slots=True, unsafe_hash=True)
class DispatchEntry:
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int  # start of the record
    size: int  # the record's TOTALSIZE
    tags_code: int
    store_timestamp_ms: int
    sys_flag: int = 0
    keys: str = ""  # the KEYS property, space separated
    uniq_key: str = ""  # the UNIQ_KEY property

    @property
    def end_offset(self) -> int:
        return self.commit_log_offset + self.size

    @property
    def goes_to_consume_queue(self) -> bool:
        """Only NOT and COMMIT messages are dispatched to a consume queue (§3.2)."""
        return sysflag.gets_queue_offset(self.sys_flag)

    @property
    def goes_to_index(self) -> bool:
        """Rolled-back transactional messages are not indexed (§4.3)."""
        return sysflag.transaction_type(self.sys_flag) != sysflag.TRANSACTION_ROLLBACK_TYPE


def entry_from_record(record: Record) -> DispatchEntry:
    props = decode_properties(record.properties) if record.properties else {}
    return DispatchEntry(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commit_log_offset=record.physical_offset,
        size=record.total_size,
        tags_code=tags_code(props.get(TAGS)),
        store_timestamp_ms=record.store_timestamp_ms,
        sys_flag=record.sys_flag,
        keys=props.get(KEYS, ""),
        uniq_key=props.get(UNIQ_KEY, ""),
    )
