"""The fast paths of the record codec agree with the reference paths, byte for byte.

record_batch.BatchEncoder (the append path) must write exactly what record.encode_record writes,
and record.scan_run (the recovery walk) must accept exactly what record.read_record accepts.
"""

from __future__ import annotations

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats.record import (
    Bad,
    Blank,
    Record,
    encode_blank,
    encode_record,
    pack_host,
    read_record,
    scan_run,
)
from mqstore.formats.record_batch import (
    BatchEncoder,
    MessageBatch,
    table_from_pairs,
    undo_queue_offsets,
)
from mqstore.limits import MessageLimits

topics = st.from_regex(r"[A-Za-z0-9_%|-]{1,20}", fullmatch=True)
hosts = st.sampled_from([pack_host("10.0.0.7", 9876), pack_host("2001:db8::1", 10911)])
tx_flags = st.sampled_from(
    [
        sysflag.TRANSACTION_NOT_TYPE,
        sysflag.TRANSACTION_PREPARED_TYPE,
        sysflag.TRANSACTION_COMMIT_TYPE,
        sysflag.TRANSACTION_ROLLBACK_TYPE,
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    topic=topics,
    store_host=hosts,
    born_host=hosts,
    messages=st.lists(
        st.tuples(st.integers(0, 7), st.binary(max_size=300), st.binary(max_size=60), tx_flags),
        min_size=1,
        max_size=24,
    ),
    base=st.integers(0, 1 << 40),
    store_ts=st.integers(0, 1 << 45),
    one_length=st.booleans(),
)
def test_batch_encoder_writes_the_reference_bytes(
    topic: str,
    store_host: bytes,
    born_host: bytes,
    messages: list[tuple[int, bytes, bytes, int]],
    base: int,
    store_ts: int,
    one_length: bool,
) -> None:
    # one_length: every message's properties of one length, as a producer's batch has them
    # (the encoder then joins the topic and that length into one part a record)
    props = [p[:20].ljust(20, b"p") if one_length else p for _, _, p, _ in messages]
    batch = MessageBatch(
        topic=topic,
        queue_ids=[q for q, _, _, _ in messages],
        bodies=[b for _, b, _, _ in messages],
        properties=[p + b"\x02" if p else p for p in props],
        sys_flags=[f for _, _, _, f in messages],
        flag=7,
        born_timestamp_ms=123_456,
        born_host=born_host,
        reconsume_times=2,
        prepared_tx_offset=99,
    )
    table: dict[str, dict[int, int]] = {}
    encoded = BatchEncoder(store_host, MessageLimits()).encode(
        [batch], base_offset=base, store_timestamp_ms=store_ts, queue_table=table
    )
    assert not encoded.refused
    expected_next: dict[int, int] = {}
    reference = b""
    for j, (queue_id, body, _, tx) in enumerate(messages):
        takes = tx in (sysflag.TRANSACTION_NOT_TYPE, sysflag.TRANSACTION_COMMIT_TYPE)
        queue_offset = expected_next.get(queue_id, 0) if takes else 0
        if takes:
            expected_next[queue_id] = queue_offset + 1
        assert encoded.queue_offsets[j] == queue_offset
        reference += encode_record(
            topic=topic,
            queue_id=queue_id,
            body=body,
            properties=batch.properties[j],  # type: ignore[index]
            flag=7,
            queue_offset=queue_offset,
            physical_offset=base + len(reference),
            sys_flag=tx,
            born_timestamp_ms=123_456,
            born_host=born_host,
            store_timestamp_ms=store_ts,
            store_host=store_host,
            reconsume_times=2,
            prepared_tx_offset=99,
        )
    assert encoded.blob == reference
    assert table.get(topic, {}) == expected_next


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


def test_relocate_moves_every_physical_offset() -> None:
    batch = MessageBatch(topic="T", queue_ids=[0, 1], bodies=[b"one", b"two"])
    encoded = BatchEncoder(pack_host("127.0.0.1", 1), MessageLimits()).encode(
        [batch], base_offset=100, store_timestamp_ms=0, queue_table={}
    )
    encoded.relocate(4096)
    for pos in encoded.positions:
        found = read_record(bytes(encoded.blob), pos, encoded.nbytes, expected_offset=4096 + pos)
        assert isinstance(found, Record)


def _log_bytes(rng: random.Random, count: int) -> bytes:
    out = b""
    for i in range(count):
        out += encode_record(
            # The long retry topic is written with the V2 magic (2-byte topic length).
            topic=rng.choice(["A", "Bb", "%RETRY%" + "a" * 125]),
            queue_id=rng.randrange(4),
            body=rng.randbytes(rng.randrange(0, 200)),
            properties=b"KEYS\x01k\x02" if i % 2 else b"",
            physical_offset=len(out),
            queue_offset=i,
            born_host=pack_host("::1", 5) if i % 3 == 0 else pack_host("1.2.3.4", 5),
        )
    return out


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), flips=st.lists(st.integers(0, 10_000), max_size=3))
def test_scan_run_accepts_exactly_what_read_record_accepts(seed: int, flips: list[int]) -> None:
    rng = random.Random(seed)
    data = bytearray(_log_bytes(rng, 8) + encode_blank(64) + bytes(56))
    for flip in flips:
        data[flip % len(data)] ^= 1 << (flip % 8)
    end = len(data)
    pos, walked, stop = scan_run(bytes(data), 0, end, 0, check_crc=True)
    # The reference walk.
    ref_pos, ref_walked = 0, 0
    while ref_pos < end:
        found = read_record(bytes(data), ref_pos, end, check_crc=True, expected_offset=ref_pos)
        if not isinstance(found, Record):
            break
        ref_pos += found.total_size
        ref_walked += 1
    assert (pos, walked) == (ref_pos, ref_walked)
    if stop is not None:
        assert isinstance(stop, Bad | Blank)


def test_scan_run_rebuilds_queue_offsets_from_apply_from() -> None:
    data = b""
    for i in range(6):
        data += encode_record(
            topic="T", queue_id=i % 2, body=b"x", queue_offset=i // 2, physical_offset=len(data)
        )
    first_size = struct.unpack_from(">i", data, 0)[0]
    table: dict[str, dict[int, int]] = {"T": {0: 1}}
    pos, walked, stop = scan_run(data, 0, len(data), 0, queue_table=table, apply_from=first_size)
    assert (pos, walked, stop) == (len(data), 6, None)
    assert table == {"T": {0: 3, 1: 3}}
