"""Reads stop at a broker group's commit offset (issue 24: "every read a consumer can make stops
at the commit offset, so nothing a consumer saw can vanish in a failover"). The replica
controller hands the log its commit offset with `set_commit_bound`, as it does here; a record
past it is READ_OUT_OF_RANGE in a Read and UNAVAILABLE (retry) from GetMessage, and
is served as soon as the bound passes it."""

from __future__ import annotations

import grpc

from mqstore.formats.msgid import offset_msg_id
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.answers import records_of
from tests.commitlog_svc.support import RPC_TIMEOUT_S, Running, batch, parse, rpc_error


def read_statuses(svc: Running, offsets: list[int], sizes: list[int]) -> list[int]:
    answer = svc.stub.Read(pb.ReadRequest(offsets=offsets, sizes=sizes), timeout=RPC_TIMEOUT_S)
    return list(answer.statuses)


def test_records_past_the_commit_offset_are_not_served_until_it_passes_them(
    svc: Running,
) -> None:
    stored = svc.append_ok(batch(0, 6))
    offsets, sizes = list(stored.commit_log_offsets), list(stored.sizes)
    commit = offsets[3]  # the group holds the first three records
    svc.engine.set_commit_bound(lambda: commit)
    wanted = pb.READ_OK, pb.READ_OK, pb.READ_OK, *[pb.READ_OUT_OF_RANGE] * 3
    assert read_statuses(svc, offsets, sizes) == list(wanted)
    # Size 0 (the whole record, its size from its header) is bounded the same way.
    assert read_statuses(svc, offsets, [0] * 6) == list(wanted)
    # A range that starts below the commit offset and ends past it is not served either.
    assert read_statuses(svc, [offsets[2]], [sizes[2] + sizes[3]]) == [pb.READ_OUT_OF_RANGE]

    host = stored.store_host
    got = svc.stub.GetMessage(pb.GetMessageRequest(msg_id=offset_msg_id(host, offsets[2])))
    assert got.commit_log_offset == offsets[2]
    code, message, _ = rpc_error(
        lambda: svc.stub.GetMessage(pb.GetMessageRequest(msg_id=offset_msg_id(host, offsets[4])))
    )
    assert code is grpc.StatusCode.UNAVAILABLE
    assert "in-sync set" in message and str(commit) in message

    commit = offsets[5] + sizes[5]  # the group caught up
    answer = svc.stub.Read(pb.ReadRequest(offsets=offsets, sizes=sizes), timeout=RPC_TIMEOUT_S)
    assert list(answer.statuses) == [pb.READ_OK] * 6
    assert [parse(r).physical_offset for r in records_of(answer)] == offsets
    got = svc.stub.GetMessage(pb.GetMessageRequest(msg_id=offset_msg_id(host, offsets[4])))
    assert got.commit_log_offset == offsets[4]


def test_a_single_replica_has_nobody_to_hand_the_lead_to(svc: Running) -> None:
    """Switchover on a store outside a broker group, and a timeout out of bounds."""
    code, message, _ = rpc_error(lambda: svc.stub.Switchover(pb.SwitchoverRequest()))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "single replica" in message
    code, _, field = rpc_error(lambda: svc.stub.Switchover(pb.SwitchoverRequest(timeout_ms=-1)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and field == "timeout_ms"
