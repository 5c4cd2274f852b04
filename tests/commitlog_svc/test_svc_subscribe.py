"""Subscribe: DESIGN.md's handshake row by row, dispatch from the agreed offset, tailing, and
subscribers that are slow, cancelled or killed."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from commitlog_svc import metrics
from commitlog_svc.dispatch_scan import scan_dispatch
from mqstore.dispatch import DISPATCH_LINGER_MS_MAX, DispatchColumns, DispatchEntry
from mqstore.formats.javahash import tags_code
from mqstore.history import LogHistory
from mqstore.rpc.channel import channel_options
from mqstore.rpc.dispatch_codec import decode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.rpc.subscriber import Subscriber
from mqstore.storage import failpoints
from tests.commitlog_svc.support import (
    FILE_BYTES,
    WAIT_S,
    Running,
    batch,
    damage_body,
    dispatched_offsets,
    fill,
    offsets_of,
    rpc_error,
    subscribe,
    wait_until,
)

# -- the handshake ------------------------------------------------------------------------------


def test_a_new_subscriber_starts_at_the_minimum_and_gets_every_entry(svc: Running) -> None:
    stored = fill(svc, 30)
    reader = subscribe(svc, "new")
    hs = reader.handshake
    status = svc.status()
    assert (hs.store_id, hs.min_offset, hs.max_offset) == (
        status.store_id,
        status.min_offset,
        status.max_offset,
    )
    assert hs.start_offset == 0
    batches = reader.wait_reaching(hs.max_offset)
    assert batches[0].start_offset == 0
    assert all(a.next_offset == b.start_offset for a, b in itertools.pairwise(batches))
    entries = [e for b in batches for e in decode_dispatch(b)]
    assert [e.commit_log_offset for e in entries] == offsets_of(stored)
    first = entries[0]
    assert first == DispatchEntry(
        topic="TopicTest",
        queue_id=0,
        queue_offset=0,
        commit_log_offset=0,
        size=stored[0].sizes[0],
        tags_code=tags_code("tag0"),
        store_timestamp_ms=stored[0].store_timestamp_ms,
        sys_flag=0,
    )
    assert all(not b.keys for b in batches), "keys only with include_keys"
    reader.cancel()


def test_a_subscriber_of_this_store_resumes_at_its_confirmed_offset(svc: Running) -> None:
    stored = offsets_of(fill(svc, 20))
    hs0 = subscribe(svc, "probe").handshake
    reader = subscribe(
        svc, "resume", store_id=hs0.store_id, confirmed_offset=stored[12], history=hs0.history
    )
    assert reader.handshake.start_offset == stored[12]
    assert reader.handshake.truncate_offset == reader.handshake.max_offset
    batches = reader.wait_reaching(reader.handshake.max_offset)
    assert dispatched_offsets(batches) == stored[12:]
    reader.cancel()


def test_a_subscriber_ahead_of_a_truncated_log_starts_at_the_new_end(
    start: Callable[..., Running],
) -> None:
    svc = start()
    stored = offsets_of(fill(svc, 10))
    status = svc.status()
    store_id, old_end, history = status.store_id, status.max_offset, status.history
    svc.stop()
    damage_body(svc.data_dir, stored[-1])  # the durable tail is damaged: the log ends before it
    again = start()
    assert again.status().max_offset == stored[-1] < old_end
    reader = subscribe(again, "ahead", store_id=store_id, confirmed_offset=old_end, history=history)
    hs = reader.handshake
    assert (hs.max_offset, hs.start_offset, hs.truncate_offset) == (stored[-1],) * 3
    again.append_ok(batch(99, 1))
    [b] = reader.wait_reaching(again.status().max_offset)
    assert b.start_offset == stored[-1]
    reader.cancel()


def test_a_subscriber_behind_expired_segments_starts_at_the_minimum(
    start: Callable[..., Running],
) -> None:
    svc = start(file_reserved_hours=0.0, delete_when_hours=list(range(24)))
    while svc.status().max_offset < 3 * FILE_BYTES:
        svc.append_ok(batch(0, 50))
    store_id, history = svc.status().store_id, svc.status().history
    assert svc.engine.clean_expired(manual=True).deleted_files >= 2
    low = svc.status().min_offset
    reader = subscribe(svc, "behind", store_id=store_id, confirmed_offset=100, history=history)
    hs = reader.handshake
    assert hs.min_offset == low > 100 and hs.start_offset == low
    assert reader.wait_reaching(hs.max_offset)[0].start_offset == low
    reader.cancel()


def test_a_subscriber_of_another_store_rebuilds_from_the_minimum(svc: Running) -> None:
    stored = offsets_of(fill(svc, 10))
    reader = subscribe(svc, "replaced", store_id=b"\x01" * 16, confirmed_offset=stored[5])
    assert reader.handshake.start_offset == 0
    assert reader.handshake.store_id != b"\x01" * 16
    assert dispatched_offsets(reader.wait_reaching(reader.handshake.max_offset)) == stored
    reader.cancel()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"subscriber_id": ""}, "subscriber_id"),
        ({"subscriber_id": "x" * 300}, "subscriber_id"),
        ({"subscriber_id": "s", "confirmed_offset": -1}, "confirmed_offset"),
        ({"subscriber_id": "s", "max_batch_entries": -1}, "max_batch_entries"),
        ({"subscriber_id": "s", "linger_ms": -1}, "linger_ms"),
        ({"subscriber_id": "s", "linger_ms": DISPATCH_LINGER_MS_MAX + 1}, "linger_ms"),
    ],
    ids=[
        "empty-id",
        "long-id",
        "negative-offset",
        "negative-bound",
        "negative-linger",
        "long-linger",
    ],
)
def test_a_malformed_subscribe_is_invalid_argument(
    svc: Running, fields: dict[str, object], field: str
) -> None:
    code, _, got = rpc_error(
        lambda: next(svc.stub.Subscribe(pb.SubscribeRequest(**fields), timeout=10))  # type: ignore[arg-type]
    )
    assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, field)


# -- dispatch ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_subscriber_that_caught_up_gets_new_appends_as_they_come(
    start: Callable[..., Running], flush: str
) -> None:
    svc = start(flush=flush)
    fill(svc, 10)
    reader = subscribe(svc, "tail")
    reader.wait_reaching(reader.handshake.max_offset)
    for round_ in range(3):
        new = svc.append_ok(batch(100 + round_, 3))
        batches = reader.wait_reaching(new.commit_log_offsets[-1] + new.sizes[-1])
        assert dispatched_offsets(batches)[-3:] == list(new.commit_log_offsets)
    reader.cancel()


def test_under_sync_flush_nothing_is_dispatched_before_it_is_durable(
    start: Callable[..., Running],
) -> None:
    svc = start(flush="sync")
    svc.append_ok(batch(0, 5))
    reader = subscribe(svc, "durable-only")
    reader.wait_reaching(svc.status().max_offset)
    gate = threading.Event()
    failpoints.arm("commitlog.before_flush", lambda _: gate.wait(WAIT_S))
    answers: list[pb.AppendResponse] = []
    writer = threading.Thread(target=lambda: answers.append(svc.append(batch(5, 5))))
    try:
        writer.start()
        engine = svc.engine
        wait_until(lambda: engine.max_offset > engine.flushed_offset, "a written, unflushed append")
        status = svc.status()
        assert status.confirm_offset == status.flushed_offset < status.max_offset
        pending = scan_dispatch(
            engine, status.flushed_offset, max_records=100, max_bytes=1 << 20, include_keys=False
        )
        assert pending.entries == 0 and pending.next_offset == status.flushed_offset
        assert max(b.next_offset for b in reader.batches()) == status.flushed_offset
    finally:
        failpoints.disarm("commitlog.before_flush")
        gate.set()
        writer.join(WAIT_S)
    [answer] = answers
    assert all(s == pb.PUT_OK for s in answer.statuses)
    end = answer.commit_log_offsets[-1] + answer.sizes[-1]
    assert dispatched_offsets(reader.wait_reaching(end))[-5:] == list(answer.commit_log_offsets)
    reader.cancel()


def test_include_keys_sends_keys_and_unique_keys(svc: Running) -> None:
    fill(svc, 4, per_call=4)
    reader = subscribe(svc, "index", include_keys=True)
    entries = [
        e for b in reader.wait_reaching(reader.handshake.max_offset) for e in decode_dispatch(b)
    ]
    assert [(e.keys, e.uniq_key) for e in entries] == [(f"key-{i}", f"U{i:08X}") for i in range(4)]
    reader.cancel()


def test_batch_bounds_are_the_subscribers_below_the_servers(svc: Running) -> None:
    fill(svc, 30)
    reader = subscribe(svc, "small", max_batch_entries=7)
    batches = reader.wait_reaching(reader.handshake.max_offset)
    assert [len(b.commit_log_offsets) for b in batches] == [7, 7, 7, 7, 2]
    reader.cancel()


def test_a_lingering_subscriber_gets_appends_that_keep_coming_in_fewer_frames(
    svc: Running,
) -> None:
    """linger_ms: the first append after a quiet spell goes at once; what follows within the
    linger waits for it and goes in one frame. A subscriber without one gets each append in
    a frame of its own as soon as it is there (an eager subscriber that fell behind takes
    whatever is visible in one frame, so the appends wait for it here)."""
    fill(svc, 10)
    lingering = subscribe(svc, "lingering", linger_ms=1_000)
    eager = subscribe(svc, "eager")
    for reader in (lingering, eager):
        reader.wait_reaching(reader.handshake.max_offset)
    before = {id(r): len(r.batches()) for r in (lingering, eager)}
    first = svc.append_ok(batch(100, 1))
    lingering.wait_reaching(first.commit_log_offsets[0] + first.sizes[0])
    eager.wait_reaching(first.commit_log_offsets[0] + first.sizes[0])
    more = []
    for i in range(3):  # each one dispatched to the eager reader before the next is appended
        more.append(svc.append_ok(batch(200 + i, 1)))
        eager.wait_reaching(more[-1].commit_log_offsets[0] + more[-1].sizes[0])
    end = more[-1].commit_log_offsets[0] + more[-1].sizes[0]
    new = {}
    for reader in (lingering, eager):
        new[id(reader)] = reader.wait_reaching(end)[before[id(reader)] :]
        reader.cancel()
    assert [dispatched_offsets([b]) for b in new[id(lingering)]] == [
        list(first.commit_log_offsets),
        [r.commit_log_offsets[0] for r in more],
    ]
    assert [dispatched_offsets([b]) for b in new[id(eager)]] == [
        list(r.commit_log_offsets) for r in (first, *more)
    ]


def test_a_lingering_subscriber_that_filled_a_frame_gets_the_next_at_once(svc: Running) -> None:
    """A full frame means the subscriber is behind: the frames after it do not wait a linger
    each (else a lingering follower would fall behind for good under a fast producer)."""
    fill(svc, 10)
    reader = subscribe(svc, "behind", linger_ms=1_000, max_batch_entries=5)
    reader.wait_reaching(reader.handshake.max_offset)
    before = len(reader.batches())
    one = svc.append_ok(batch(100, 1))
    reader.wait_reaching(one.commit_log_offsets[0] + one.sizes[0])
    began = time.monotonic()
    twelve = svc.append_ok(batch(200, 12))
    got = reader.wait_reaching(twelve.commit_log_offsets[-1] + twelve.sizes[-1])[before:]
    took_s = time.monotonic() - began
    reader.cancel()
    assert [len(b.commit_log_offsets) for b in got] == [1, 5, 5, 2]
    assert dispatched_offsets(got[1:]) == list(twelve.commit_log_offsets)
    # One linger after the lone frame, then the rest at once: three lingers would be 3 s.
    assert took_s < 2.5


def test_a_damaged_record_is_sent_as_a_corrupt_range_and_dispatch_goes_on(
    start: Callable[..., Running],
) -> None:
    # The scan's verdict: frames of the newest appends come from the appends' own columns
    # (append_frames.py), so this damage after the write would be seen by Read, not dispatch.
    svc = start(dispatch_append_bytes=0)
    stored = offsets_of(fill(svc, 5, per_call=5))
    damage_body(svc.data_dir, stored[2])
    before = metrics.CRC_MISMATCHES.labels("dispatch")._value.get()
    reader = subscribe(svc, "scanner")
    batches = reader.wait_reaching(reader.handshake.max_offset)
    assert dispatched_offsets(batches) == stored[:2] + stored[3:]
    assert [
        (s, e) for b in batches for s, e in zip(b.corrupt_starts, b.corrupt_ends, strict=True)
    ] == [(stored[2], stored[3])]
    assert metrics.CRC_MISMATCHES.labels("dispatch")._value.get() == before + 1
    reader.cancel()


class RecordingSink:
    """A DispatchSink that keeps what it is given: each frame's type and length, its entries."""

    def __init__(self) -> None:
        self.store_id = b""
        self.confirmed_offset = 0
        self.applied_offset = 0
        self.frames: list[tuple[type, int]] = []
        self.entries: list[DispatchEntry] = []
        self.history = LogHistory()

    def on_handshake(
        self,
        store_id: bytes,
        min_offset: int,
        max_offset: int,
        truncate_offset: int,
        history: LogHistory,
    ) -> None:
        if store_id != self.store_id:
            self.store_id, self.entries, self.applied_offset = store_id, [], min_offset
        self.history = history

    def on_batch(self, entries: list[DispatchEntry], next_offset: int) -> None:
        self.frames.append((type(entries), len(entries)))
        self.entries.extend(entries)
        self.applied_offset = self.confirmed_offset = next_offset


