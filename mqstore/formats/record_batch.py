"""The append path's encoder: batches of messages into consecutive records, in one call.

The layout is record.py's; the per-record loop is the compiled core's (`_core.encode`, in
formats/_core_encode.pxi): for every message it checks the limits, assigns the queue offset,
writes the header, the body and its CRC, the topic and the properties, and, once every field
of the record is final, the whole-record CRC property, straight into one bytes object. That
happens under the put lock, since the queue offsets, the physical offsets and the store time
it covers are assigned there. This module keeps what runs once a call or a batch: the
columns' shape, the topic's validation (cached), and the typed errors of refused messages.

A batch is columnar (`MessageBatch`): one topic and the fields a producer's batch shares (flag,
born time and host, ...) once, and per message only the queue id, body, properties and, when
they differ, the sys flag. RocketMQ's own batches likewise share one topic.

record.py's `encode_record` (`prepare_message` + `write_prepared`) stays the reference encoder
for one record; tests/formats/test_record_encode.py pins this one to it, byte for byte and
refusal for refusal.

Queue offsets are assigned by the encoder, from a `QueueTable` (topic -> {queue id -> next
offset}), because only it knows which messages it accepted; `undo_queue_offsets` gives them
back when the caller cannot store the batch after all.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mqstore.errors import InvalidArgument, MessageIllegal
from mqstore.formats import _core, sysflag
from mqstore.formats.record import (
    IPV4_HOST_BYTES,
    IPV6_HOST_BYTES,
    PHYSICAL_OFFSET_POS,
    RECORD_CRC_BYTES,
    RECORD_OVERHEAD_BYTES_MAX,
    prepare_message,
    record_crc,
    record_crc_property,
    validate_topic,
)
from mqstore.limits import MessageLimits

LOCALHOST_V4 = b"\x7f\x00\x00\x01\x00\x00\x00\x00"

# topic -> {queue id -> next queue offset}: nested so the hot loop builds no tuple per message.
QueueTable = dict[str, dict[int, int]]

_PHYS = struct.Struct(">q")
# Validated topics kept; past this the cache is dropped and rebuilt (a bound, not a tuning).
TOPIC_CACHE_ENTRIES_MAX = 65_536


def table_from_pairs(pairs: dict[tuple[str, int], int]) -> QueueTable:
    table: QueueTable = {}
    for (topic, queue_id), next_offset in pairs.items():
        table.setdefault(topic, {})[queue_id] = next_offset
    return table


def table_to_pairs(table: QueueTable) -> dict[tuple[str, int], int]:
    return {(t, q): n for t, queues in table.items() for q, n in queues.items()}


@dataclass(slots=True)
class MessageBatch:
    """Messages of one topic, as columns: per-message lists, shared scalars.

    `properties` (encoded, see properties.py) and `sys_flags` may be None: no properties, and
    `sys_flag` for every message. The V6 host bits of the sys flag are set by the encoder.
    """

    topic: str
    queue_ids: list[int]
    bodies: list[bytes]
    properties: list[bytes] | None = None
    sys_flags: list[int] | None = None
    sys_flag: int = 0
    flag: int = 0
    born_timestamp_ms: int = 0
    born_host: bytes = LOCALHOST_V4
    reconsume_times: int = 0
    prepared_tx_offset: int = 0

    def __len__(self) -> int:
        return len(self.bodies)

    def check_columns(self) -> None:
        n = len(self.bodies)
        for name in ("queue_ids", "properties", "sys_flags"):
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise InvalidArgument(
                    f"{name} has {len(column)} entries for {n} bodies", field=name
                )


@dataclass(slots=True)
class EncodedBatch:
    """Consecutive records; `blob` goes to `base_offset`. Messages are numbered across the
    input batches in order; `refused` lists those not encoded and why. Per encoded message, in
    order: its commit-log offset, its size, the queue offset it was given and its SYSFLAG as
    written (V6 host bits set). `record_crc`: the records end with the whole-record CRC."""

    blob: bytes | bytearray
    base_offset: int
    record_crc: bool = True
    count: int = 0
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    sys_flags: list[int] = field(default_factory=list)
    refused: list[tuple[int, InvalidArgument]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return len(self.blob)

    def accepted(self) -> list[int]:
        """Indices of the encoded messages."""
        if not self.refused:
            return list(range(self.count))
        gone = {i for i, _ in self.refused}
        return [i for i in range(self.count) if i not in gone]

    def relocate(self, new_base: int) -> None:
        """Move the batch to another offset (a roll to the next file): patch every
        PHYSICALOFFSET field, and the whole-record CRC that covers it. Rare (once a segment),
        so per-record work is fine here."""
        blob = bytearray(self.blob)
        shift = new_base - self.base_offset
        for offset, size in zip(self.offsets, self.sizes, strict=True):
            pos = offset - self.base_offset
            _PHYS.pack_into(blob, pos + PHYSICAL_OFFSET_POS, offset + shift)
            if self.record_crc:
                crc = record_crc_property(record_crc(blob, pos, size))
                blob[pos + size - RECORD_CRC_BYTES : pos + size] = crc
        self.blob = blob
        self.base_offset = new_base
        self.offsets = [offset + shift for offset in self.offsets]


@dataclass(frozen=True, slots=True)
class _Topic:
    prefix: bytes | None  # topic length field + topic bytes; None: refused
    v2: bool


def _topic_info(topic: str, limits: MessageLimits) -> _Topic:
    try:
        raw = validate_topic(topic, limits)
    except MessageIllegal:
        return _Topic(None, False)
    if len(topic) > 127:  # RocketMQ's autoMessageVersionOnTopicLen counts characters
        return _Topic(struct.pack(">h", len(raw)) + raw, True)
    return _Topic(bytes((len(raw),)) + raw, False)


class BatchEncoder:
    """Encodes batches for one store (its host and limits); keeps the topic cache.
    `record_crc`: end every record with the whole-record CRC (record.py)."""

    def __init__(
        self, store_host: bytes, limits: MessageLimits, *, record_crc: bool = True
    ) -> None:
        if len(store_host) not in (IPV4_HOST_BYTES, IPV6_HOST_BYTES):
            raise InvalidArgument("store host must be 8 (IPv4) or 20 (IPv6) bytes")
        self.store_host = store_host
        self.limits = limits
        self.record_crc = record_crc
        # Bytes of each record's properties that are the CRC property's.
        self._reserved = RECORD_CRC_BYTES if record_crc else 0
        self._topics: dict[str, _Topic] = {}

    def _topic(self, topic: str) -> _Topic:
        info = self._topics.get(topic)
        if info is None:
            info = _topic_info(topic, self.limits)
            if len(self._topics) >= TOPIC_CACHE_ENTRIES_MAX:
                self._topics.clear()
            self._topics[topic] = info
        return info

    def encode(
        self,
        batches: Sequence[MessageBatch],
        *,
        base_offset: int,
        store_timestamp_ms: int,
        queue_table: QueueTable,
    ) -> EncodedBatch:
        """Encode every acceptable message; refused ones (limits) are listed, consume nothing,
        and leave `queue_table` untouched."""
        args: list[tuple[Any, ...]] = []
        index = 0
        topics = self._topics
        for batch in batches:
            info = topics.get(batch.topic) or self._topic(batch.topic)
            args.append(
                (
                    batch.topic,
                    index,
                    batch.bodies,
                    batch.queue_ids,
                    batch.properties,
                    batch.sys_flags,
                    batch.sys_flag,
                    batch.flag,
                    batch.born_timestamp_ms,
                    batch.born_host,
                    batch.reconsume_times,
                    batch.prepared_tx_offset,
                    info.prefix,
                    info.v2,
                    batch,
                )
            )
            index += len(batch.bodies)
        limits = self.limits
        blob, offsets, sizes, queue_offsets, sys_flags, refused = _core.encode(
            args,
            self.store_host,
            store_timestamp_ms,
            base_offset,
            queue_table,
            self.record_crc,
            limits.body_bytes_max,
            limits.properties_bytes_max - self._reserved,
            limits.queue_id_max,
            limits.body_bytes_max + RECORD_OVERHEAD_BYTES_MAX,
        )
        errors = []
        if refused:
            firsts = [a[1] for a in args]
            for i, _, _ in refused:
                j = bisect.bisect_right(firsts, i) - 1
                errors.append((i, self._why(args[j][-1], i - firsts[j])))
        return EncodedBatch(
            blob,
            base_offset,
            self.record_crc,
            index,
            offsets,
            sizes,
            queue_offsets,
            sys_flags,
            errors,
        )

    def _why(self, batch: MessageBatch, k: int) -> InvalidArgument:
        """The error of message `k` of `batch`, refused by the core: prepare_message's, which
        makes the same checks in the same order (a batch whose columns differ in length:
        check_columns')."""
        try:
            batch.check_columns()
            prepare_message(
                topic=batch.topic,
                queue_id=batch.queue_ids[k],
                body=batch.bodies[k],
                properties=b"" if batch.properties is None else batch.properties[k],
                born_host=batch.born_host,
                store_host_v6=len(self.store_host) == IPV6_HOST_BYTES,
                limits=self.limits,
                record_crc=self.record_crc,
            )
        except InvalidArgument as exc:
            return exc
        raise AssertionError(f"the core refused message {k} of a batch prepare_message takes")


def undo_queue_offsets(
    batches: Sequence[MessageBatch], encoded: EncodedBatch, queue_table: QueueTable
) -> None:
    """Give back the queue offsets `encoded` took (the caller could not store it)."""
    keys: list[tuple[str, int, int]] = []
    for batch in batches:
        flags = batch.sys_flags if batch.sys_flags is not None else [batch.sys_flag] * len(batch)
        keys.extend(zip(itertools.repeat(batch.topic), batch.queue_ids, flags, strict=False))
    for j, i in reversed(list(enumerate(encoded.accepted()))):
        topic, queue_id, flag = keys[i]
        if sysflag.gets_queue_offset(flag):
            queue_table[topic][queue_id] = encoded.queue_offsets[j]
    forget_unused_queues(queue_table, {t for t, _, _ in keys})


def forget_unused_queues(queue_table: QueueTable, topics: Iterable[str]) -> None:
    """Drop the queues of `topics` given back to 0 (they never held a message: no entry is left
    behind for them), and a topic left with none."""
    for topic in topics:
        queues = queue_table.get(topic)
        if queues is None:
            continue
        for queue_id in [q for q, n in queues.items() if n == 0]:
            del queues[queue_id]
        if not queues:
            del queue_table[topic]
