"""The fast encoder: batches of messages into consecutive records, in one pass.

The layout is record.py's; this module only makes writing it cheap. Per message, Python work is
the floor of the append path (reference/performance-limits.md: ~1 us a record), so:

- A batch is columnar (`MessageBatch`): one topic and the fields a producer's batch shares
  (flag, born time and host, ...) once, and per message only the queue id, body, properties and,
  when they differ, the sys flag. The loop then reads three lists instead of ten attributes.
  RocketMQ's own batches likewise share one topic.
- A validated topic's bytes come from a cache; the header is one `struct.pack`; the pieces are
  joined once per batch, so the segment gets one copy instead of a slice assignment per field.

- The whole-record CRC (record.py) is computed once every field of a record is final, which
  for the queue offset, the physical offset and the store time is under the put lock, where
  this encoder runs. It chains crc32 over the pieces each record is joined from (header, body,
  topic and properties length, properties: four C calls a record, through `map`), and the 20
  bytes of each record's CRC property are made for the whole batch at once over numpy columns
  (record_columns.crc_properties).

`prepare_message` + `write_prepared` in record.py stay the plain reference encoder for one
record; a test pins both to the same bytes.

Queue offsets are assigned here, from a `QueueTable` (topic -> {queue id -> next offset}),
because only the encoder knows which messages it accepted; `undo_queue_offsets` gives them back
when the caller cannot store the batch after all.
"""

from __future__ import annotations

import itertools
import operator
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mqstore.errors import InvalidArgument, MessageIllegal
from mqstore.formats import sysflag
from mqstore.formats.crc import crc32
from mqstore.formats.record import (
    HEADERS,
    IPV4_HOST_BYTES,
    IPV6_HOST_BYTES,
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_POS,
    PROPERTIES_END_BYTE,
    RECORD_CRC_BYTES,
    RECORD_CRC_PLACEHOLDER,
    RECORD_OVERHEAD_BYTES_MAX,
    properties_too_large,
    validate_topic,
)
from mqstore.formats.record_columns import write_record_crcs
from mqstore.limits import MessageLimits

LOCALHOST_V4 = b"\x7f\x00\x00\x01\x00\x00\x00\x00"

# topic -> {queue id -> next queue offset}: nested so the hot loop builds no tuple per message.
QueueTable = dict[str, dict[int, int]]

_PROPS_LEN = struct.Struct(">h")
_PHYS = struct.Struct(">q")
# 2-byte big-endian lengths for small properties, so the loop indexes instead of packing.
_SMALL_PROPS_BYTES = 4096
# A batch whose properties come in at most one length per this many records joins the topic
# and the length into one part per record.
_MIDDLES_PER_RECORDS = 8
_PROPS_LEN_BYTES = tuple(_PROPS_LEN.pack(n) for n in range(_SMALL_PROPS_BYTES))
# Validated topics kept; past this the cache is dropped and rebuilt (a bound, not a tuning).
TOPIC_CACHE_ENTRIES_MAX = 65_536
_V6_BITS = sysflag.BORNHOST_V6 | sysflag.STOREHOST_V6
_GETS_QUEUE_OFFSET = (sysflag.TRANSACTION_NOT_TYPE, sysflag.TRANSACTION_COMMIT_TYPE)


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


class MessageFields(Protocol):
    """One message as an object (commitlog_svc.messages.MessageIn has these fields)."""

    topic: str
    queue_id: int
    body: bytes
    properties: bytes
    flag: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    reconsume_times: int
    prepared_tx_offset: int


