"""Queries against a real commit log: messages appended with KEYS and UNIQ_KEY through Append
are found by QueryByKey and QueryByUniqKey, only when topic and key really match, newest first,
within the time range and the maximum; damaged records are never served."""

from __future__ import annotations

import errno
import time
from pathlib import Path

import grpc
import pytest

from mqstore.formats.javahash import index_key_hash
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.subscriber import wait_until
from mqstore.storage.simdisk import SimDisk
from tests.index_svc.conftest import Replica, start_replica, stop_replica
from tests.index_svc.support import (
    append,
    commitlog_calls,
    flip_body_bit,
    health_status,
    offsets_of,
    sample,
    wait_applied,
)

CommitLog = commitlog_pb2_grpc.CommitLogStub


def by_key(replica: Replica, topic: str, key: str, **fields: int) -> pb.QueryResponse:
    return replica.stub.QueryByKey(pb.QueryByKeyRequest(topic=topic, key=key, **fields), timeout=30)


def by_uniq(replica: Replica, topic: str, uniq_key: str) -> pb.QueryResponse:
    return replica.stub.QueryByUniqKey(
        pb.QueryByUniqKeyRequest(topic=topic, uniq_key=uniq_key), timeout=30
    )


def test_a_caught_up_replica_is_ready(replica: Replica) -> None:
    assert wait_until(lambda: health_status(replica.health_target, "readiness") == "SERVING", 10)
    assert health_status(replica.health_target, "liveness") == "SERVING"
    assert replica.stub.GetStatus(pb.GetStatusRequest()).caught_up