def test_the_shared_subscriber_client_follows_and_confirms(svc: Running) -> None:
    """mqstore.rpc.subscriber (what cq_svc and index_svc run) against the real service."""
    stored = offsets_of(fill(svc, 20))
    sink = RecordingSink()
    follower = Subscriber(svc.target, "shared", sink)
    follower.start()
    try:
        assert follower.wait_caught_up(20)
        more = svc.append_ok(batch(50, 5))
        end = more.commit_log_offsets[-1] + more.sizes[-1]
        wait_until(lambda: sink.applied_offset == end, "the follower to apply the new batch")
        assert [e.commit_log_offset for e in sink.entries] == [*stored, *more.commit_log_offsets]
        wait_until(
            lambda: (svc.subscriber("shared") or pb.SubscriberStatus()).confirmed_offset == end,
            "the follower's Confirm",
        )
    finally:
        follower.stop()


@pytest.mark.parametrize("records", [False, True])
def test_the_shared_subscriber_hands_every_frame_as_columns(svc: Running, records: bool) -> None:
    """Small frames and large, with records or without: one form, DispatchColumns, holding
    the entries appended."""
    sink = RecordingSink()
    follower = Subscriber(svc.target, "small", sink, wants_records=lambda: records)
    follower.start()
    try:
        assert follower.wait_caught_up(20)
        small = svc.append_ok(batch(0, 5))
        end = small.commit_log_offsets[-1] + small.sizes[-1]
        wait_until(lambda: sink.applied_offset == end, "the small frame")
        large = svc.append_ok(batch(10, 30))
        end = large.commit_log_offsets[-1] + large.sizes[-1]
        wait_until(lambda: sink.applied_offset == end, "the large frame")
    finally:
        follower.stop()
    assert sink.frames == [(DispatchColumns, 5), (DispatchColumns, 30)]
    assert [e.commit_log_offset for e in sink.entries] == [
        *small.commit_log_offsets,
        *large.commit_log_offsets,
    ]
    assert [e.queue_offset for e in sink.entries] == [
        *small.queue_offsets,
        *large.queue_offsets,
    ]