def batches_from_messages(messages: Sequence[MessageFields]) -> list[MessageBatch]:
    """Group consecutive messages that share a topic and the batch-wide fields."""
    out: list[MessageBatch] = []
    current: MessageBatch | None = None
    for m in messages:
        if (
            current is None
            or m.topic != current.topic
            or m.flag != current.flag
            or m.born_timestamp_ms != current.born_timestamp_ms
            or m.born_host != current.born_host
            or m.reconsume_times != current.reconsume_times
            or m.prepared_tx_offset != current.prepared_tx_offset
        ):
            current = MessageBatch(
                topic=m.topic,
                queue_ids=[],
                bodies=[],
                properties=[],
                sys_flags=[],
                flag=m.flag,
                born_timestamp_ms=m.born_timestamp_ms,
                born_host=m.born_host,
                reconsume_times=m.reconsume_times,
                prepared_tx_offset=m.prepared_tx_offset,
            )
            out.append(current)
        current.queue_ids.append(m.queue_id)
        current.bodies.append(m.body)
        assert current.properties is not None and current.sys_flags is not None
        current.properties.append(m.properties)
        current.sys_flags.append(m.sys_flag)
    return out


@dataclass(frozen=True, slots=True)
class _Topic:
    prefix: bytes  # topic length field + topic bytes
    magic: int


@dataclass(slots=True)
class EncodedBatch:
    """Consecutive records; `blob` goes to `base_offset`. Messages are numbered across the
    input batches in order; `refused` lists those not encoded and why. Per encoded message, in
    order: its position in `blob`, its size, the queue offset it was given and its SYSFLAG as
    written (V6 host bits set). `record_crc`: the records end with the whole-record CRC."""

    blob: bytes | bytearray
    base_offset: int
    record_crc: bool = True
    count: int = 0
    positions: list[int] = field(default_factory=list)
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
        for pos in self.positions:
            _PHYS.pack_into(blob, pos + PHYSICAL_OFFSET_POS, new_base + pos)
        if self.record_crc:
            write_record_crcs(blob, self.sizes)
        self.blob = blob
        self.base_offset = new_base