def test_every_key_token_and_the_unique_id_find_the_message(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    stored = append(
        commitlog_stub,
        "Orders",
        [("order-1 customer-7", "U-order-1"), ("order-2", "U-order-2"), ("", "")],
    )
    wait_applied(replica.stub, stored.end_offset)
    for key in ("order-1", "customer-7"):
        (message,) = by_key(replica, "Orders", key).messages
        assert message.commit_log_offset == stored.offsets[0]
        assert (message.topic, message.body, message.keys) == (
            "Orders",
            b"body-0",
            "order-1 customer-7",
        )
        assert message.uniq_key == "U-order-1"
        assert message.store_timestamp_ms == stored.store_timestamp_ms
        assert message.size == stored.sizes[0]
    assert offsets_of(by_uniq(replica, "Orders", "U-order-2")) == [stored.offsets[1]]
    # Neither a part of a token nor another topic's key matches.
    assert offsets_of(by_key(replica, "Orders", "order")) == []
    assert offsets_of(by_key(replica, "Other", "order-1")) == []
    assert offsets_of(by_uniq(replica, "Other", "U-order-1")) == []


def test_a_query_reads_all_its_candidates_in_one_read(
    commitlog: ServiceProcess, commitlog_stub: CommitLog, replica: Replica
) -> None:
    stored = append(commitlog_stub, "OneRead", [("o", "")] * 20)
    wait_applied(replica.stub, stored.end_offset)
    reads, gets = commitlog_calls(commitlog, "Read"), commitlog_calls(commitlog, "GetMessage")
    assert len(by_key(replica, "OneRead", "o").messages) == 20
    assert commitlog_calls(commitlog, "Read") == reads + 1
    assert commitlog_calls(commitlog, "GetMessage") == gets


def test_answers_are_newest_first_and_at_most_the_maximum(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    stored = append(commitlog_stub, "Many", [("m", "")] * 120)
    wait_applied(replica.stub, stored.end_offset)
    newest_first = sorted(stored.offsets, reverse=True)
    assert offsets_of(by_key(replica, "Many", "m")) == newest_first[:64]  # 0: the default
    assert offsets_of(by_key(replica, "Many", "m", max_messages=5)) == newest_first[:5]
    assert offsets_of(by_key(replica, "Many", "m", max_messages=1)) == newest_first[:1]
    assert offsets_of(by_key(replica, "Many", "m", max_messages=90)) == newest_first[:90]
    huge = by_key(replica, "Many", "m", max_messages=2**31 - 1)
    assert offsets_of(huge) == newest_first[:100]  # the replica's cap, not an allocation


def test_time_windows_are_exact_to_the_millisecond(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    """QueryByKey's window holds exactly the messages whose store time lies in it, both ends
    inclusive, to the millisecond (index.proto). The index keeps whole seconds from its file's
    begin, as RocketMQ's does: a window of the store time alone found nothing before."""
    early = append(commitlog_stub, "Timed", [("t", "")] * 3)
    # The next batch is stored at least two seconds later.
    assert wait_until(lambda: time.time() * 1000 >= early.store_timestamp_ms + 2_000, 10)
    late = append(commitlog_stub, "Timed", [("t", "")] * 2)
    wait_applied(replica.stub, late.end_offset)
    t_early, t_late = early.store_timestamp_ms, late.store_timestamp_ms
    assert t_late >= t_early + 2_000

    everything = sorted(early.offsets + late.offsets, reverse=True)
    assert offsets_of(by_key(replica, "Timed", "t")) == everything
    for stored in (early, late):
        t = stored.store_timestamp_ms
        newest_first = sorted(stored.offsets, reverse=True)
        exact = by_key(replica, "Timed", "t", begin_timestamp_ms=t, end_timestamp_ms=t)
        assert offsets_of(exact) == newest_first
        assert offsets_of(by_key(replica, "Timed", "t", begin_timestamp_ms=t)) == sorted(
            [o for o in everything if o >= stored.offsets[0]], reverse=True
        )
        assert offsets_of(by_key(replica, "Timed", "t", end_timestamp_ms=t)) == sorted(
            [o for o in everything if o <= stored.offsets[-1]], reverse=True
        )
        # A millisecond either side of the store time leaves the batch out.
        assert offsets_of(by_key(replica, "Timed", "t", begin_timestamp_ms=t + 1)) == sorted(
            [o for o in everything if o > stored.offsets[-1]], reverse=True
        )
        before = by_key(replica, "Timed", "t", begin_timestamp_ms=1, end_timestamp_ms=t - 1)
        assert offsets_of(before) == sorted(
            [o for o in everything if o < stored.offsets[0]], reverse=True
        )
    # A range before anything was stored finds nothing.
    assert offsets_of(by_key(replica, "Timed", "t", begin_timestamp_ms=1, end_timestamp_ms=2)) == []


def test_colliding_keys_never_leak_into_each_others_answers(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    assert index_key_hash("C#Aa") == index_key_hash("C#BB")  # same topic, colliding keys
    assert index_key_hash("Aa#k") == index_key_hash("BB#k")  # colliding topics, same key
    collisions_before = sample("mqstore_index_collisions_dropped_total", kind="key")
    aa = append(commitlog_stub, "C", [("Aa", "")] * 3)
    bb = append(commitlog_stub, "C", [("BB", "")] * 2)
    in_aa = append(commitlog_stub, "Aa", [("k", "")])
    in_bb = append(commitlog_stub, "BB", [("k", "")] * 2)
    wait_applied(replica.stub, in_bb.end_offset)
    assert offsets_of(by_key(replica, "C", "Aa")) == sorted(aa.offsets, reverse=True)
    assert offsets_of(by_key(replica, "C", "BB")) == sorted(bb.offsets, reverse=True)
    assert offsets_of(by_key(replica, "Aa", "k")) == in_aa.offsets
    assert offsets_of(by_key(replica, "BB", "k")) == sorted(in_bb.offsets, reverse=True)
    dropped = sample("mqstore_index_collisions_dropped_total", kind="key") - collisions_before
    assert dropped == 2 + 3 + 2 + 1  # each query read the other key's records and dropped them


def test_a_key_buried_under_newer_collisions_is_still_found(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    """The first walk yields only colliding candidates; the walk widens until it finds enough."""
    wanted = append(commitlog_stub, "Buried", [("Aa", "")] * 3)
    append(commitlog_stub, "Buried", [("BB", "")] * 100)
    newest = append(commitlog_stub, "Buried", [("BB", "")])
    wait_applied(replica.stub, newest.end_offset)
    found = by_key(replica, "Buried", "Aa", max_messages=3)
    assert offsets_of(found) == sorted(wanted.offsets, reverse=True)


def test_the_same_unique_id_stored_twice_is_returned_twice_newest_first(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    first = append(commitlog_stub, "Retried", [("", "U-dup"), ("", "U-other")])
    again = append(commitlog_stub, "Retried", [("", "U-dup")])  # a producer's blind retry
    elsewhere = append(commitlog_stub, "Elsewhere", [("", "U-dup")])
    wait_applied(replica.stub, elsewhere.end_offset)
    answer = by_uniq(replica, "Retried", "U-dup")
    assert offsets_of(answer) == [again.offsets[0], first.offsets[0]]
    assert all(m.uniq_key == "U-dup" and m.topic == "Retried" for m in answer.messages)
    assert offsets_of(by_uniq(replica, "Elsewhere", "U-dup")) == elsewhere.offsets
    # A unique id is not a key: a key query for it finds nothing.
    assert offsets_of(by_key(replica, "Retried", "U-dup")) == []


def test_a_unique_id_is_matched_whole_even_with_a_space(
    commitlog_stub: CommitLog, replica: Replica
) -> None:
    stored = append(commitlog_stub, "Spaced", [("", "id with space"), ("", "id")])
    wait_applied(replica.stub, stored.end_offset)
    assert offsets_of(by_uniq(replica, "Spaced", "id with space")) == stored.offsets[:1]
    assert offsets_of(by_uniq(replica, "Spaced", "id")) == stored.offsets[1:]


def test_end_zero_means_now(commitlog_stub: CommitLog, replica: Replica) -> None:
    stored = append(commitlog_stub, "Now", [("n", "")])
    wait_applied(replica.stub, stored.end_offset)
    assert offsets_of(by_key(replica, "Now", "n", end_timestamp_ms=0)) == stored.offsets
    before = by_key(replica, "Now", "n", end_timestamp_ms=stored.store_timestamp_ms - 5_000)
    assert offsets_of(before) == []


def test_bad_input_gets_invalid_argument_from_a_live_replica(replica: Replica) -> None:
    for request in (
        pb.QueryByKeyRequest(topic="T", key="has space"),
        pb.QueryByKeyRequest(topic="T", key="k", max_messages=-3),
        pb.QueryByKeyRequest(topic="no/slash", key="k"),
        pb.QueryByKeyRequest(topic="T", key="k", begin_timestamp_ms=5, end_timestamp_ms=4),
    ):
        with pytest.raises(grpc.RpcError) as info:
            replica.stub.QueryByKey(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_damaged_record_is_never_served_and_the_rest_still_are(
    commitlog: ServiceProcess, commitlog_stub: CommitLog, replica: Replica
) -> None:
    stored = append(commitlog_stub, "Damaged", [("d", "")] * 3)
    wait_applied(replica.stub, stored.end_offset)
    victim = stored.offsets[1]
    flip_body_bit(commitlog.data_dir, victim)
    corrupt_before = sample("mqstore_index_candidates_corrupt_total")
    answer = by_key(replica, "Damaged", "d")
    assert offsets_of(answer) == [stored.offsets[2], stored.offsets[0]]
    assert sample("mqstore_index_candidates_corrupt_total") == corrupt_before + 1


def test_exact_mode_drops_collisions_before_reading_the_log(
    commitlog: ServiceProcess, commitlog_stub: CommitLog, tmp_path: Path
) -> None:
    aa = append(commitlog_stub, "Exact", [("Aa", "")] * 2)
    bb = append(commitlog_stub, "Exact", [("BB", "")] * 3)
    exact = start_replica(tmp_path / "index-exact", commitlog.target, exact=True)
    try:
        wait_applied(exact.stub, bb.end_offset)
        candidates_before = sample("mqstore_index_candidates_total", kind="key")
        dropped_before = sample("mqstore_index_collisions_dropped_total", kind="key")
        assert offsets_of(by_key(exact, "Exact", "Aa")) == sorted(aa.offsets, reverse=True)
        assert sample("mqstore_index_candidates_total", kind="key") == candidates_before + 2
        assert sample("mqstore_index_collisions_dropped_total", kind="key") == dropped_before
    finally:
        stop_replica(exact)


def test_a_failed_index_flush_fails_liveness_and_stops_the_subscription(
    commitlog: ServiceProcess, commitlog_stub: CommitLog
) -> None:
    sim = SimDisk()
    replica = start_replica(Path("/data/index-sim"), commitlog.target, disk=sim)
    try:
        stored = append(commitlog_stub, "Flaky", [("f", "")])
        wait_applied(replica.stub, stored.end_offset)
        assert health_status(replica.health_target, "liveness") == "SERVING"
        sim.inject("flush", errno.EIO, times=1_000, path_contains="/data/index-sim/index/")
        append(commitlog_stub, "Flaky", [("f", "")] * 70)  # a new index file: flushed at once
        assert wait_until(
            lambda: health_status(replica.health_target, "liveness") == "NOT_SERVING", 30, 0.05
        )
        assert replica.service.engine.failure is not None
        assert not replica.service.subscriber.alive
    finally:
        stop_replica(replica)
