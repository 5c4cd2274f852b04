"""Malformed requests are INVALID_ARGUMENT naming the field, before any work; out-of-range
offsets are not malformed (they get pull statuses, see test_positions.py)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from cq_svc import receipts
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.cq_svc.support import ApiHarness, rpc_error

Call = Callable[[ApiHarness], object]
GOOD_RECEIPT = receipts.encode("g", "T", 0, 0, 1)


def _pull(**fields: object) -> Call:
    values: dict[str, object] = {"topic": "T", "queue_id": 0, "offset": 0}
    values.update(fields)
    return lambda api: api.stub.Pull(pb.PullRequest(**values), timeout=10)  # type: ignore[arg-type]


def _receive(**fields: object) -> Call:
    values: dict[str, object] = {"group": "g", "topic": "T", "queue_id": 0}
    values.update(fields)
    return lambda api: api.stub.Receive(pb.ReceiveRequest(**values), timeout=10)  # type: ignore[arg-type]


def _ack(*handles: str, **fields: object) -> Call:
    values: dict[str, object] = {"group": "g", "topic": "T", "queue_id": 0}
    values.update(fields)
    request = pb.AckRequest(receipt_handles=list(handles), **values)  # type: ignore[arg-type]
    return lambda api: api.stub.Ack(request, timeout=10)


def _change(handle: str = GOOD_RECEIPT, ms: int = 1000) -> Call:
    request = pb.ChangeInvisibleDurationRequest(
        group="g", topic="T", queue_id=0, receipt_handle=handle, invisible_duration_ms=ms
    )
    return lambda api: api.stub.ChangeInvisibleDuration(request, timeout=10)


BAD: list[tuple[str, Call, str]] = [
    ("empty topic", _pull(topic=""), "topic"),
    ("path in topic", _pull(topic="../etc"), "topic"),
    ("topic over 127 bytes", _pull(topic="t" * 128), "topic"),
    ("negative queue id", _pull(queue_id=-1), "queue_id"),
    ("queue id past the limit", _pull(queue_id=70_000), "queue_id"),
    ("negative offset", _pull(offset=-1), "offset"),
    ("negative max_messages", _pull(max_messages=-5), "max_messages"),
    ("negative max_bytes", _pull(max_bytes=-1), "max_bytes"),
    ("negative long poll", _pull(long_poll_ms=-1), "long_poll_ms"),
    ("too many tags", _pull(tags=[f"t{i}" for i in range(300)]), "tags"),
    (
        "negative timestamp",
        lambda api: api.stub.GetOffsetByTime(pb.GetOffsetByTimeRequest(topic="T", timestamp_ms=-1)),
        "timestamp_ms",
    ),
    (
        "unknown boundary",
        lambda api: api.stub.GetOffsetByTime(
            pb.GetOffsetByTimeRequest(topic="T", timestamp_ms=1, boundary=7)  # type: ignore[arg-type]
        ),
        "boundary",
    ),
    (
        "bad topic in a queue lookup",
        lambda api: api.stub.GetQueueInfo(pb.GetQueueInfoRequest(topic="a b")),
        "topic",
    ),
    ("bad topic in a listing", lambda api: api.stub.ListQueues(pb.ListQueuesRequest()), "topic"),
    (
        "empty group",
        lambda api: api.stub.FetchOffset(pb.FetchOffsetRequest(group="", topic="T")),
        "group",
    ),
    (
        "group with a slash",
        lambda api: api.stub.CommitOffset(pb.CommitOffsetRequest(group="a/b", topic="T")),
        "group",
    ),
    (
        "negative committed offset",
        lambda api: api.stub.CommitOffset(pb.CommitOffsetRequest(group="g", topic="T", offset=-2)),
        "offset",
    ),
    ("negative receive count", _receive(max_messages=-1), "max_messages"),
    ("negative invisibility", _receive(invisible_duration_ms=-1), "invisible_duration_ms"),
    (
        "invisibility over 12 h",
        _receive(invisible_duration_ms=13 * 3_600_000),
        "invisible_duration_ms",
    ),
    ("negative receive long poll", _receive(long_poll_ms=-1), "long_poll_ms"),
    ("group over 255 characters", _receive(group="g" * 256), "group"),
    ("garbage receipt", _ack("not-a-receipt"), "receipt_handles"),
    ("a receipt of another queue", _ack(receipts.encode("g", "T", 1, 0, 1)), "receipt_handles"),
    ("a receipt of another group", _ack(receipts.encode("h", "T", 0, 0, 1)), "receipt_handles"),
    (
        "one bad receipt among good ones",
        _ack(GOOD_RECEIPT, GOOD_RECEIPT[:-1] + "A"),
        "receipt_handles",
    ),
    ("garbage receipt to change", _change(handle="x" * 23), "receipt_handle"),
    ("negative change of invisibility", _change(ms=-1), "invisible_duration_ms"),
]


@pytest.mark.parametrize(("case", "call", "field"), BAD, ids=[case for case, _, _ in BAD])
def test_malformed_input_is_invalid_argument_naming_the_field(
    api: ApiHarness, case: str, call: Call, field: str
) -> None:
    code, message, got_field = rpc_error(lambda: call(api))
    assert (code, got_field) == (grpc.StatusCode.INVALID_ARGUMENT, field), message


def test_a_refused_ack_acknowledges_nothing(api: ApiHarness) -> None:
    # Decoding comes first: with one bad receipt, the good one is not acked either (there is
    # no ack state for the group at all afterwards).
    rpc_error(lambda: _ack(GOOD_RECEIPT, "bad")(api))
    assert not api.engine.acks.has_state(("g", "T", 0))
