"""The wire bytes of an append and of its answer, written from columns in one pass.

An AppendRequest (protos/mqstore/commitlog/v1/commitlog.proto) carries every message's body
and properties. Built through the protobuf runtime, each body was copied into the message and
copied again when the message was serialized, and each column crossed into it one Python
object at a time: a third of the SDK producer's Python time at 1 KiB bodies. The producer
writes the request's bytes itself instead, from the columns it has in hand; the commit log
likewise writes each AppendResponse from its result columns (its response serializer passes
bytes through, mqstore/rpc/admission.py), never filling a message field by field.

The compiled core does the writing (`_core.append_request_wire`, `_core.append_response_wire`,
formats/_core_append.pxi); this module is their plain-Python reference, pinned to them byte for
byte by tests/formats/test_append_wire.py, which also pins both to what the protobuf runtime
parses out of them. The producer reads each answer back the same way
(`read_append_response`: its columns as lists in one pass, where a protobuf message handed
them over a number at a time), and `share_bounds` cuts a send_batch into requests
(client/batch.py), a per-message sum and search the core does in one pass.

The layout is proto3's: fields in field-number order, a field at its default left out,
repeated numbers packed, an int32 or int64 below zero as ten varint bytes.

    AppendRequest   1 batches (MessageBatch, length-delimited)   2 producer_id   3 sequence
    MessageBatch    1 topic   2 queue_ids (packed)   3 bodies   4 properties
                    5 sys_flags (packed)   8 born_timestamp_ms
    AppendResponse  1 statuses (packed)   2 commit_log_offsets (packed)   3 sizes (packed)
                    4 queue_offsets (packed)   5 store_timestamp_ms   6 store_host
                    7 refusals (Refusal: 1 index, 2 status, 3 reason, 4 field)
                    8 duplicate   9 sequence

Only the fields the producer and the store set are written: a batch's shared sys_flag, flag,
born_host, reconsume_times and prepared_tx_offset stay at their defaults (the producer never
sets them), and an answer's `error` is _refused_answer's, made apart (commitlog_svc).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

# One batch of a request: topic, queue ids, bodies, properties (one blob per message),
# sys flags (empty: every message's is 0) and the born time in ms.
WireBatch = tuple[str, Sequence[int], Sequence[bytes], Sequence[bytes], Sequence[int], int]
# One refused message of an answer: its index, PutStatus number, reason and field at fault.
WireRefusal = tuple[int, int, str, str]

_LEN = 2  # wire type: length-delimited
_VARINT = 0
_U64 = (1 << 64) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _signed(value: int, lo: int, hi: int) -> bytes:
    """An int32 or int64 (or enum) as its varint: a negative one sign-extended to 64 bits."""
    if not lo <= value <= hi:
        raise ValueError(f"{value} is out of range [{lo}, {hi}]")
    return _varint(value & _U64)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _delimited(field: int, payload: bytes) -> bytes:
    return _key(field, _LEN) + _varint(len(payload)) + payload


def _packed(field: int, values: Sequence[int], lo: int, hi: int) -> bytes:
    if not values:
        return b""
    return _delimited(field, b"".join(_signed(v, lo, hi) for v in values))


def _scalar(field: int, value: int, lo: int, hi: int) -> bytes:
    return _key(field, _VARINT) + _signed(value, lo, hi) if value else b""


def _uint64(field: int, value: int) -> bytes:
    if not 0 <= value <= _U64:
        raise ValueError(f"{value} is out of range [0, {_U64}]")
    return _key(field, _VARINT) + _varint(value) if value else b""


def _text(field: int, value: str) -> bytes:
    return _delimited(field, value.encode()) if value else b""


def _blob(field: int, value: bytes) -> bytes:
    return _delimited(field, bytes(value)) if value else b""


def message_batch_wire(batch: WireBatch) -> bytes:
    """One MessageBatch's fields (without its own key and length)."""
    topic, queue_ids, bodies, properties, sys_flags, born_ms = batch
    return b"".join(
        (
            _text(1, topic),
            _packed(2, queue_ids, _INT32_MIN, _INT32_MAX),
            b"".join(_delimited(3, bytes(b)) for b in bodies),
            b"".join(_delimited(4, bytes(p)) for p in properties),
            _packed(5, sys_flags, _INT32_MIN, _INT32_MAX),
            _scalar(8, born_ms, _INT64_MIN, _INT64_MAX),
        )
    )


def append_request_wire(producer_id: str, sequence: int, batches: Sequence[WireBatch]) -> bytes:
    """An AppendRequest's bytes: `batches` in order, then the producer id and sequence."""
    return b"".join(
        (
            b"".join(_delimited(1, message_batch_wire(b)) for b in batches),
            _text(2, producer_id),
            _uint64(3, sequence),
        )
    )


def append_response_wire(
    statuses: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    queue_offsets: Sequence[int],
    store_timestamp_ms: int,
    store_host: bytes,
    refusals: Sequence[WireRefusal],
    duplicate: bool,
    sequence: int,
) -> bytes:
    """An AppendResponse's bytes: the per-message columns, then the shared fields."""
    return b"".join(
        (
            _packed(1, statuses, _INT32_MIN, _INT32_MAX),
            _packed(2, offsets, _INT64_MIN, _INT64_MAX),
            _packed(3, sizes, _INT32_MIN, _INT32_MAX),
            _packed(4, queue_offsets, _INT64_MIN, _INT64_MAX),
            _scalar(5, store_timestamp_ms, _INT64_MIN, _INT64_MAX),
            _blob(6, store_host),
            b"".join(
                _delimited(
                    7,
                    _scalar(1, index, _INT32_MIN, _INT32_MAX)
                    + _scalar(2, status, _INT32_MIN, _INT32_MAX)
                    + _text(3, reason)
                    + _text(4, field),
                )
                for index, status, reason, field in refusals
            ),
            _uint64(8, 1) if duplicate else b"",
            _uint64(9, sequence),
        )
    )