# -- subscribers that go away or fall behind ---------------------------------------------------


def test_cancelled_subscribers_free_their_worker_threads(start: Callable[..., Running]) -> None:
    # Two subscriptions at once at most: one leaked stream a round would reach the bound.
    svc = start(max_workers=6, subscribe_streams_max=2)
    fill(svc, 10)
    for _ in range(5):
        reader = subscribe(svc, "fickle")
        reader.wait_reaching(reader.handshake.max_offset)  # now waiting for appends
        reader.cancel()
        wait_until(lambda: not svc.subscriber("fickle").connected, "the stream to end")  # type: ignore[union-attr]
    svc.append_ok(batch(20, 10))
    assert svc.subscriber("fickle") is not None


SUBSCRIBER_SCRIPT = textwrap.dedent(
    """
    import sys
    import grpc
    from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb, commitlog_pb2_grpc as pb_grpc
    channel = grpc.insecure_channel(sys.argv[1])
    stub = pb_grpc.CommitLogStub(channel)
    for frame in stub.Subscribe(pb.SubscribeRequest(subscriber_id="doomed")):
        print(frame.WhichOneof("frame"), flush=True)
    """
)


def test_a_subscriber_killed_mid_stream_is_let_go_and_the_server_keeps_serving(
    start: Callable[..., Running], tmp_path: Path
) -> None:
    svc = start(max_workers=6, subscribe_streams_max=2)
    fill(svc, 10)
    child = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER_SCRIPT, svc.target],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"handshake"
        assert child.stdout.readline().strip() == b"batch"
        wait_until(
            lambda: (svc.subscriber("doomed") or pb.SubscriberStatus()).connected, "the subscriber"
        )
        svc.append_ok(batch(10, 5))
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    wait_until(lambda: not svc.subscriber("doomed").connected, "the server to notice")  # type: ignore[union-attr]
    svc.append_ok(batch(20, 5))
    reader = subscribe(svc, "after")
    reader.wait_reaching(svc.status().max_offset)
    reader.cancel()