def _topic_info(topic: str, limits: MessageLimits) -> _Topic:
    raw = validate_topic(topic, limits)
    if len(topic) > 127:  # RocketMQ's autoMessageVersionOnTopicLen counts characters
        return _Topic(struct.pack(">h", len(raw)) + raw, MAGIC_V2)
    return _Topic(bytes((len(raw),)) + raw, MAGIC_V1)


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
        out = EncodedBatch(b"", base_offset, self.record_crc)
        parts: list[bytes] = []
        index = 0
        pos = 0
        for batch in batches:
            n = len(batch.bodies)
            try:
                batch.check_columns()
                info = self._topic(batch.topic)
                born_bytes = len(batch.born_host)
                if born_bytes not in (IPV4_HOST_BYTES, IPV6_HOST_BYTES):
                    raise MessageIllegal("born host must be 8 or 20 bytes", field="born_host")
            except InvalidArgument as exc:
                out.refused.extend((index + k, exc) for k in range(n))
                index += n
                continue
            pos = self._encode_one(
                batch, info, born_bytes, index, pos, out, parts, store_timestamp_ms, queue_table
            )
            index += n
        out.count = index
        if self.record_crc and out.sizes:
            blob = bytearray().join(parts)
            write_record_crcs(blob, out.sizes)
            out.blob = blob
        else:
            out.blob = b"".join(parts)
        return out

    def _encode_one(
        self,
        batch: MessageBatch,
        info: _Topic,
        born_bytes: int,
        index: int,
        pos: int,
        out: EncodedBatch,
        parts: list[bytes],
        store_timestamp_ms: int,
        queue_table: QueueTable,
    ) -> int:
        """Encode one batch column by column: every per-message step is a `map` over a column
        with a C function (len, crc32, struct.pack, ...), so the interpreter runs almost no
        bytecode per message. Only refusals and mixed transaction flags take a Python loop."""
        n = len(batch.bodies)
        bodies = batch.bodies
        queue_ids = batch.queue_ids
        props = batch.properties if batch.properties is not None else [b""] * n
        flags = batch.sys_flags
        body_lens = list(map(len, bodies))
        props_lens = list(map(len, props))
        header = HEADERS[(born_bytes, len(self.store_host))]
        reserved = self._reserved
        fixed = header.size + len(info.prefix) + 2 + reserved
        if n and not self._all_valid(body_lens, props, props_lens, queue_ids, fixed):
            keep = self._refuse(body_lens, props, props_lens, queue_ids, fixed, index, out)
            bodies = [bodies[k] for k in keep]
            queue_ids = [queue_ids[k] for k in keep]
            props = [props[k] for k in keep]
            body_lens = [body_lens[k] for k in keep]
            props_lens = [props_lens[k] for k in keep]
            if flags is not None:
                flags = [flags[k] for k in keep]
            n = len(keep)
        if n == 0:
            return pos
        v6_bits = (sysflag.BORNHOST_V6 if born_bytes == IPV6_HOST_BYTES else 0) | (
            sysflag.STOREHOST_V6 if len(self.store_host) == IPV6_HOST_BYTES else 0
        )
        queues = queue_table.get(batch.topic)
        if queues is None:
            queues = queue_table[batch.topic] = {}
        flag_col: list[int]
        if flags is None:
            flag = (batch.sys_flag & ~_V6_BITS) | v6_bits
            flag_col = [flag] * n
            takes = flag & sysflag.TRANSACTION_MASK in _GETS_QUEUE_OFFSET
            queue_offsets = _assign(queues, queue_ids) if takes else [0] * n
        else:
            flag_list = [(f & ~_V6_BITS) | v6_bits for f in flags]
            flag_col = flag_list
            queue_offsets = _assign_mixed(queues, queue_ids, flag_list)
        sizes = [fixed + b + p for b, p in zip(body_lens, props_lens, strict=True)]
        positions = list(itertools.accumulate(sizes, initial=pos))
        end = positions.pop()
        base = out.base_offset
        repeat = itertools.repeat
        headers = map(
            header.pack,
            sizes,
            repeat(info.magic, n),
            map(operator.and_, map(crc32, bodies), repeat(0x7FFFFFFF, n)),
            queue_ids,
            repeat(batch.flag, n),
            queue_offsets,
            map(operator.add, repeat(base, n), positions),
            flag_col,
            repeat(batch.born_timestamp_ms, n),
            repeat(batch.born_host, n),
            repeat(store_timestamp_ms, n),
            repeat(self.store_host, n),
            repeat(batch.reconsume_times, n),
            repeat(batch.prepared_tx_offset, n),
            body_lens,
        )
        # The last part of each record: the CRC property's placeholder, which encode() fills
        # in once the batch is joined (or nothing, without the whole-record CRC).
        last = repeat(RECORD_CRC_PLACEHOLDER if reserved else b"", n)
        lengths = set(props_lens)
        pieces: Iterator[tuple[bytes, ...]]
        if len(lengths) * _MIDDLES_PER_RECORDS <= n:
            # The topic and the properties' length as one part: a batch's properties come in
            # a few lengths (a producer's differ in their unique ids only), so each piece is
            # made once, and every record has a part fewer to join.
            prefix, pack = info.prefix, _PROPS_LEN.pack
            middles = {length: prefix + pack(length + reserved) for length in lengths}
            mids = map(middles.__getitem__, props_lens)
            pieces = zip(headers, bodies, mids, props, last, strict=True)
        else:
            stored_lens = map(operator.add, props_lens, repeat(reserved, n))
            if max(props_lens) + reserved < _SMALL_PROPS_BYTES:
                props_len_bytes = map(_PROPS_LEN_BYTES.__getitem__, stored_lens)
            else:
                props_len_bytes = map(_PROPS_LEN.pack, stored_lens)
            pieces = zip(
                headers, bodies, repeat(info.prefix, n), props_len_bytes, props, last, strict=True
            )
        parts.extend(itertools.chain.from_iterable(pieces))
        out.positions.extend(positions)
        out.sizes.extend(sizes)
        out.queue_offsets.extend(queue_offsets)
        out.sys_flags.extend(flag_col)
        return end

    def _all_valid(
        self,
        body_lens: list[int],
        props: list[bytes],
        props_lens: list[int],
        queue_ids: list[int],
        fixed: int,
    ) -> bool:
        limits = self.limits
        body_max = max(body_lens)
        props_max = max(props_lens)
        return (
            _props_shaped(props)
            and body_max <= limits.body_bytes_max
            and props_max + self._reserved <= limits.properties_bytes_max
            and min(queue_ids) >= 0
            and max(queue_ids) <= limits.queue_id_max
            and fixed + body_max + props_max <= limits.body_bytes_max + RECORD_OVERHEAD_BYTES_MAX
        )

    def _refuse(
        self,
        body_lens: list[int],
        props: list[bytes],
        props_lens: list[int],
        queue_ids: list[int],
        fixed: int,
        index: int,
        out: EncodedBatch,
    ) -> list[int]:
        """Record each message over a limit as refused; the indices of the others."""
        limits = self.limits
        record_max = limits.body_bytes_max + RECORD_OVERHEAD_BYTES_MAX
        keep = []
        for k, (body_len, props_len, queue_id) in enumerate(
            zip(body_lens, props_lens, queue_ids, strict=True)
        ):
            size = fixed + body_len + props_len
            if (
                body_len > limits.body_bytes_max
                or props_len + self._reserved > limits.properties_bytes_max
                or not 0 <= queue_id <= limits.queue_id_max
                or size > record_max
            ):
                why = _why(body_len, props_len, queue_id, size, limits, self._reserved)
                out.refused.append((index + k, why))
            elif props_len and props[k][-1] != PROPERTIES_END_BYTE:
                shape = MessageIllegal(
                    "properties must be empty or end with 0x02 (see encode_properties)",
                    field="properties",
                )
                out.refused.append((index + k, shape))
            else:
                keep.append(k)
        return keep