def share_bounds(
    bodies: Sequence[bytes],
    properties: Sequence[bytes],
    overhead: int,
    share_messages: int,
    share_bytes: int,
) -> list[tuple[int, int, int]]:
    """Split messages into shares of at most share_messages and about share_bytes (a message
    heavier than share_bytes makes a share of its own), a message weighing its body, its
    properties and `overhead`: (first, end, weight) each."""
    n = len(bodies)
    if len(properties) != n:
        raise ValueError(f"{len(properties)} properties for {n} bodies")
    if share_messages < 1:
        raise ValueError("a share holds at least one message")
    weights = [len(b) + len(p) + overhead for b, p in zip(bodies, properties, strict=True)]
    totals = [0, *accumulate(weights)]
    shares: list[tuple[int, int, int]] = []
    first = 0
    while first < n:
        end = min(n, first + share_messages)
        if totals[end] - totals[first] > share_bytes:
            # The longest run from `first` within share_bytes (at least one message).
            lo, hi = first + 1, end
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if totals[mid] - totals[first] <= share_bytes:
                    lo = mid
                else:
                    hi = mid - 1
            end = lo
        shares.append((first, end, totals[end] - totals[first]))
        first = end
    return shares


# An AppendResponse read back: statuses, commit-log offsets, sizes, queue offsets (columns),
# store time, store host, refusals, duplicate, sequence, and the request's error (code, message,
# field) or None.
AnswerColumns = tuple[
    list[int],
    list[int],
    list[int],
    list[int],
    int,
    bytes,
    list[WireRefusal],
    bool,
    int,
    tuple[int, str, str] | None,
]


def _read_varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift >= 70:
            raise ValueError("a truncated or overlong varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value & _U64, at


def _as_int(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _fields(data: bytes, at: int, end: int) -> list[tuple[int, int, int | bytes]]:
    """(field, wire type, value) of each field in data[at:end]: a varint's number, a
    length-delimited field's bytes; fixed-width fields are skipped, groups refused."""
    out: list[tuple[int, int, int | bytes]] = []
    while at < end:
        key, at = _read_varint(data, at, end)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise ValueError("field number 0")
        if wire_type == _VARINT:
            value, at = _read_varint(data, at, end)
            out.append((field, wire_type, value))
        elif wire_type == _LEN:
            length, at = _read_varint(data, at, end)
            if length > end - at:
                raise ValueError("a truncated length-delimited field")
            out.append((field, wire_type, data[at : at + length]))
            at += length
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
            if at > end:
                raise ValueError("a truncated fixed-width field")
        else:
            raise ValueError(f"wire type {wire_type} is not read here")
    return out


def _numbers(wire_type: int, value: int | bytes, bits: int) -> list[int]:
    """A repeated number field's elements in one occurrence: packed, or one varint."""
    if isinstance(value, int):
        return [_as_int(value, bits)]
    out = []
    at = 0
    while at < len(value):
        v, at = _read_varint(value, at, len(value))
        out.append(_as_int(v, bits))
    return out


def read_append_response(data: bytes) -> AnswerColumns:
    """An AppendResponse's fields from its bytes, as protobuf reads them: a repeated number
    packed or not, the last of a scalar field, sub-messages of one field merged, unknown fields
    skipped. Malformed bytes (and text that is not UTF-8) raise ValueError."""
    columns: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
    bits = {1: 32, 2: 64, 3: 32, 4: 64}
    store_ts, host, duplicate, sequence = 0, b"", False, 0
    refusals: list[WireRefusal] = []
    error: list[int | str] | None = None
    for field, wire_type, value in _fields(data, 0, len(data)):
        if field in bits and wire_type in (_VARINT, _LEN):
            columns[field - 1].extend(_numbers(wire_type, value, bits[field]))
        elif wire_type == _VARINT:
            assert isinstance(value, int)
            if field == 5:
                store_ts = _as_int(value, 64)
            elif field == 8:
                duplicate = value != 0
            elif field == 9:
                sequence = value
        elif isinstance(value, bytes):
            if field == 6:
                host = value
            elif field == 7:
                refusal: list[int | str] = [0, 0, "", ""]
                _merge(refusal, value)
                index, status, reason, field_at = refusal
                assert isinstance(index, int) and isinstance(status, int)
                refusals.append((index, status, str(reason), str(field_at)))
            elif field == 10:
                if error is None:
                    error = [0, "", ""]
                _merge(error, value)
    return (
        *columns,
        store_ts,
        host,
        refusals,
        duplicate,
        sequence,
        None if error is None else (int(error[0]), str(error[1]), str(error[2])),
    )


def _merge(into: list[int | str], data: bytes) -> None:
    """A Refusal or RequestError's fields into `into` (field n at n - 1): the int32 numbers
    first, then the strings."""
    for field, wire_type, value in _fields(data, 0, len(data)):
        if not 1 <= field <= len(into):
            continue
        if isinstance(into[field - 1], int) and wire_type == _VARINT:
            assert isinstance(value, int)
            into[field - 1] = _as_int(value, 32)
        elif isinstance(into[field - 1], str) and isinstance(value, bytes):
            into[field - 1] = value.decode()


def widest_bytes(items: Sequence[object]) -> int:
    """The length of the longest item (0 for none), or -1 when an item is not exactly bytes:
    a send_batch's bodies and properties checked and measured in one pass."""
    if any(type(item) is not bytes for item in items):
        return -1
    return max(map(len, items), default=0)  # type: ignore[arg-type]
