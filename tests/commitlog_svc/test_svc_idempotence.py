"""Producer idempotence over gRPC: a retry of a stored (producer_id, sequence) returns the first
result with duplicate = true and stores nothing; a sequence going backwards is an error the
client can act on; the table survives a restart (kill -9: test_svc_process.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from commitlog_svc import metrics
from mqstore.formats.properties import decode_properties
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog_svc.support import Running, batch, rpc_error


def same_result(a: pb.AppendResponse, b: pb.AppendResponse) -> bool:
    return (
        list(a.statuses) == list(b.statuses)
        and list(a.commit_log_offsets) == list(b.commit_log_offsets)
        and list(a.sizes) == list(b.sizes)
        and list(a.queue_offsets) == list(b.queue_offsets)
        and a.store_timestamp_ms == b.store_timestamp_ms
        and a.store_host == b.store_host
        and [(r.index, r.status) for r in a.refusals] == [(r.index, r.status) for r in b.refusals]
    )


def test_a_retried_sequence_returns_the_first_result_and_stores_nothing(svc: Running) -> None:
    before = metrics.APPEND_DUPLICATES._value.get()
    first = svc.append_ok(batch(0, 4), producer_id="p1", sequence=1)
    end = svc.status().max_offset
    retry = svc.append_ok(batch(0, 4), producer_id="p1", sequence=1)
    assert retry.duplicate and not first.duplicate
    assert same_result(first, retry) and retry.sequence == 1
    assert svc.status().max_offset == end
    assert metrics.APPEND_DUPLICATES._value.get() == before + 1
    nxt = svc.append_ok(batch(4, 4), producer_id="p1", sequence=2)
    assert not nxt.duplicate and nxt.commit_log_offsets[0] == end


def test_the_first_stored_record_carries_the_producer_tag(svc: Running) -> None:
    first = svc.append_ok(batch(0, 3), producer_id="host:42", sequence=9)
    tagged = svc.engine.read_record(first.commit_log_offsets[0])
    assert decode_properties(tagged.properties)["MQS_PSEQ"] == "host:42:9:3:"
    untagged = svc.engine.read_record(first.commit_log_offsets[1])
    assert "MQS_PSEQ" not in decode_properties(untagged.properties)


def test_producers_are_independent_and_sequences_need_not_be_dense(svc: Running) -> None:
    a1 = svc.append_ok(batch(0, 1), producer_id="a", sequence=5)
    b1 = svc.append_ok(batch(1, 1), producer_id="b", sequence=5)
    assert not b1.duplicate
    a2 = svc.append_ok(batch(2, 1), producer_id="a", sequence=50)
    assert not a2.duplicate
    assert same_result(svc.append_ok(batch(0, 1), producer_id="a", sequence=5), a1)


def test_a_sequence_older_than_the_remembered_ones_is_failed_precondition(
    start: Callable[..., Running],
) -> None:
    svc = start(producer_requests_max=3)
    results = {
        seq: svc.append_ok(batch(seq, 1), producer_id="p", sequence=seq) for seq in range(1, 6)
    }
    assert svc.append_ok(batch(3, 1), producer_id="p", sequence=3).duplicate  # 3..5 remembered
    end = svc.status().max_offset
    code, message, _ = rpc_error(
        lambda: svc.append(batch(1, 1), producer_id="p", sequence=1)  # forgotten
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "sequence 1" in message and "remembered" in message
    assert svc.status().max_offset == end
    assert same_result(svc.append_ok(batch(5, 1), producer_id="p", sequence=5), results[5])


def test_a_sequence_that_goes_backwards_into_a_gap_is_failed_precondition(svc: Running) -> None:
    svc.append_ok(batch(0, 1), producer_id="p", sequence=10)
    svc.append_ok(batch(1, 1), producer_id="p", sequence=12)
    end = svc.status().max_offset
    code, _, _ = rpc_error(lambda: svc.append(batch(2, 1), producer_id="p", sequence=11))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert svc.status().max_offset == end


def test_a_request_refused_as_a_whole_is_not_remembered_so_its_retry_stores(svc: Running) -> None:
    refused = svc.append(batch(0, 2, topic="bad topic!"), producer_id="p", sequence=1)
    assert list(refused.statuses) == [pb.MESSAGE_ILLEGAL] * 2
    stored = svc.append_ok(batch(0, 2), producer_id="p", sequence=1)
    assert not stored.duplicate and stored.commit_log_offsets[0] == 0


def test_a_partly_refused_request_is_replayed_with_its_refusals(svc: Running) -> None:
    request = [batch(0, 2, topic="bad topic!"), batch(2, 3)]
    first = svc.append(*request, producer_id="p", sequence=1)
    assert list(first.statuses) == [pb.MESSAGE_ILLEGAL] * 2 + [pb.PUT_OK] * 3
    tagged = svc.engine.read_record(first.commit_log_offsets[2])
    assert decode_properties(tagged.properties)["MQS_PSEQ"] == "p:1:5:0/6,1/6"
    retry = svc.append(*request, producer_id="p", sequence=1)
    assert retry.duplicate and same_result(first, retry)


def test_a_retry_is_answered_the_same_over_append_stream(svc: Running) -> None:
    # five in flight: as many as the store remembers per producer (producer_requests_max)
    requests = [
        pb.AppendRequest(batches=[batch(i * 3, 3)], producer_id="s", sequence=i) for i in range(5)
    ]
    first = list(svc.stub.AppendStream(iter(requests), timeout=30))
    end = svc.status().max_offset
    again = list(svc.stub.AppendStream(iter(requests), timeout=30))
    assert [r.duplicate for r in again] == [True] * 5
    assert all(same_result(a, b) for a, b in zip(first, again, strict=True))
    assert svc.status().max_offset == end


def test_concurrent_copies_of_one_request_store_it_once(start: Callable[..., Running]) -> None:
    svc = start(flush="sync")
    answers: list[pb.AppendResponse] = []
    lock = threading.Lock()
    go = threading.Barrier(4)

    def send() -> None:
        go.wait()
        response = svc.append_ok(batch(0, 20), producer_id="racer", sequence=77)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.duplicate for r in answers) == [False, True, True, True]
    assert all(same_result(answers[0], r) for r in answers)
    assert svc.status().max_offset == answers[0].commit_log_offsets[-1] + answers[0].sizes[-1]


def test_a_retry_after_a_restart_returns_the_first_result(start: Callable[..., Running]) -> None:
    svc = start(flush="sync")
    firsts = {
        seq: svc.append(batch(seq * 2, 2, topic="bad topic!" if seq == 3 else "T"), batch(0, 1),
                        producer_id="p", sequence=seq)
        for seq in range(1, 5)
    }  # fmt: skip
    end = svc.status().max_offset
    svc.stop()
    again = start(flush="sync")
    for seq, first in firsts.items():
        retry = again.append(
            batch(seq * 2, 2, topic="bad topic!" if seq == 3 else "T"),
            batch(0, 1),
            producer_id="p",
            sequence=seq,
        )
        assert retry.duplicate and same_result(first, retry), seq
    assert again.status().max_offset == end
    code, _, _ = rpc_error(lambda: again.append(batch(0, 1), producer_id="p", sequence=0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_forgotten_producer_is_taken_as_new(start: Callable[..., Running]) -> None:
    """The documented bound: past producers_max, the least recently used producer is forgotten
    and its retry is stored again."""
    svc = start(producers_max=2)
    first = svc.append_ok(batch(0, 1), producer_id="old", sequence=1)
    svc.append_ok(batch(1, 1), producer_id="b", sequence=1)
    svc.append_ok(batch(2, 1), producer_id="c", sequence=1)
    retry = svc.append_ok(batch(0, 1), producer_id="old", sequence=1)
    assert not retry.duplicate
    assert retry.commit_log_offsets[0] > first.commit_log_offsets[0]