def _props_shaped(props: list[bytes]) -> bool:
    """Every properties blob is empty or ends with 0x02, checked at C speed."""
    return all(
        map(
            operator.or_,
            map(operator.not_, props),
            map(bytes.endswith, props, itertools.repeat(b"\x02")),
        )
    )


def _assign(queues: dict[int, int], queue_ids: list[int]) -> Sequence[int]:
    """Next queue offsets for messages that all take one; a batch for one queue (RocketMQ
    sends a batch to one queue) needs no per-message work."""
    first = queue_ids[0]
    if queue_ids.count(first) == len(queue_ids):
        start = queues.get(first, 0)
        queues[first] = start + len(queue_ids)
        return range(start, start + len(queue_ids))
    out = []
    get = queues.get
    for queue_id in queue_ids:
        offset = get(queue_id, 0)
        queues[queue_id] = offset + 1
        out.append(offset)
    return out


def _assign_mixed(queues: dict[int, int], queue_ids: list[int], flags: list[int]) -> list[int]:
    """As _assign, for batches whose messages differ in transaction type: PREPARED and ROLLBACK
    messages take no queue offset (0 in the record)."""
    out = []
    for queue_id, flag in zip(queue_ids, flags, strict=True):
        if flag & sysflag.TRANSACTION_MASK in _GETS_QUEUE_OFFSET:
            offset = queues.get(queue_id, 0)
            queues[queue_id] = offset + 1
            out.append(offset)
        else:
            out.append(0)
    return out


def _why(
    body_len: int, props_len: int, queue_id: int, size: int, limits: MessageLimits, reserved: int
) -> InvalidArgument:
    if body_len > limits.body_bytes_max:
        return MessageIllegal(
            f"body is {body_len} bytes, over the {limits.body_bytes_max}-byte limit", field="body"
        )
    if props_len + reserved > limits.properties_bytes_max:
        return properties_too_large(props_len, limits, reserved)
    if not 0 <= queue_id <= limits.queue_id_max:
        return MessageIllegal(
            f"queue id {queue_id} outside [0, {limits.queue_id_max}]", field="queue_id"
        )
    return MessageIllegal(f"record of {size} bytes is too large", field="body")


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
    # A queue given back to 0 never held a message: leave no entry behind for it.
    for topic in {t for t, _, _ in keys}:
        queues = queue_table.get(topic)
        if queues is None:
            continue
        for queue_id in [q for q, n in queues.items() if n == 0]:
            del queues[queue_id]
        if not queues:
            del queue_table[topic]
