"""What the fuzzers found, each reproduced with the smallest input found. Fixed ones stay as
regression tests; an open one is a strict xfail (a fix makes it pass, and strict makes the
suite say so: then drop the xfail and its line in fuzz/known.py). docs/fuzzing.md has each.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pytest

from commitlog_svc.store_files import CHECKPOINT_FILE
from cq_svc import group_offsets
from fuzz.services import FILE_BYTES, Stack
from fuzz.targets import dispatch
from mqstore.errors import CorruptFile
from mqstore.formats.commitlog_checkpoint import decode_checkpoint
from mqstore.formats.framing import frame
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from tests.commitlog_svc.support import Running

TIMEOUT_S = 20.0
# Bounds a wait for the flush thread's next checkpoint (every 50 ms in Running's settings).
CHECKPOINT_WAIT_S = 10.0


def one_entry(**columns: list[int]) -> pb.DispatchBatch:
    """A frame of one entry of topic "A", with some columns overridden."""
    fields: dict[str, list[int]] = {name: [0] for name in dispatch.COLUMNS}
    fields.update(columns)
    return pb.DispatchBatch(topics=["A"], **fields)  # type: ignore[arg-type]


# -- the dispatch batch decoder (mqstore/rpc/dispatch_codec.py) --------------------------------


def test_a_dispatch_frame_with_columns_of_different_lengths_is_refused_typed() -> None:
    assert dispatch.check_batch(one_entry(commit_log_offsets=[0, 100])) is None


def test_a_dispatch_frame_naming_a_topic_past_its_table_is_refused_typed() -> None:
    assert dispatch.check_batch(one_entry(topic_indexes=[1])) is None


def test_a_negative_topic_index_is_refused_not_read_as_another_topic() -> None:
    batch = one_entry(topic_indexes=[-1])
    batch.topics.append("B")
    assert dispatch.check_batch(batch) is None


def test_a_keys_column_of_the_wrong_length_is_refused_not_dropped() -> None:
    batch = one_entry(**{name: [0, 0] for name in dispatch.COLUMNS})
    batch.keys.append("k")
    assert dispatch.check_batch(batch) is None


# -- cq_svc's group-offsets snapshot (cq_svc/group_offsets.py) ---------------------------------


@pytest.mark.parametrize(
    "payload",
    [b"", b"\x00\x00\x00\x01", b"\x00\x00\x00\x01\x00\x01\xff"],
    ids=["empty", "count-without-entry", "group-not-utf8"],
)
def test_a_group_offsets_snapshot_that_does_not_parse_is_corrupt_file(payload: bytes) -> None:
    with pytest.raises(CorruptFile):
        group_offsets.decode_snapshot(frame(group_offsets.SNAP_MAGIC, 1, payload), path="snap")


# -- commitlog_svc ------------------------------------------------------------------------------


def test_an_idempotent_append_refused_whole_does_not_stop_the_store(tmp_path: Path) -> None:
    svc = Running(tmp_path / "log", checkpoint_interval_ms=50)
    try:
        refused = svc.append(
            pb.MessageBatch(topic="bad topic", queue_ids=[0], bodies=[b"x"]),
            producer_id="p",
            sequence=1,
        )
        assert list(refused.statuses) == [pb.MESSAGE_ILLEGAL]
        svc.append_ok(pb.MessageBatch(topic="T", queue_ids=[0], bodies=[b"y"]))
        end = svc.engine.max_offset
        path = os.path.join(svc.data_dir, CHECKPOINT_FILE)
        deadline = time.monotonic() + CHECKPOINT_WAIT_S
        # Until the flush thread has checkpointed past the append, or failed trying.
        while time.monotonic() < deadline and svc.engine.flush_alive:
            if os.path.exists(path):
                with open(path, "rb") as f:
                    if decode_checkpoint(f.read()).flushed_offset >= end:
                        break
            time.sleep(0.01)
        assert svc.engine.flush_alive
        svc.append_ok(pb.MessageBatch(topic="T", queue_ids=[0], bodies=[b"z"]))
    finally:
        svc.stop()


def test_a_confirmed_offset_inside_a_record_starts_at_a_boundary_not_reported_as_corruption(
    stack: Stack,
) -> None:
    """Finding 4 (docs/fuzzing.md), fixed with the log's history: a subscriber that sends the
    log's own history and an offset inside a record (only a client that invents offsets does)
    truncates and starts at its segment's start, a boundary every reader knows; the intact
    bytes are never reported as a corrupt range. Without a history the handshake takes the
    subscriber for epoch 0 and replays from the log's start (a boundary too)."""
    status = stack.log.GetStatus(pb.GetStatusRequest(), timeout=TIMEOUT_S)
    inside = stack.stored[0].commit_log_offset + 1
    for history in (status.history, pb.LogHistory()):
        stream = stack.log.Subscribe(
            pb.SubscribeRequest(
                subscriber_id="inside",
                store_id=status.store_id,
                confirmed_offset=inside,
                history=history,
            ),
            timeout=TIMEOUT_S,
        )
        try:
            handshake = next(stream).handshake
            batch = next(stream).batch
        finally:
            stream.cancel()
        segment_start = inside - inside % FILE_BYTES
        assert handshake.start_offset == segment_start
        assert handshake.truncate_offset <= segment_start
        assert batch.start_offset == segment_start
        assert not batch.corrupt_starts


# -- names: RocketMQ's pattern matched whole (mqstore/limits.py TOPIC_PATTERN ends in "$") -------


def test_a_topic_with_a_trailing_newline_is_refused(stack: Stack) -> None:
    response = stack.log.Append(
        pb.AppendRequest(batches=[pb.MessageBatch(topic="T\n", queue_ids=[0], bodies=[b"n"])]),
        timeout=TIMEOUT_S,
    )
    assert list(response.statuses) == [pb.MESSAGE_ILLEGAL]
    assert [r.field for r in response.refusals] == ["topic"]


def test_a_group_with_a_trailing_newline_is_refused(stack: Stack) -> None:
    request = cq.CommitOffsetRequest(group="g\n", topic="T", queue_id=0, offset=1)
    with pytest.raises(grpc.RpcError) as info:
        stack.queues.CommitOffset(request, timeout=TIMEOUT_S)
    assert error_from_rpc(info.value)[::2] == (grpc.StatusCode.INVALID_ARGUMENT, "group")
