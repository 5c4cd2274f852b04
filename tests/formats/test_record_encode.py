"""record_batch.BatchEncoder (the append path, the compiled core's `encode`) writes what
record.py's reference encoder writes, byte for byte, and refuses what it refuses.

Over random batches of every record shape (V1 and V2 magic, IPv4 and IPv6 born and store
hosts, empty bodies and properties, bodies that are not bytes, every transaction type per
message or per batch, several batches and topics in one call, more queues in a batch than the
encoder counts in C at once, with and without the whole-record CRC) and bad input (bodies,
properties and topics over tight limits, queue ids out of range, properties not ending with
0x02, born hosts of the wrong size, topics not allowed): the same records, the same queue
offsets taken from and left in the queue table, and for each refused message the same error
(type, message, field) that `prepare_message` raises for it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import InvalidArgument
from mqstore.formats import sysflag
from mqstore.formats.record import (
    IPV6_HOST_BYTES,
    Record,
    encode_record,
    pack_host,
    prepare_message,
    read_record,
    write_prepared,
)
from mqstore.formats.record_batch import (
    BatchEncoder,
    MessageBatch,
    table_from_pairs,
    undo_queue_offsets,
)
from mqstore.limits import MessageLimits

V4 = pack_host("10.0.0.7", 9876)
V6 = pack_host("2001:db8::1", 10911)
TX = [
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_PREPARED_TYPE,
    sysflag.TRANSACTION_COMMIT_TYPE,
    sysflag.TRANSACTION_ROLLBACK_TYPE,
]
TOPICS = ["A", "orders", "x" * 20, "%RETRY%" + "r" * 125, "%DLQ%" + "d" * 200, "bad topic", ""]
LIMITS = [
    MessageLimits(),
    MessageLimits(body_bytes_max=40, properties_bytes_max=60, queue_id_max=30),
    MessageLimits(topic_bytes_max=10, system_topic_bytes_max=150, properties_bytes_max=21),
    # The whole record over the largest: a long topic and long properties together.
    MessageLimits(body_bytes_max=100, system_topic_bytes_max=32_767, properties_bytes_max=32_767),
]


@st.composite
def batches(draw: st.DrawFn) -> MessageBatch:
    n = draw(st.integers(1, 12))
    many_queues = draw(st.booleans())  # more distinct queues than the C counters hold
    queue_ids = draw(st.lists(st.integers(-1, 40 if many_queues else 3), min_size=n, max_size=n))
    bodies: list[Any] = draw(st.lists(st.binary(max_size=120), min_size=n, max_size=n))
    if draw(st.booleans()):
        bodies = [bytearray(b) if k % 2 else memoryview(b) for k, b in enumerate(bodies)]
    props: list[bytes] | None = None
    if draw(st.booleans()):
        props = [
            p if draw(st.integers(0, 9)) == 0 else p + b"\x02"  # mostly well-ended
            for p in draw(st.lists(st.binary(max_size=80), min_size=n, max_size=n))
        ]
    per_message = draw(st.booleans())
    topic = draw(st.sampled_from(TOPICS))
    if topic.startswith("%DLQ%") and draw(st.booleans()):
        topic = "%DLQ%" + "d" * 32_000  # with LIMITS[3]: records over the largest
        props = [b"k\x01" + b"v" * 700 + b"\x02"] * n
    return MessageBatch(
        topic=topic,
        queue_ids=queue_ids,
        bodies=bodies,
        properties=props,
        sys_flags=draw(st.lists(st.sampled_from(TX), min_size=n, max_size=n))
        if per_message
        else None,
        sys_flag=draw(st.sampled_from(TX)) | draw(st.sampled_from([0, 0x30, 0x1])),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        born_timestamp_ms=draw(st.integers(0, 2**62)),
        born_host=draw(st.sampled_from([V4, V6, V4, V6, b"\x01\x02\x03"])),
        reconsume_times=draw(st.integers(0, 16)),
        prepared_tx_offset=draw(st.integers(0, 2**40)),
    )


def reference(
    batches: list[MessageBatch],
    store_host: bytes,
    limits: MessageLimits,
    record_crc: bool,
    base: int,
    store_ts: int,
    table: dict[str, dict[int, int]],
) -> tuple[bytes, list[int], list[tuple[int, type, str, str]]]:
    """record.py's encoder, one message at a time: the records, their queue offsets and the
    refusals."""
    out = bytearray()
    queue_offsets: list[int] = []
    refused = []
    index = 0
    for batch in batches:
        for k, body in enumerate(batch.bodies):
            flag = batch.sys_flags[k] if batch.sys_flags is not None else batch.sys_flag
            try:
                msg = prepare_message(
                    topic=batch.topic,
                    queue_id=batch.queue_ids[k],
                    body=body,
                    properties=batch.properties[k] if batch.properties is not None else b"",
                    flag=batch.flag,
                    sys_flag=flag,
                    born_timestamp_ms=batch.born_timestamp_ms,
                    born_host=batch.born_host,
                    reconsume_times=batch.reconsume_times,
                    prepared_tx_offset=batch.prepared_tx_offset,
                    store_host_v6=len(store_host) == IPV6_HOST_BYTES,
                    limits=limits,
                    record_crc=record_crc,
                )
            except InvalidArgument as exc:
                refused.append((index + k, type(exc), str(exc), exc.field))
                continue
            queue_offset = 0
            if msg.gets_queue_offset:
                queues = table.setdefault(batch.topic, {})
                queue_offset = queues.get(msg.queue_id, 0)
                queues[msg.queue_id] = queue_offset + 1
            queue_offsets.append(queue_offset)
            pos = len(out)
            out += bytes(msg.size)
            write_prepared(
                out,
                pos,
                msg,
                queue_offset=queue_offset,
                physical_offset=base + pos,
                store_timestamp_ms=store_ts,
                store_host=store_host,
            )
        index += len(batch)
    return bytes(out), queue_offsets, refused


@settings(max_examples=200, deadline=None)
@given(
    batch_list=st.lists(batches(), min_size=1, max_size=3),
    store_host=st.sampled_from([V4, V6]),
    limits=st.sampled_from(LIMITS),
    record_crc=st.booleans(),
    base=st.integers(0, 1 << 50),
    store_ts=st.integers(0, 1 << 45),
    start=st.dictionaries(
        st.tuples(st.sampled_from(TOPICS[:3]), st.integers(0, 3)), st.integers(0, 1 << 40)
    ),
)
def test_the_encoder_writes_and_refuses_as_the_reference(
    batch_list: list[MessageBatch],
    store_host: bytes,
    limits: MessageLimits,
    record_crc: bool,
    base: int,
    store_ts: int,
    start: dict[tuple[str, int], int],
) -> None:
    table = table_from_pairs(start)
    encoded = BatchEncoder(store_host, limits, record_crc=record_crc).encode(
        batch_list, base_offset=base, store_timestamp_ms=store_ts, queue_table=table
    )
    ref_table = table_from_pairs(start)
    blob, queue_offsets, refused = reference(
        batch_list, store_host, limits, record_crc, base, store_ts, ref_table
    )
    assert encoded.blob == blob
    assert encoded.queue_offsets == queue_offsets
    assert table == ref_table
    assert [(i, type(e), str(e), e.field) for i, e in encoded.refused] == refused
    assert encoded.count == sum(map(len, batch_list))
    records = [read_record(blob, o - base, len(blob), expected_offset=o) for o in encoded.offsets]
    assert all(isinstance(r, Record) for r in records)
    assert [r.total_size for r in records] == encoded.sizes  # type: ignore[union-attr]
    assert [r.sys_flag for r in records] == encoded.sys_flags  # type: ignore[union-attr]
    assert sum(encoded.sizes) == encoded.nbytes


def test_refused_messages_take_no_queue_offset_and_undo_restores_the_table() -> None:
    limits = MessageLimits(body_bytes_max=10)
    batch = MessageBatch(
        topic="T", queue_ids=[0, 0, 70_000, 0], bodies=[b"a", b"x" * 11, b"b", b"c"]
    )
    table = table_from_pairs({("T", 0): 5})
    encoded = BatchEncoder(pack_host("127.0.0.1", 1), limits).encode(
        [batch], base_offset=0, store_timestamp_ms=0, queue_table=table
    )
    assert [i for i, _ in encoded.refused] == [1, 2]
    assert encoded.accepted() == [0, 3]
    assert encoded.queue_offsets == [5, 6]
    assert table == {"T": {0: 7}}
    undo_queue_offsets([batch], encoded, table)
    assert table == {"T": {0: 5}}


def test_a_batch_whose_columns_differ_in_length_is_refused_whole() -> None:
    bad = MessageBatch(topic="T", queue_ids=[0], bodies=[b"a", b"b"])
    good = MessageBatch(topic="T", queue_ids=[0], bodies=[b"c"])
    table: dict[str, dict[int, int]] = {}
    encoded = BatchEncoder(V4, MessageLimits()).encode(
        [bad, good], base_offset=0, store_timestamp_ms=0, queue_table=table
    )
    assert [(i, e.field) for i, e in encoded.refused] == [(0, "queue_ids"), (1, "queue_ids")]
    assert encoded.accepted() == [2] and table == {"T": {0: 1}}


def test_relocate_moves_every_physical_offset_and_its_crc() -> None:
    batch = MessageBatch(topic="T", queue_ids=[0, 1], bodies=[b"one", b"two"])
    encoded = BatchEncoder(V4, MessageLimits()).encode(
        [batch], base_offset=100, store_timestamp_ms=7, queue_table={}
    )
    encoded.relocate(4096)
    assert encoded.offsets == [4096, 4096 + encoded.sizes[0]]
    expected = b"".join(
        encode_record(
            topic="T",
            queue_id=q,
            body=body,
            physical_offset=offset,
            born_host=batch.born_host,
            store_timestamp_ms=7,
            store_host=V4,
        )
        for q, body, offset in zip([0, 1], batch.bodies, encoded.offsets, strict=True)
    )
    assert bytes(encoded.blob) == expected
