"""Exact boundaries through real gRPC (T13, T14): every limit at its value and one past it, bad
offsets, unknown names, odd characters and empty bodies, against the three services running
in this process (fuzz/services.py).

A refusal must change nothing that is stored: each refusal below is checked against a marker
record written just before it (the log's end and a Read of the marker, before and after).
Per-message limits (body, topic, properties, queue id) are refusals of that message (a status
naming the field, docs of commitlog_svc/servicer.py), not of the call; request-level limits
are INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client import REGISTRY

from fuzz.draw import INT32_MAX, INT64_MAX
from fuzz.services import (
    INDEX_DEFAULT_RESULTS,
    INDEX_MAX_RESULTS,
    PULL_BYTES_MAX,
    PULL_MESSAGES_MAX,
    Stack,
)
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.limits import MessageLimits
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from tests.answers import records_of

LIMITS = MessageLimits()
TIMEOUT_S = 20.0
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@dataclass(frozen=True)
class Snapshot:
    max_offset: int
    marker_offset: int
    marker: bytes


def append(stack: Stack, *batches: pb.MessageBatch, **fields: object) -> pb.AppendResponse:
    request = pb.AppendRequest(batches=list(batches), **fields)  # type: ignore[arg-type]
    response: pb.AppendResponse = stack.log.Append(request, timeout=TIMEOUT_S)
    return response


def stored_ok(response: pb.AppendResponse) -> None:
    assert set(response.statuses) == {pb.PUT_OK}, response.refusals


def snapshot(stack: Stack) -> Snapshot:
    """A marker record written now, and the log's end behind it."""
    response = append(stack, pb.MessageBatch(topic="Marker", queue_ids=[0], bodies=[b"mark"]))
    stored_ok(response)
    offset = response.commit_log_offsets[0]
    read = stack.log.Read(pb.ReadRequest(offsets=[offset], sizes=[0]), timeout=TIMEOUT_S)
    status = stack.log.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT_S)
    assert status.max_offset == offset + response.sizes[0]
    return Snapshot(status.max_offset, offset, records_of(read)[0])


def assert_unchanged(stack: Stack, before: Snapshot) -> None:
    status = stack.log.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT_S)
    read = stack.log.Read(
        pb.ReadRequest(offsets=[before.marker_offset], sizes=[0]), timeout=TIMEOUT_S
    )
    assert (status.max_offset, records_of(read)[0]) == (before.max_offset, before.marker)


def failure(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str]:
    try:
        call()
    except grpc.RpcError as err:
        return error_from_rpc(err)
    raise AssertionError("the call succeeded")


def refused_alone(stack: Stack, batch: pb.MessageBatch, status: int, field: str) -> None:
    """The one message of `batch` is refused with `status` naming `field`; nothing stored."""
    before = snapshot(stack)
    response = append(stack, batch)
    assert list(response.statuses) == [status]
    assert [(r.index, r.field) for r in response.refusals] == [(0, field)]
    assert list(response.commit_log_offsets) == [-1]
    assert_unchanged(stack, before)


def pull(stack: Stack, **fields: object) -> cq.PullResponse:
    response: cq.PullResponse = stack.queues.Pull(cq.PullRequest(**fields), timeout=TIMEOUT_S)  # type: ignore[arg-type]
    return response


# -- per-message limits -------------------------------------------------------------------------


