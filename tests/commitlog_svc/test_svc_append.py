"""Append and AppendStream through a real server: results column by column, every refusal as a
status with its reason and field, every bad request as INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest

from commitlog_svc.commitlog import DISK_FULL_RETRY_MS
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import pack_host, unpack_host
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.simdisk import SimDisk
from tests.answers import records_of
from tests.commitlog_svc.support import (
    FILE_BYTES,
    TOPIC,
    Running,
    batch,
    body_for,
    parse,
    rpc_error,
)


def test_append_stores_batches_in_order_with_offsets_queue_offsets_and_msg_ids(
    svc: Running,
) -> None:
    first = batch(0, 3, queues=2)  # queues 0, 1, 0
    second = batch(3, 2, topic="Other", queues=1)
    response = svc.append_ok(first, second, sequence=7)

    assert len(response.statuses) == 5 and not response.refusals
    assert response.sequence == 7 and not response.duplicate
    offsets, sizes = list(response.commit_log_offsets), list(response.sizes)
    assert offsets[0] == 0
    assert all(offsets[i + 1] == offsets[i] + sizes[i] for i in range(4)), "one contiguous write"
    assert list(response.queue_offsets) == [0, 0, 1, 0, 1]
    assert response.store_host == pack_host("127.0.0.1", svc.service.host.port)
    assert svc.status().max_offset == offsets[-1] + sizes[-1]

    messages = [
        *zip(first.bodies, [TOPIC] * 3, strict=True),
        *zip(second.bodies, ["Other"] * 2, strict=True),
    ]
    for i, (body, topic) in enumerate(messages):
        got = svc.stub.GetMessage(
            pb.GetMessageRequest(msg_id=offset_msg_id(response.store_host, offsets[i]))
        )
        assert (got.body, got.topic, got.queue_offset) == (body, topic, response.queue_offsets[i])
        assert got.store_timestamp_ms == response.store_timestamp_ms
        assert got.keys == f"key-{i}"


def test_a_message_without_born_host_is_born_at_the_callers_address(svc: Running) -> None:
    given = svc.append_ok(batch(0, 1, born_host="10.1.2.3:4567"))
    unset = svc.append_ok(batch(1, 1))
    read = svc.stub.Read(
        pb.ReadRequest(
            offsets=[given.commit_log_offsets[0], unset.commit_log_offsets[0]],
            sizes=[given.sizes[0], unset.sizes[0]],
        )
    )
    assert unpack_host(parse(records_of(read)[0]).born_host) == ("10.1.2.3", 4567)
    ip, port = unpack_host(parse(records_of(read)[1]).born_host)
    assert ip == "127.0.0.1" and port > 0  # the client's side of the connection


def test_an_ipv6_born_host_is_stored_as_20_bytes(svc: Running) -> None:
    response = svc.append_ok(batch(0, 1, born_host="[::1]:9876"))
    got = svc.stub.GetMessage(
        pb.GetMessageRequest(
            msg_id=offset_msg_id(response.store_host, response.commit_log_offsets[0])
        )
    )
    assert got.born_host == "[::1]:9876"


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_append_stream_answers_pipelined_requests_in_order(
    start: Callable[..., Running], flush: str
) -> None:
    svc = start(flush=flush)
    requests = [pb.AppendRequest(batches=[batch(i * 5, 5)], sequence=100 + i) for i in range(30)]
    # The iterator hands requests over as fast as gRPC takes them: all are in flight at once.
    responses = list(svc.stub.AppendStream(iter(requests), timeout=60))

    assert [r.sequence for r in responses] == [100 + i for i in range(30)]
    offsets = [o for r in responses for o in r.commit_log_offsets]
    assert offsets == sorted(offsets) and len(set(offsets)) == 150
    assert all(s == pb.PUT_OK for r in responses for s in r.statuses)
    queue0 = [
        q for r in responses for q, i in zip(r.queue_offsets, range(5), strict=True) if i % 4 == 0
    ]
    assert queue0 == sorted(queue0)
    status = svc.status()
    assert status.max_offset == offsets[-1] + responses[-1].sizes[-1]
    if flush == "sync":
        assert status.flushed_offset >= status.max_offset  # answered = durable


def _too_many() -> pb.AppendRequest:
    return pb.AppendRequest(
        batches=[pb.MessageBatch(topic=TOPIC, queue_ids=[0] * 10_001, bodies=[b"x"] * 10_001)]
    )


BAD_REQUESTS: dict[str, tuple[Callable[[], pb.AppendRequest], str]] = {
    "no batches": (pb.AppendRequest, "batches"),
    "an empty batch": (
        lambda: pb.AppendRequest(batches=[batch(0, 1), pb.MessageBatch(topic=TOPIC)]),
        "batches[1].bodies",
    ),
    "queue ids short": (
        lambda: pb.AppendRequest(
            batches=[pb.MessageBatch(topic=TOPIC, queue_ids=[0], bodies=[b"a", b"b"])]
        ),
        "batches[0].queue_ids",
    ),
    "properties short": (
        lambda: pb.AppendRequest(
            batches=[
                batch(0, 1),
                pb.MessageBatch(
                    topic=TOPIC, queue_ids=[0, 0], bodies=[b"a", b"b"], properties=[b""]
                ),
            ]
        ),
        "batches[1].properties",
    ),
    "sys flags short": (
        lambda: pb.AppendRequest(
            batches=[
                pb.MessageBatch(topic=TOPIC, queue_ids=[0, 0], bodies=[b"a", b"b"], sys_flags=[0])
            ]
        ),
        "batches[0].sys_flags",
    ),
    "born host not ip:port": (
        lambda: pb.AppendRequest(batches=[batch(0, 1, born_host="localhost")]),
        "batches[0].born_host",
    ),
    "born host port too big": (
        lambda: pb.AppendRequest(batches=[batch(0, 1, born_host="1.2.3.4:70000")]),
        "batches[0].born_host",
    ),
    "reserved property": (
        lambda: pb.AppendRequest(
            batches=[
                pb.MessageBatch(
                    topic=TOPIC,
                    queue_ids=[0],
                    bodies=[b"a"],
                    properties=[encode_properties({"KEYS": "k", "MQS_PSEQ": "p:1:1:"})],
                )
            ]
        ),
        "batches[0].properties",
    ),
    "producer id with a separator": (
        lambda: pb.AppendRequest(batches=[batch(0, 1)], producer_id="p\x01", sequence=1),
        "producer_id",
    ),
    "too many messages": (_too_many, "batches"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_append_request_is_invalid_argument_naming_the_field_and_stores_nothing(
    svc: Running, case: str
) -> None:
    make, field = BAD_REQUESTS[case]
    svc.append_ok(batch(0, 1))
    end = svc.status().max_offset
    code, message, got_field = rpc_error(lambda: svc.stub.Append(make(), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    assert got_field == field
    assert svc.status().max_offset == end


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_malformed_request_on_an_append_stream_is_answered_alone_and_the_stream_goes_on(
    svc: Running, case: str
) -> None:
    """Good, malformed, good on one stream: both good requests are stored and answered in
    order; the malformed one is answered in its turn with INVALID_ARGUMENT naming the field,
    nothing of it stored (before: the stream ended there and the request after it was never
    answered nor stored)."""
    make, field = BAD_REQUESTS[case]
    bad = make()
    bad.sequence = 2
    requests = [
        pb.AppendRequest(batches=[batch(0, 2)], sequence=1),
        bad,
        pb.AppendRequest(batches=[batch(2, 3)], sequence=3),
    ]
    before = svc.status().max_offset
    answered = list(svc.stub.AppendStream(iter(requests), timeout=30))

    assert [r.sequence for r in answered] == [1, 2, 3]
    first, refused, last = answered
    for good, n in ((first, 2), (last, 3)):
        assert not good.HasField("error")
        assert list(good.statuses) == [pb.PUT_OK] * n
    assert refused.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert refused.error.field == field
    assert refused.error.message
    assert list(refused.statuses) == [] and list(refused.commit_log_offsets) == []
    # Both good requests, and nothing else, were stored: contiguous, in request order.
    assert first.commit_log_offsets[0] == before
    assert last.commit_log_offsets[0] == first.commit_log_offsets[-1] + first.sizes[-1]
    assert svc.status().max_offset == last.commit_log_offsets[-1] + last.sizes[-1]
    stored = svc.stub.Read(
        pb.ReadRequest(
            offsets=[*first.commit_log_offsets, *last.commit_log_offsets],
            sizes=[*first.sizes, *last.sizes],
        )
    )
    assert [parse(r).body for r in records_of(stored)] == [body_for(i) for i in range(5)]


def test_a_property_merely_ending_in_the_reserved_name_is_accepted(svc: Running) -> None:
    props = encode_properties({"MY_MQS_PSEQ": "x", "KEYS": "k"})
    svc.append_ok(pb.MessageBatch(topic=TOPIC, queue_ids=[0], bodies=[b"a"], properties=[props]))


@pytest.mark.parametrize(
    "properties",
    [
        [encode_properties({"KEYS": "k", "__CRC32#": "1234567890"})],
        [b"", encode_properties({"__CRC32#": "0000000001", "KEYS": "k"})],
    ],
    ids=["last-property", "first-property-of-the-second-message"],
)
def test_the_record_crc_property_is_reserved_for_the_store(
    svc: Running, properties: list[bytes]
) -> None:
    """__CRC32# is the whole-record CRC the store ends every record with: a producer naming it
    is refused as a whole (INVALID_ARGUMENT naming the field), as MQS_PSEQ is."""
    end = svc.status().max_offset
    request = pb.AppendRequest(
        batches=[
            pb.MessageBatch(
                topic=TOPIC,
                queue_ids=[0] * len(properties),
                bodies=[b"a"] * len(properties),
                properties=properties,
            )
        ]
    )
    code, message, field = rpc_error(lambda: svc.stub.Append(request, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "__CRC32#" in message
    assert field == "batches[0].properties"
    assert svc.status().max_offset == end


def test_messages_over_a_limit_are_refused_alone_with_reason_and_field(svc: Running) -> None:
    too_many_props = encode_properties({"P": "x" * 33_000})
    good = encode_properties({"KEYS": "k"})
    response = svc.append(
        pb.MessageBatch(
            topic=TOPIC,
            queue_ids=[0, 1, 70_000, 2],
            bodies=[b"a", b"b", b"c", b"d"],
            properties=[good, too_many_props, good, good],
        ),
        pb.MessageBatch(topic="bad topic!", queue_ids=[0], bodies=[b"e"]),
        pb.MessageBatch(topic=TOPIC, queue_ids=[0], bodies=[b"f"]),
    )
    statuses = list(response.statuses)
    assert statuses == [
        pb.PUT_OK,
        pb.PROPERTIES_SIZE_EXCEEDED,
        pb.MESSAGE_ILLEGAL,
        pb.PUT_OK,
        pb.MESSAGE_ILLEGAL,
        pb.PUT_OK,
    ]
    refusals = {r.index: (r.status, r.field) for r in response.refusals}
    assert refusals == {
        1: (pb.PROPERTIES_SIZE_EXCEEDED, "properties"),
        2: (pb.MESSAGE_ILLEGAL, "queue_id"),
        4: (pb.MESSAGE_ILLEGAL, "topic"),
    }
    assert all(r.reason for r in response.refusals)
    for i in (1, 2, 4):
        assert response.commit_log_offsets[i] == -1 and response.queue_offsets[i] == -1
    stored = [i for i, s in enumerate(statuses) if s == pb.PUT_OK]
    assert [response.queue_offsets[i] for i in stored] == [0, 0, 1]  # refusals took no offset
    bodies = [svc.engine.read_record(response.commit_log_offsets[i]).body for i in stored]
    assert bodies == [b"a", b"d", b"f"]


def test_a_closed_store_refuses_every_message_as_service_not_available(svc: Running) -> None:
    svc.engine.close()
    response = svc.append(batch(0, 3))
    assert list(response.statuses) == [pb.SERVICE_NOT_AVAILABLE] * 3
    assert [r.index for r in response.refusals] == [0, 1, 2]
    assert all("not open" in r.reason for r in response.refusals)
    assert list(response.commit_log_offsets) == [-1, -1, -1]


def test_a_full_disk_refuses_as_create_mapped_file_failed_and_recovers(
    start: Callable[..., Running],
) -> None:
    disk = SimDisk()
    svc = start("/store", disk=disk)
    end = 0
    while end < FILE_BYTES - 2_000:  # fill the first segment
        end = svc.append_ok(batch(0, 10)).commit_log_offsets[-1]
    disk.capacity_bytes = disk.used_bytes() + 1_000  # room for small files, not a segment
    while True:
        response = svc.append(batch(0, 10))
        if response.statuses[0] != pb.PUT_OK:
            break
    assert list(response.statuses) == [pb.CREATE_MAPPED_FILE_FAILED] * 10
    assert all(r.reason.startswith("disk full") for r in response.refusals)
    assert not svc.status().writable
    # the next calls within the retry window are refused the same way, cheaply
    assert list(svc.append(batch(0, 1)).statuses) == [pb.CREATE_MAPPED_FILE_FAILED]
    disk.capacity_bytes = 1 << 40
    svc.engine._disk_full_until_ms = 0.0  # skip the rest of the DISK_FULL_RETRY_MS window
    assert DISK_FULL_RETRY_MS > 0
    moved = svc.append_ok(batch(0, 10))
    assert moved.commit_log_offsets[0] == FILE_BYTES


def test_a_busy_write_lock_refuses_as_os_page_cache_busy(svc: Running) -> None:
    lock = svc.engine._put_lock
    lock.acquire()
    try:
        response = svc.append(batch(0, 2))
    finally:
        lock.release()
    assert list(response.statuses) == [pb.OS_PAGE_CACHE_BUSY] * 2
    assert svc.append_ok(batch(0, 2))


def test_appends_from_many_threads_get_distinct_offsets_and_dense_queue_offsets(
    svc: Running,
) -> None:
    results: list[pb.AppendResponse] = []
    lock = threading.Lock()

    def produce(k: int) -> None:
        for j in range(10):
            response = svc.append_ok(batch(k * 100 + j * 5, 5, queues=1))
            with lock:
                results.append(response)

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    offsets = [o for r in results for o in r.commit_log_offsets]
    assert len(set(offsets)) == 200
    assert sorted(q for r in results for q in r.queue_offsets) == list(range(200))


def test_body_bytes_come_back_unchanged(svc: Running) -> None:
    bodies = [body_for(i, 1 + i * 97) for i in range(20)] + [b"\x00" * 10, bytes(range(256))]
    response = svc.append_ok(
        pb.MessageBatch(topic=TOPIC, queue_ids=[0] * len(bodies), bodies=bodies)
    )
    read = svc.stub.Read(pb.ReadRequest(offsets=response.commit_log_offsets, sizes=response.sizes))
    assert [parse(r).body for r in records_of(read)] == bodies
