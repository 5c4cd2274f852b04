"""Confirm and the subscriber registry: durable confirmed offsets, the retention floor, and the
lag GetStatus reports (bytes and store-time milliseconds)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.clock import ManualClock
from tests.commitlog_svc.support import (
    FILE_BYTES,
    Running,
    batch,
    rpc_error,
    subscribe,
    wait_until,
)


def confirm(svc: Running, sid: str, offset: int, store_id: bytes | None = None) -> int:
    response = svc.stub.Confirm(
        pb.ConfirmRequest(
            subscriber_id=sid,
            store_id=svc.status().store_id if store_id is None else store_id,
            confirmed_offset=offset,
        ),
        timeout=10,
    )
    return int(response.retention_floor)


def test_confirmed_offsets_survive_a_restart_of_the_commit_log(
    start: Callable[..., Running],
) -> None:
    svc = start()
    stored = svc.append_ok(batch(0, 10))
    reader = subscribe(svc, "cq-0")
    reader.wait_reaching(svc.status().max_offset)
    assert confirm(svc, "cq-0", stored.commit_log_offsets[6]) == stored.commit_log_offsets[6]
    assert confirm(svc, "index-0", stored.commit_log_offsets[3]) == stored.commit_log_offsets[3]
    reader.cancel()
    svc.stop()

    again = start()
    subs = {s.subscriber_id: s for s in again.status().subscribers}
    assert subs["cq-0"].confirmed_offset == stored.commit_log_offsets[6]
    assert subs["index-0"].confirmed_offset == stored.commit_log_offsets[3]
    assert not subs["cq-0"].connected and not subs["index-0"].connected


def test_a_subscription_lowers_the_confirmed_offset_to_where_it_starts(svc: Running) -> None:
    stored = svc.append_ok(batch(0, 10))
    confirm(svc, "rebuilt", stored.commit_log_offsets[8])
    # The subscriber lost its files: it comes back as new and needs the log from the start.
    reader = subscribe(svc, "rebuilt")
    assert reader.handshake.start_offset == 0
    sub = svc.subscriber("rebuilt")
    assert sub is not None and sub.confirmed_offset == 0 and sub.connected
    reader.cancel()


def test_a_malformed_or_misplaced_confirm_is_refused_with_its_status(svc: Running) -> None:
    svc.append_ok(batch(0, 2))
    end = svc.status().max_offset
    cases = [
        (lambda: confirm(svc, "", 0), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: confirm(svc, "s", -5), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: confirm(svc, "s", 0, store_id=b"\x00" * 16), grpc.StatusCode.FAILED_PRECONDITION),
        (lambda: confirm(svc, "s", end + 1), grpc.StatusCode.OUT_OF_RANGE),
    ]
    for call, expected in cases:
        code, message, _ = rpc_error(call)
        assert code == expected, message
    assert svc.subscriber("s") is None


def test_retention_never_deletes_above_the_lowest_confirmed_offset(
    start: Callable[..., Running],
) -> None:
    svc = start(file_reserved_hours=0.0, delete_when_hours=list(range(24)))
    while svc.status().max_offset < 5 * FILE_BYTES:
        svc.append_ok(batch(0, 50))
    floor = 2 * FILE_BYTES + 100  # inside the third segment
    confirm(svc, "slow", floor)
    assert confirm(svc, "fast", svc.status().max_offset) == floor
    svc.engine.clean_expired(manual=True)
    assert svc.status().min_offset == 2 * FILE_BYTES  # the segment holding the floor stays

    confirm(svc, "slow", 4 * FILE_BYTES)
    svc.engine.clean_expired(manual=True)
    assert svc.status().min_offset == 4 * FILE_BYTES


def test_get_status_reports_offsets_flush_mode_and_subscriber_lag(
    start: Callable[..., Running],
) -> None:
    clock = ManualClock(1_700_000_000_000)
    svc = start(clock=clock)
    a = svc.append_ok(batch(0, 5))
    clock.advance(5_000)
    b = svc.append_ok(batch(5, 5))
    clock.advance(2_000)
    c = svc.append_ok(batch(10, 5))
    end = c.commit_log_offsets[-1] + c.sizes[-1]
    end_of_a = a.commit_log_offsets[-1] + a.sizes[-1]
    confirm(svc, "behind-b", end_of_a)
    confirm(svc, "behind-a", 0)
    confirm(svc, "caught-up", end)

    status = svc.status()
    assert (status.min_offset, status.max_offset, status.confirm_offset) == (0, end, end)
    assert status.flush == "async" and status.writable
    assert status.store_host == a.store_host
    lag = {s.subscriber_id: (s.lag_bytes, s.lag_ms) for s in status.subscribers}
    assert lag == {
        "behind-a": (end, c.store_timestamp_ms - a.store_timestamp_ms),
        "behind-b": (end - end_of_a, c.store_timestamp_ms - b.store_timestamp_ms),
        "caught-up": (0, 0),
    }
    assert c.store_timestamp_ms - a.store_timestamp_ms == 7_000

    # After a restart the newest store time is found in the files (no append since).
    svc.stop()
    again = start(clock=clock)
    lag = {s.subscriber_id: s.lag_ms for s in again.status().subscribers}
    assert lag == {"behind-a": 7_000, "behind-b": 2_000, "caught-up": 0}


def test_the_newest_store_time_is_found_behind_an_end_of_file_blank(
    start: Callable[..., Running],
) -> None:
    clock = ManualClock(1_700_000_000_000)
    svc = start(clock=clock)
    last = None
    while svc.status().max_offset < FILE_BYTES + 1_000:
        clock.advance(10)
        last = svc.append_ok(batch(0, 20))
    assert last is not None
    confirm(svc, "s", 0)
    svc.stop()
    again = start(clock=clock)
    assert again.engine.newest_store_timestamp_ms() == last.store_timestamp_ms


def test_get_status_of_an_empty_log(svc: Running) -> None:
    status = svc.status()
    assert (status.min_offset, status.max_offset, status.flushed_offset) == (0, 0, 0)
    assert len(status.store_id) == 16 and not status.subscribers
    assert svc.engine.newest_store_timestamp_ms() == -1


def test_status_shows_how_far_a_stream_has_sent_ahead_of_what_is_confirmed(
    svc: Running,
) -> None:
    end = svc.append_ok(batch(0, 20)).commit_log_offsets[-1] + 1
    reader = subscribe(svc, "follower")
    reader.wait_reaching(end)
    # The server records what it sent just after handing the frame to the stream.
    wait_until(
        lambda: svc.status().subscribers[0].sent_offset == svc.status().max_offset,
        "the status to show the frame sent",
    )
    (sub,) = svc.status().subscribers
    assert sub.connected and sub.sent_offset == svc.status().max_offset
    assert sub.confirmed_offset == 0 and sub.lag_bytes == sub.sent_offset  # nothing confirmed
    reader.cancel()
    wait_until(lambda: not svc.status().subscribers[0].connected, "the stream to end")
    assert svc.status().subscribers[0].sent_offset == -1


def test_a_single_replica_says_so_and_refuses_to_be_replicated(svc: Running) -> None:
    """Without a broker group the status says "single", the commit offset is the log's end, and
    Replicate is FAILED_PRECONDITION naming why (docs/replication.md)."""
    svc.append_ok(batch(0, 3))
    status = svc.status()
    assert status.role == "single" and status.commit_offset == status.max_offset > 0
    hello = pb.ReplicateRequest(hello=pb.ReplicaHello(group="g", replica="b"))
    code, message, _ = rpc_error(lambda: list(svc.stub.Replicate(iter([hello]), timeout=10)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "single replica" in message