def test_a_body_of_exactly_the_limit_is_stored_and_one_byte_more_is_refused_naming_body(
    stack: Stack,
) -> None:
    body = bytes(range(256)) * (LIMITS.body_bytes_max // 256)
    assert len(body) == LIMITS.body_bytes_max
    response = append(stack, pb.MessageBatch(topic="Big", queue_ids=[0], bodies=[body]))
    stored_ok(response)
    record = stack.engine.read_record(response.commit_log_offsets[0])
    assert record.body == body
    refused_alone(
        stack,
        pb.MessageBatch(topic="Big", queue_ids=[0], bodies=[body + b"x"]),
        pb.MESSAGE_ILLEGAL,
        "body",
    )


def test_a_topic_of_127_bytes_is_stored_served_and_indexed_and_128_is_refused_everywhere(
    stack: Stack,
) -> None:
    topic = "t" * LIMITS.topic_bytes_max
    props = encode_properties({"KEYS": "edge-key"})
    stored_ok(append(stack, pb.MessageBatch(topic=topic, queue_ids=[1], bodies=[b"b"],
                                            properties=[props])))  # fmt: skip
    stack.wait_followers()
    got = pull(stack, topic=topic, queue_id=1, offset=0)
    assert got.status == cq.FOUND and len(records_of(got)) == 1
    found = stack.keys.QueryByKey(ix.QueryByKeyRequest(topic=topic, key="edge-key"))
    assert [m.topic for m in found.messages] == [topic]

    longer = topic + "t"
    refused_alone(
        stack,
        pb.MessageBatch(topic=longer, queue_ids=[1], bodies=[b"b"]),
        pb.MESSAGE_ILLEGAL,
        "topic",
    )
    code, _, field = failure(lambda: pull(stack, topic=longer, queue_id=1, offset=0))
    assert (code, field) == (INVALID, "topic")
    code, _, field = failure(
        lambda: stack.keys.QueryByKey(ix.QueryByKeyRequest(topic=longer, key="edge-key"))
    )
    assert (code, field) == (INVALID, "topic")


def test_a_retry_topic_may_reach_255_bytes_and_256_is_refused(stack: Stack) -> None:
    topic = "%RETRY%" + "g" * (LIMITS.system_topic_bytes_max - len("%RETRY%"))
    assert len(topic) == LIMITS.system_topic_bytes_max
    response = append(stack, pb.MessageBatch(topic=topic, queue_ids=[0], bodies=[b"r"]))
    stored_ok(response)
    assert stack.engine.read_record(response.commit_log_offsets[0]).topic == topic
    refused_alone(
        stack,
        pb.MessageBatch(topic=topic + "g", queue_ids=[0], bodies=[b"r"]),
        pb.MESSAGE_ILLEGAL,
        "topic",
    )


def properties_of(nbytes: int) -> bytes:
    raw = b"K\x01" + b"v" * (nbytes - 3) + b"\x02"
    assert len(raw) == nbytes
    return raw


def test_properties_of_exactly_32747_bytes_are_stored_and_32748_refused(stack: Stack) -> None:
    """The record's properties hold 32,767 bytes; the whole-record CRC property takes 20."""
    limit = LIMITS.properties_bytes_max - 20
    response = append(
        stack,
        pb.MessageBatch(
            topic="Props", queue_ids=[0], bodies=[b"p"], properties=[properties_of(limit)]
        ),
    )
    stored_ok(response)
    assert len(stack.engine.read_record(response.commit_log_offsets[0]).properties) == limit
    refused_alone(
        stack,
        pb.MessageBatch(
            topic="Props", queue_ids=[0], bodies=[b"p"], properties=[properties_of(limit + 1)]
        ),
        pb.PROPERTIES_SIZE_EXCEEDED,
        "properties",
    )


def test_queue_id_65535_is_stored_and_pulled_and_65536_is_refused(stack: Stack) -> None:
    top = LIMITS.queue_id_max
    stored_ok(append(stack, pb.MessageBatch(topic="Queues", queue_ids=[top], bodies=[b"q"])))
    stack.wait_followers()
    got = pull(stack, topic="Queues", queue_id=top, offset=0)
    assert (got.status, list(got.queue_offsets)) == (cq.FOUND, [0])
    refused_alone(
        stack,
        pb.MessageBatch(topic="Queues", queue_ids=[top + 1], bodies=[b"q"]),
        pb.MESSAGE_ILLEGAL,
        "queue_id",
    )
    code, _, field = failure(lambda: pull(stack, topic="Queues", queue_id=top + 1, offset=0))
    assert (code, field) == (INVALID, "queue_id")


# -- request-level limits -----------------------------------------------------------------------


def test_a_batch_of_exactly_batch_messages_max_is_stored_and_one_more_is_refused_whole(
    stack: Stack,
) -> None:
    n = LIMITS.batch_messages_max

    def batch(count: int) -> pb.MessageBatch:
        return pb.MessageBatch(topic="Many", queue_ids=[0] * count, bodies=[b"m"] * count)

    response = append(stack, batch(n))
    stored_ok(response)
    assert len(response.statuses) == n
    before = snapshot(stack)
    code, _, field = failure(lambda: append(stack, batch(n + 1)))
    assert (code, field) == (INVALID, "batches")
    # Spread over two batches, the total is what counts.
    code, _, field = failure(lambda: append(stack, batch(n), batch(1)))
    assert (code, field) == (INVALID, "batches")
    assert_unchanged(stack, before)


def test_a_producer_id_of_256_bytes_is_accepted_and_257_refused(stack: Stack) -> None:
    producer = "é" * 128  # 256 bytes in UTF-8, 128 characters: the limit counts bytes
    assert len(producer.encode()) == 256
    message = pb.MessageBatch(topic="Producers", queue_ids=[0], bodies=[b"p"])
    stored_ok(append(stack, message, producer_id=producer, sequence=1))
    before = snapshot(stack)
    code, _, field = failure(lambda: append(stack, message, producer_id=producer + "x", sequence=1))
    assert (code, field) == (INVALID, "producer_id")
    assert_unchanged(stack, before)


def test_a_subscriber_id_of_256_bytes_is_accepted_and_257_refused(stack: Stack) -> None:
    status = stack.log.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT_S)
    sid = "ü" * 128
    stream = stack.log.Subscribe(
        pb.SubscribeRequest(subscriber_id=sid, store_id=status.store_id), timeout=TIMEOUT_S
    )
    try:
        assert next(stream).WhichOneof("frame") == "handshake"
    finally:
        stream.cancel()
    confirm = pb.ConfirmRequest(subscriber_id=sid, store_id=status.store_id, confirmed_offset=0)
    stack.log.Confirm(confirm, timeout=TIMEOUT_S)
    longer = sid + "x"
    code, _, field = failure(
        lambda: next(stack.log.Subscribe(pb.SubscribeRequest(subscriber_id=longer)))
    )
    assert (code, field) == (INVALID, "subscriber_id")
    code, _, field = failure(
        lambda: stack.log.Confirm(
            pb.ConfirmRequest(subscriber_id=longer, store_id=status.store_id), timeout=TIMEOUT_S
        )
    )
    assert (code, field) == (INVALID, "subscriber_id")