def test_a_slow_subscriber_slows_neither_appends_nor_other_subscribers(svc: Running) -> None:
    # The slow one reads the handshake and then nothing; without window growth (BDP probing
    # off) its stream can hold at most one HTTP/2 window of frames in flight.
    options = [*channel_options(), ("grpc.http2.bdp_probe", 0)]
    with grpc.insecure_channel(svc.target, options=options) as channel:
        slow = pb_grpc.CommitLogStub(channel).Subscribe(
            pb.SubscribeRequest(subscriber_id="slow", max_batch_entries=1, include_keys=True)
        )
        assert next(slow).WhichOneof("frame") == "handshake"
        fast = subscribe(svc, "fast")
        assert fast.handshake.start_offset == 0
        stored: list[pb.AppendResponse] = []
        for i in range(0, 20_000, 200):
            stored.append(svc.append_ok(batch(i, 200, body_bytes=20)))
        end = svc.status().max_offset
        assert dispatched_offsets(fast.wait_reaching(end)) == offsets_of(stored)
        slow_status = svc.subscriber("slow")
        assert slow_status is not None and slow_status.connected
        behind = svc.service.servicer.gauges().dispatch_behind["slow"]  # type: ignore[union-attr]
        assert behind > 0, "the slow stream holds at most a window, not the whole log"
        # It still gets everything, in order, at its own pace.
        got: list[int] = []
        for frame in slow:
            got.extend(frame.batch.commit_log_offsets)
            if frame.batch.next_offset >= end:
                break
        assert got == offsets_of(stored)
        slow.cancel()
        fast.cancel()


def test_many_subscribers_at_once_each_get_the_whole_log(svc: Running) -> None:
    stored = offsets_of(fill(svc, 40))
    readers = [subscribe(svc, f"sub-{i}") for i in range(4)]
    results: dict[int, list[int]] = {}
    lock = threading.Lock()

    def collect(i: int) -> None:
        got = dispatched_offsets(readers[i].wait_reaching(stored[-1] + 1))
        with lock:
            results[i] = got

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results[i] == stored for i in range(4))
    for r in readers:
        r.cancel()
