"""Messages as the SDK hands them out: checked, decompressed, decoded when read.

Bulk paths (Pull, Receive) carry raw commit-log records (format in protos/common.proto), either
one `bytes` each or laid end to end in one blob with a sizes column. `decode_records` turns a
whole answer into Messages at once:

    1. every check of `read_record` on every record (magic, TOTALSIZE, header, body, topic and
       properties lengths adding up, topic and properties shape, the whole-record or the body
       CRC), one compiled loop that also copies out the bodies and reads the queue offsets and
       sysflags (mqstore.formats.record_columns.check_records, shared with the commit log's
       Read; pinned to read_record, verdict for verdict)
    2. bodies decompressed where SYSFLAG says so
    3. one small Message per record: its body and the rest of its record (the record with its
       body cut out: the body is a copy of its own already); every other field is decoded from
       that rest the first time one is read (most consumers read the body alone)

A record that fails is DataLoss with read_record's reason. Corrupt bytes are never handed to
the caller.

What a record that fails does to its answer: `decode_records` / `decode_batch` / `decode_run`
raise DataLoss for the whole answer (one record asked for, a lookup); `decode_answer` (the
consumer's) keeps every other record and lists the ones that failed with why (`Undecodable`),
so that the messages before a bad record are handed out and the bad one is surfaced at its
place (client/errors.BadRecord).

The record checks (and numpy, which record_columns imports) are imported on the first decode,
not with the package: numpy costs 0.3 s to import, and the `mqstore` command mostly never
decodes a record.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, overload

from mqstore.client.compression import decompress
from mqstore.client.errors import DataLoss
from mqstore.formats import sysflag
from mqstore.formats._core import lazy_messages
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_properties, split_keys
from mqstore.formats.record import (
    PHYSICAL_OFFSET_POS,
    CheckedFields,
    Record,
    fields_without_body,
)
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.messages import host_text

if TYPE_CHECKING:
    from mqstore.formats.record_columns import CheckedRecords

# Every field, in the order of the constructor and of repr.
FIELDS: Final = (
    "topic",
    "queue_id",
    "queue_offset",
    "commit_log_offset",
    "body",
    "properties",
    "store_timestamp_ms",
    "born_timestamp_ms",
    "store_host",
    "born_host",
    "sys_flag",
    "flag",
    "reconsume_times",
    "size",
    "msg_id",
)
# What a lazily built message decodes from its record on first use.
_LAZY_FIELDS: Final = frozenset(FIELDS) - {"body"}
_PHYSICAL_OFFSET: Final = struct.Struct(">q")
# Messages a consumer's loop makes at once (MessageRun.iter_from): a loop stopped after a
# few has made at most this many; each call costs about a message's making (~1 us).
MADE_CHUNK: Final = 128


class Message:
    """One message. A value: equal when every field is, hashable by value; nothing assigns to
    its fields. Built by hand with the fields (every one but the first five has a default), or
    by `decode_records` from raw records, in which case the fields other than `body` are
    decoded from the record the first time one of them is read."""

    __slots__ = (*FIELDS, "_rest")
    __match_args__ = FIELDS

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    body: bytes  # decompressed
    properties: dict[str, str]
    store_timestamp_ms: int
    born_timestamp_ms: int
    store_host: str
    born_host: str
    sys_flag: int
    flag: int
    reconsume_times: int
    size: int  # the record's TOTALSIZE in the commit log
    msg_id: str  # the offset message id (store host + commit-log offset)
    # The record without its body (record.without_body), for the fields not decoded yet (None:
    # built by hand).
    _rest: bytes | None

    def __init__(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        commit_log_offset: int,
        body: bytes,
        properties: dict[str, str] | None = None,
        store_timestamp_ms: int = 0,
        born_timestamp_ms: int = 0,
        store_host: str = "",
        born_host: str = "",
        sys_flag: int = 0,
        flag: int = 0,
        reconsume_times: int = 0,
        size: int = 0,
        msg_id: str = "",
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.body = body
        self.properties = {} if properties is None else properties
        self.store_timestamp_ms = store_timestamp_ms
        self.born_timestamp_ms = born_timestamp_ms
        self.store_host = store_host
        self.born_host = born_host
        self.sys_flag = sys_flag
        self.flag = flag
        self.reconsume_times = reconsume_times
        self.size = size
        self.msg_id = msg_id
        self._rest = None

    if not TYPE_CHECKING:  # mypy sees the declared fields only

        def __getattr__(self, name: str) -> Any:
            # Called only for a slot not set yet: a field of a lazily built message.
            if name in _LAZY_FIELDS:
                self._decode_rest()
            else:
                raise AttributeError(f"'Message' object has no attribute {name!r}")
            return object.__getattribute__(self, name)

    def _decode_rest(self) -> None:
        """Every field but the body, from the rest of the record (checked when its batch was
        decoded)."""
        rest = self._rest
        if rest is None:  # every field of a hand-built message is set in __init__
            raise AssertionError("a Message without its record lacks a field")
        # Nothing assigns to a Message's fields, so a lazy one holds its body alone: every
        # other field is set here at once, from a record its batch's checks accepted, so no
        # read asks a slot whether it is set (an AttributeError per unset field: the larger
        # part of a first read's cost; figures in docs/bench.md).
        for name, value in _fields_of(fields_without_body(rest)).items():
            object.__setattr__(self, name, value)

    # -- a value ----------------------------------------------------------------------------------

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Message)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        fields = list(self._fields())
        fields[FIELDS.index("properties")] = frozenset(self.properties.items())
        return hash(tuple(fields))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in FIELDS)
        return f"Message({shown})"

    def __getstate__(self) -> dict[str, Any]:
        # Pickled decoded: a copy must not depend on this class's lazy layout.
        return {name: getattr(self, name) for name in FIELDS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in FIELDS:
            object.__setattr__(self, name, state[name])
        self._rest = None

    # -- derived ----------------------------------------------------------------------------------

    @property
    def tags(self) -> str:
        return self.properties.get(TAGS, "")

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(KEYS))

    @property
    def uniq_key(self) -> str:
        """The producer-side unique id (RocketMQ's UNIQ_KEY, its client's "msgId")."""
        return self.properties.get(UNIQ_KEY, "")

    # -- builders ---------------------------------------------------------------------------------

    @classmethod
    def from_record(cls, raw: bytes) -> Message:
        """One raw record, checked as `decode_records` checks it (DataLoss when it fails)."""
        return decode_records(raw, (len(raw),))[0]

    @classmethod
    def _of(cls, r: Record) -> Message:
        return cls(body=decompress(r.body, r.sys_flag), **_fields_of(r))

    @classmethod
    def from_proto(cls, m: common_pb2.Message) -> Message:
        return cls(
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            commit_log_offset=m.commit_log_offset,
            body=decompress(m.body, m.sys_flag),
            properties=dict(m.properties),
            store_timestamp_ms=m.store_timestamp_ms,
            born_timestamp_ms=m.born_timestamp_ms,
            store_host=m.store_host,
            born_host=m.born_host,
            sys_flag=m.sys_flag,
            flag=m.flag,
            reconsume_times=m.reconsume_times,
            size=m.size,
            msg_id=m.msg_id,
        )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (body as UTF-8 text when it is, else base64 under body_base64)."""
        out: dict[str, object] = {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "commit_log_offset": self.commit_log_offset,
            "msg_id": self.msg_id,
            "uniq_key": self.uniq_key,
            "tags": self.tags,
            "keys": self.keys,
            "store_timestamp_ms": self.store_timestamp_ms,
            "born_timestamp_ms": self.born_timestamp_ms,
            "born_host": self.born_host,
            "store_host": self.store_host,
            "size": self.size,
            "properties": self.properties,
        }
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return out


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message delivered in receive/ack mode: ack it with its receipt before it turns
    visible again."""

    message: Message
    receipt_handle: str
    delivery_count: int


# -- decoding a batch of records ------------------------------------------------------------------


def decode_records(blob: bytes, sizes: Iterable[int]) -> list[Message]:
    """The records laid end to end in `blob` (`sizes[i]` bytes each) as Messages, in order:
    each checked as `read_record` checks it, its body CRC included, and decompressed. Raises
    DataLoss when any record fails (nothing of the batch is handed out then)."""
    return decode_batch(blob, sizes)[0]


def decode_record_list(records: Sequence[bytes]) -> list[Message]:
    """`decode_records` over one `bytes` per record (the answers' `repeated bytes` form)."""
    if not records:
        return []
    return decode_records(b"".join(records), list(map(len, records)))


def decode_batch(blob: bytes, sizes: Iterable[int]) -> tuple[list[Message], list[int]]:
    """`decode_records`, and each record's QUEUEOFFSET (read from the records as they are
    checked, so that a consumer's bookkeeping decodes nothing more)."""
    run, queue_offsets = decode_run(blob, sizes)
    return run[:], queue_offsets


def decode_run(blob: bytes, sizes: Iterable[int]) -> tuple[MessageRun, list[int]]:
    """`decode_batch`, every record checked now, each Message made when first asked for
    (MessageRun)."""
    run, queue_offsets, failed = decode_answer(blob, sizes)
    if failed:
        raise DataLoss(failed[0].reason)
    return run, queue_offsets


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A record of an answer that cannot become a Message: its place in the answer, where it
    lies in the commit log (-1 when its bytes do not say), and why."""

    index: int
    commit_log_offset: int
    reason: str


def decode_answer(
    blob: bytes, sizes: Iterable[int]
) -> tuple[MessageRun, list[int], list[Undecodable]]:
    """The records of an answer as `decode_run` checks them, those that fail left out: (the
    others' run, their queue offsets, the failed ones in answer order). A record at index i of
    the answer is at index i - (failed ones before it) of the run. DataLoss only when the
    answer itself does not hold together (sizes that do not add up to the blob)."""
    bodies, raws, queue_offsets, failed = _decoded(blob, sizes)
    return MessageRun(bodies, raws, {}), queue_offsets, failed


class _Raws:
    """A run's raw records, cut out of their answers' blobs only when one is asked for (a
    Message's fields other than the body come from its record; a consumer reading bodies
    alone never asks: at 1 KiB the cut was a copy of every record, ~0.1-0.3 us each). Three
    lists, one entry a record: the blob holding it, where it starts and ends there. Holding
    the blobs keeps an answer's bytes while a batch of it is buffered; a Message made gets a
    copy of its record but the body (its body is its own copy already), so what a caller
    keeps holds no blob."""

    __slots__ = ("blobs", "ends", "starts")

    def __init__(self, blobs: list[bytes], starts: list[int], ends: list[int]) -> None:
        self.blobs = blobs
        self.starts = starts
        self.ends = ends

    def __getitem__(self, i: int) -> bytes:
        return self.blobs[i][self.starts[i] : self.ends[i]]

    def tail(self, start: int) -> _Raws:
        return _Raws(self.blobs[start:], self.starts[start:], self.ends[start:])

    def joined(self, more: _Raws) -> _Raws:
        return _Raws(self.blobs + more.blobs, self.starts + more.starts, self.ends + more.ends)

    def extend(self, more: _Raws) -> None:
        self.blobs.extend(more.blobs)
        self.starts.extend(more.starts)
        self.ends.extend(more.ends)


class MessageRun(Sequence[Message]):
    """A checked batch's messages, each one made when it is asked for. A consumer that hands
    messages out one at a time (Consumer.messages) makes them a chunk at a time (`made`, one
    compiled loop: Python's object.__new__ and two attribute stores were ~0.3 us a message),
    out of the cycle collector: a thousand tracked Messages kept until handed out outlived
    its youngest generation, and its scans of them were ~15 % of a consumer's CPU at 1 KiB.
    Asking for one index twice gives two equal Messages. Messages made already (a batch's
    answer in the `records` form, PolledBatch.of) are held by index (`_made`)."""

    __slots__ = ("_bodies", "_made", "_raws")

    def __init__(self, bodies: list[bytes], raws: _Raws, made: dict[int, Message]) -> None:
        self._bodies = bodies
        self._raws = raws
        self._made = made

    def __len__(self) -> int:
        return len(self._bodies)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        n = len(self._bodies)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1 and not self._made:  # the usual batch
                return self.made(start, stop)
            return [self._one(k) for k in range(start, stop, step)]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("message index out of range")
        return self._one(index)

    def after(self, start: int, more: MessageRun) -> MessageRun:
        """This run's messages from `start` on, then `more`'s: lists of references joined,
        no Message made (a consumer's buffer meeting the next answer for its queue)."""
        made = {i - start: m for i, m in self._made.items() if i >= start}
        shift = len(self._bodies) - start
        made.update((i + shift, m) for i, m in more._made.items())
        return MessageRun(
            self._bodies[start:] + more._bodies, self._raws.tail(start).joined(more._raws), made
        )

    def tail(self, start: int) -> MessageRun:
        """This run's messages from `start` on, no Message made."""
        made = {i - start: m for i, m in self._made.items() if i >= start}
        return MessageRun(self._bodies[start:], self._raws.tail(start), made)

    def head(self, stop: int) -> MessageRun:
        """This run's messages before `stop`, no Message made."""
        made = {i: m for i, m in self._made.items() if i < stop}
        raws = self._raws
        return MessageRun(
            self._bodies[:stop],
            _Raws(raws.blobs[:stop], raws.starts[:stop], raws.ends[:stop]),
            made,
        )

    def extend(self, more: MessageRun) -> None:
        """`more`'s messages added at the end, in place: for a run nothing was handed out of
        yet, so that several answers met in one look cost time linear in their length."""
        shift = len(self._bodies)
        self._bodies.extend(more._bodies)
        self._raws.extend(more._raws)  # (in place: _Raws.extend)
        if more._made:
            self._made.update((i + shift, m) for i, m in more._made.items())

    def made(self, start: int, stop: int) -> list[Message]:
        """Messages start..stop of the run, made now (one compiled loop, _core.lazy_messages:
        each a Message with its body and a copy of the rest of its record, every other field
        decoded on first read). Left out of the cycle collector: a batch of them kept while it
        is handed out is not scanned by each young-generation collection (message.py's Message
        holds no reference that could lead back to it)."""
        stop = min(stop, len(self._bodies))
        if self._made:
            return [self._one(i) for i in range(start, stop)]
        raws = self._raws
        return lazy_messages(Message, self._bodies, raws.blobs, raws.starts, raws.ends, start, stop)

    def iter_from(self, start: int) -> Iterator[Message]:
        """Messages start.. of the run, made a chunk at a time as the loop gets to them."""
        for at in range(start, len(self._bodies), MADE_CHUNK):
            yield from self.made(at, at + MADE_CHUNK)

    def _one(self, i: int) -> Message:
        if self._made:
            m = self._made.get(i)
            if m is not None:
                return m
        raws = self._raws
        return lazy_messages(Message, self._bodies, raws.blobs, raws.starts, raws.ends, i, i + 1)[0]


class PolledBatch(Sequence[Message]):
    """What one poll_batch() hands out, as columns: `bodies` (decompressed), `queue_ids` and
    `queue_offsets`, one entry a message, queue after queue; a Message (every field) made
    only when one is asked for by index or iteration. The consume side's send_batch: a
    consumer that wants bodies makes no object a message (at 100 B a Message made and read
    costs about as much as the record's checks).

    The lists are the batch's own: reading them is free, changing them changes the batch."""

    __slots__ = ("_run", "bodies", "queue_ids", "queue_offsets")

    def __init__(self, run: MessageRun, queue_ids: list[int], queue_offsets: list[int]) -> None:
        self._run = run
        self.bodies = run._bodies
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets

    @classmethod
    def of(cls, parts: Sequence[tuple[int, Sequence[Message], list[int]]]) -> PolledBatch:
        """The batch of (queue id, messages, their queue offsets) parts, in order."""
        bodies: list[bytes] = []
        raws = _Raws([], [], [])
        made: dict[int, Message] = {}
        queue_ids: list[int] = []
        queue_offsets: list[int] = []
        for queue_id, messages, offsets in parts:
            shift = len(bodies)
            if isinstance(messages, MessageRun):
                bodies += messages._bodies
                raws.extend(messages._raws)
                made.update((i + shift, m) for i, m in messages._made.items())
            else:  # Messages made already (an answer in the `records` form)
                bodies += [m.body for m in messages]
                raws.extend(_Raws([b""] * len(messages), [0] * len(messages), [0] * len(messages)))
                made.update((i + shift, m) for i, m in enumerate(messages))
            queue_ids += [queue_id] * len(messages)
            queue_offsets += offsets
        return cls(MessageRun(bodies, raws, made), queue_ids, queue_offsets)

    def __len__(self) -> int:
        return len(self.bodies)

    @overload
    def __getitem__(self, index: int) -> Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | list[Message]:
        return self._run[index]

    def __iter__(self) -> Iterator[Message]:
        return self._run.iter_from(0)

    def __repr__(self) -> str:
        return f"PolledBatch({len(self.bodies)} messages)"


_check_records: Callable[..., CheckedRecords] | None = None


def _decoded(
    blob: bytes, sizes: Iterable[int]
) -> tuple[list[bytes], _Raws, list[int], list[Undecodable]]:
    """The records of `blob` checked: (bodies, raw records, queue offsets, the records that
    failed), the failed ones left out of the others. DataLoss when the sizes do not fit the
    blob."""
    global _check_records  # noqa: PLW0603 - imported on the first decode (module docstring)
    if _check_records is None:
        from mqstore.formats.record_columns import check_records  # noqa: PLC0415 - numpy

        _check_records = check_records
    size_list = sizes if isinstance(sizes, list) else list(sizes)
    try:
        checked = _check_records(blob, size_list)
    except ValueError as err:
        raise DataLoss(f"an answer's records do not match their sizes: {err}") from None
    n = len(size_list)
    starts, ends = checked.starts.tolist(), checked.ends.tolist()
    bodies = checked.bodies
    why = {i: f"a record from the store fails its checks: {r}" for i, r in checked.failed}
    if checked.flags_any & sysflag.COMPRESSED:
        flags = checked.sys_flags.tolist()
        for i in range(n):
            if flags[i] & sysflag.COMPRESSED and i not in why:
                try:
                    bodies[i] = decompress(bodies[i], flags[i])
                except DataLoss as err:
                    why[i] = str(err)
    queue_offsets = checked.queue_offsets.tolist()
    if not why:
        return bodies, _Raws([blob] * n, starts, ends), queue_offsets, []
    failed = [
        Undecodable(i, _physical_offset(blob[starts[i] : ends[i]]), why[i]) for i in sorted(why)
    ]
    keep = [i for i in range(n) if i not in why]
    return (
        [bodies[i] for i in keep],
        _Raws([blob] * len(keep), [starts[i] for i in keep], [ends[i] for i in keep]),
        [queue_offsets[i] for i in keep],
        failed,
    )


def _physical_offset(raw: bytes) -> int:
    """A record's PHYSICALOFFSET field, -1 when it is too short to hold one (the store checked
    the field against where it read the record before it served it)."""
    if len(raw) < PHYSICAL_OFFSET_POS + _PHYSICAL_OFFSET.size:
        return -1
    return int(_PHYSICAL_OFFSET.unpack_from(raw, PHYSICAL_OFFSET_POS)[0])


def _fields_of(r: Record | CheckedFields) -> dict[str, Any]:
    """A Message's fields but the body, from a decoded record."""
    return {
        "topic": r.topic,
        "queue_id": r.queue_id,
        "queue_offset": r.queue_offset,
        "commit_log_offset": r.physical_offset,
        "properties": decode_properties(r.properties),
        "store_timestamp_ms": r.store_timestamp_ms,
        "born_timestamp_ms": r.born_timestamp_ms,
        "store_host": host_text(r.store_host),
        "born_host": host_text(r.born_host),
        "sys_flag": r.sys_flag,
        "flag": r.flag,
        "reconsume_times": r.reconsume_times,
        "size": r.total_size,
        "msg_id": offset_msg_id(r.store_host, r.physical_offset),
    }