def handled_appends() -> float:
    """Append calls that reached the handler (the metrics interceptor counts them)."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "grpc_server_handled":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("grpc_method") == "Append":
                    total += sample.value
    return total


def request_of(nbytes: int) -> pb.AppendRequest:
    """An append of two messages (each under the body limit) serialized to exactly `nbytes`."""
    first = b"a" * (3 << 20)
    request = pb.AppendRequest(
        batches=[pb.MessageBatch(topic="Wire", queue_ids=[0, 0], bodies=[first, b""])]
    )
    for _ in range(3):  # the length prefixes settle after a step or two
        second = request.batches[0].bodies[1]
        request.batches[0].bodies[1] = b"b" * (len(second) + nbytes - request.ByteSize())
    assert request.ByteSize() == nbytes
    return request


def test_exactly_max_message_bytes_is_handled_one_byte_more_is_refused_before_the_handler(
    stack: Stack,
) -> None:
    limit = stack.commitlog.settings.max_message_bytes
    stored_ok(stack.log.Append(request_of(limit), timeout=TIMEOUT_S))
    before = snapshot(stack)
    handled = handled_appends()
    code, message, _ = failure(lambda: stack.log.Append(request_of(limit + 1), timeout=TIMEOUT_S))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
    assert "larger than max" in message
    assert handled_appends() == handled  # refused by gRPC, before any handler ran
    assert_unchanged(stack, before)


# -- pull and query caps ------------------------------------------------------------------------


def fill_queue(stack: Stack, topic: str, n: int, body_bytes: int) -> list[int]:
    """n messages in queue 0 of `topic`; their record sizes."""
    response = append(
        stack, pb.MessageBatch(topic=topic, queue_ids=[0] * n, bodies=[b"c" * body_bytes] * n)
    )
    stored_ok(response)
    stack.wait_followers()
    return list(response.sizes)


@pytest.fixture(scope="module")
def many_small(stack: Stack) -> list[int]:
    """More messages than a pull may return, all of them within the byte cap."""
    sizes = fill_queue(stack, "Caps", PULL_MESSAGES_MAX + 36, 100)
    assert sum(sizes[: PULL_MESSAGES_MAX + 1]) < PULL_BYTES_MAX // 4
    return sizes


@pytest.fixture(scope="module")
def many_large(stack: Stack) -> list[int]:
    """More bytes than a pull may return, in fewer messages than its message cap."""
    sizes = fill_queue(stack, "CapBytes", PULL_MESSAGES_MAX - 4, 1500)
    assert sum(sizes) > PULL_BYTES_MAX + 1
    return sizes


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        (PULL_MESSAGES_MAX - 1, PULL_MESSAGES_MAX - 1),
        (PULL_MESSAGES_MAX, PULL_MESSAGES_MAX),
        (PULL_MESSAGES_MAX + 1, PULL_MESSAGES_MAX),
        (INT32_MAX, PULL_MESSAGES_MAX),
        (0, 32),  # the default
    ],
)
def test_pull_max_messages_at_the_cap_and_past_it_answers_the_cap(
    stack: Stack, many_small: list[int], asked: int, answered: int
) -> None:
    got = pull(stack, topic="Caps", queue_id=0, offset=0, max_messages=asked)
    assert list(got.queue_offsets) == list(range(answered))


def test_pull_max_bytes_stops_before_the_record_that_would_pass_it_and_past_the_cap_is_the_cap(
    stack: Stack, many_large: list[int]
) -> None:
    size = many_large[0]
    assert set(many_large) == {size}
    for max_bytes, expected in [
        (3 * size, 3),
        (3 * size - 1, 2),
        (1, 1),  # one record always goes, whatever its size
        (PULL_BYTES_MAX, PULL_BYTES_MAX // size),
        (PULL_BYTES_MAX + 1, PULL_BYTES_MAX // size),
        (INT32_MAX, PULL_BYTES_MAX // size),
    ]:
        got = pull(stack, topic="CapBytes", queue_id=0, offset=0,
                   max_messages=PULL_MESSAGES_MAX, max_bytes=max_bytes)  # fmt: skip
        assert len(records_of(got)) == expected, max_bytes
    code, _, field = failure(lambda: pull(stack, topic="CapBytes", queue_id=0, max_bytes=-1))
    assert (code, field) == (INVALID, "max_bytes")


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        (INDEX_MAX_RESULTS - 1, INDEX_MAX_RESULTS - 1),
        (INDEX_MAX_RESULTS, INDEX_MAX_RESULTS),
        (INDEX_MAX_RESULTS + 1, INDEX_MAX_RESULTS),
        (INT32_MAX, INDEX_MAX_RESULTS),
        (0, INDEX_DEFAULT_RESULTS),
    ],
)
def test_a_key_query_past_the_cap_answers_the_cap_newest_first(
    stack: Stack, asked: int, answered: int
) -> None:
    """The seed holds 24 messages with the key "dup" (fuzz/services.py)."""
    got = stack.keys.QueryByKey(
        ix.QueryByKeyRequest(topic="T", key="dup", max_messages=asked), timeout=TIMEOUT_S
    )
    offsets = [m.commit_log_offset for m in got.messages]
    assert len(offsets) == answered
    assert offsets == sorted(offsets, reverse=True)
    newest = sorted((s.commit_log_offset for s in stack.stored if "dup" in s.keys), reverse=True)
    assert offsets == newest[:answered]


def test_a_negative_key_query_maximum_is_invalid_argument(stack: Stack) -> None:
    code, _, field = failure(
        lambda: stack.keys.QueryByKey(ix.QueryByKeyRequest(topic="T", key="dup", max_messages=-1))
    )
    assert (code, field) == (INVALID, "max_messages")


# -- offsets ------------------------------------------------------------------------------------


def test_negative_and_huge_offsets_get_their_documented_answers(stack: Stack) -> None:
    status = stack.log.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT_S)
    end = status.max_offset
    # Read: malformed is INVALID_ARGUMENT; past the end is a per-record status.
    code, _, field = failure(lambda: stack.log.Read(pb.ReadRequest(offsets=[-1], sizes=[0])))
    assert (code, field) == (INVALID, "offsets")
    read = stack.log.Read(pb.ReadRequest(offsets=[end, INT64_MAX], sizes=[0, 100]))
    assert list(read.statuses) == [pb.READ_OUT_OF_RANGE, pb.READ_OUT_OF_RANGE]
    assert list(records_of(read)) == [b"", b""]
    # GetMessage: an id naming a place past the end is NOT_FOUND.
    code, _, _ = failure(
        lambda: stack.log.GetMessage(
            pb.GetMessageRequest(msg_id=offset_msg_id(status.store_host, INT64_MAX))
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    # Confirm: negative is malformed, past the end is OUT_OF_RANGE.
    confirm = pb.ConfirmRequest(subscriber_id="edge", store_id=status.store_id)
    confirm.confirmed_offset = -1
    assert failure(lambda: stack.log.Confirm(confirm))[::2] == (INVALID, "confirmed_offset")
    confirm.confirmed_offset = INT64_MAX
    assert failure(lambda: stack.log.Confirm(confirm))[0] == grpc.StatusCode.OUT_OF_RANGE
    # Subscribe: a confirmed offset past the end is no position of this log unless the
    # subscriber's history says a cut lost it: an unknown subscriber without a history, or one
    # whose history puts it in the log's current epoch, is refused; one whose history is of an
    # earlier epoch truncates and starts at the end.
    request = pb.SubscribeRequest(
        subscriber_id="edge", store_id=status.store_id, confirmed_offset=INT64_MAX
    )
    for history in (pb.LogHistory(), status.history):
        request.history.CopyFrom(history)
        code, _, _ = failure(lambda: next(stack.log.Subscribe(request, timeout=TIMEOUT_S)))
        assert code == grpc.StatusCode.OUT_OF_RANGE
    request.history.CopyFrom(
        pb.LogHistory(epochs=[min(status.history.epochs) - 1], start_offsets=[0])
    )
    stream = stack.log.Subscribe(request, timeout=TIMEOUT_S)
    try:
        handshake = next(stream).handshake
    finally:
        stream.cancel()
    assert handshake.start_offset <= handshake.truncate_offset <= handshake.max_offset
    # Pull: negative is malformed; past the end is a status with the correction.
    code, _, field = failure(lambda: pull(stack, topic="T", queue_id=0, offset=-1))
    assert (code, field) == (INVALID, "offset")
    info = stack.queues.GetQueueInfo(cq.GetQueueInfoRequest(topic="T", queue_id=0))
    at_end = pull(stack, topic="T", queue_id=0, offset=info.max_offset)
    assert (at_end.status, at_end.next_begin_offset) == (cq.OFFSET_OVERFLOW_ONE, info.max_offset)
    past = pull(stack, topic="T", queue_id=0, offset=INT64_MAX)
    assert (past.status, past.next_begin_offset) == (cq.OFFSET_OVERFLOW_BADLY, info.max_offset)
    assert not records_of(past)


# -- names, unknown and odd ---------------------------------------------------------------------


def test_an_unknown_topic_or_queue_is_an_empty_answer_not_an_error(stack: Stack) -> None:
    got = pull(stack, topic="NeverWritten", queue_id=3, offset=0)
    assert (got.status, got.min_offset, got.max_offset) == (cq.NO_MESSAGE_IN_QUEUE, 0, 0)
    info = stack.queues.GetQueueInfo(cq.GetQueueInfoRequest(topic="T", queue_id=999))
    assert (info.min_offset, info.max_offset) == (0, 0)
    assert not stack.queues.ListQueues(cq.ListQueuesRequest(topic="NeverWritten")).queues
    fetched = stack.queues.FetchOffset(cq.FetchOffsetRequest(group="g", topic="NeverWritten"))
    assert fetched.offset == -1
    assert not stack.keys.QueryByKey(ix.QueryByKeyRequest(topic="NeverWritten", key="k")).messages
    assert not stack.keys.QueryByUniqKey(
        ix.QueryByUniqKeyRequest(topic="NeverWritten", uniq_key="U")
    ).messages


ODD_NAMES = ["tópico", "中文", "a\x00b", "a b", "a/b", "..", "T\t", "\u202eT"]


@pytest.mark.parametrize("name", ODD_NAMES, ids=repr)
def test_unicode_nul_and_path_characters_in_names_are_refused_naming_the_field(
    stack: Stack, name: str
) -> None:
    refused_alone(
        stack,
        pb.MessageBatch(topic=name, queue_ids=[0], bodies=[b"n"]),
        pb.MESSAGE_ILLEGAL,
        "topic",
    )
    calls: list[tuple[Callable[[], object], str]] = [
        (lambda: pull(stack, topic=name, queue_id=0, offset=0), "topic"),
        (lambda: stack.keys.QueryByKey(ix.QueryByKeyRequest(topic=name, key="k")), "topic"),
        (
            lambda: stack.queues.CommitOffset(
                cq.CommitOffsetRequest(group=name, topic="T", queue_id=0, offset=1)
            ),
            "group",
        ),
    ]
    offsets = dict(stack.cq.engine.offsets.items()) if stack.cq else {}
    for call, field in calls:
        code, message, got = failure(call)
        assert (code, got) == (INVALID, field), message
    assert stack.cq is not None and dict(stack.cq.engine.offsets.items()) == offsets


def test_unicode_and_nul_in_keys_and_producer_ids_are_taken_as_they_are(stack: Stack) -> None:
    key = "ключ\x00鍵"
    props = encode_properties({"KEYS": key, "UNIQ_KEY": "ユニーク"})
    response = append(
        stack,
        pb.MessageBatch(topic="Odd", queue_ids=[0], bodies=[b"o"], properties=[props]),
        producer_id="生产者\x00",
        sequence=1,
    )
    stored_ok(response)
    stack.wait_followers()
    by_key = stack.keys.QueryByKey(ix.QueryByKeyRequest(topic="Odd", key=key))
    assert [m.commit_log_offset for m in by_key.messages] == [response.commit_log_offsets[0]]
    by_id = stack.keys.QueryByUniqKey(ix.QueryByUniqKeyRequest(topic="Odd", uniq_key="ユニーク"))
    assert [m.keys for m in by_id.messages] == [key]


def test_an_empty_body_is_stored_and_served_whole(stack: Stack) -> None:
    response = append(stack, pb.MessageBatch(topic="Empty", queue_ids=[0], bodies=[b""]))
    stored_ok(response)
    offset, size = response.commit_log_offsets[0], response.sizes[0]
    read = stack.log.Read(pb.ReadRequest(offsets=[offset, offset], sizes=[size, 0]))
    assert list(read.statuses) == [pb.READ_OK, pb.READ_OK]
    record = read_record(records_of(read)[0], 0, size, expected_offset=offset)
    assert isinstance(record, Record) and record.body == b""
    message = stack.log.GetMessage(
        pb.GetMessageRequest(msg_id=offset_msg_id(response.store_host, offset))
    )
    assert message.body == b""
    stack.wait_followers()
    got = pull(stack, topic="Empty", queue_id=0, offset=0)
    assert list(records_of(got)) == [records_of(read)[0]]
