"""ForgetSubscriber: a subscriber that will not come back stops holding retention back; one
that is connected, or unknown, is refused with the status that says so."""

from __future__ import annotations

import grpc

from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog_svc.support import Running, batch, rpc_error, subscribe, wait_until


def _forget(svc: Running, sid: str) -> pb.ForgetSubscriberResponse:
    return svc.stub.ForgetSubscriber(pb.ForgetSubscriberRequest(subscriber_id=sid), timeout=10)


def test_a_forgotten_subscriber_no_longer_holds_the_retention_floor(svc: Running) -> None:
    svc.append_ok(batch(0, 10))
    status = svc.status()
    for sid, confirmed in (("old-replica", 0), ("live", status.max_offset)):
        svc.stub.Confirm(
            pb.ConfirmRequest(
                subscriber_id=sid, store_id=status.store_id, confirmed_offset=confirmed
            ),
            timeout=10,
        )
    assert (
        svc.stub.Confirm(
            pb.ConfirmRequest(
                subscriber_id="live", store_id=status.store_id, confirmed_offset=status.max_offset
            ),
            timeout=10,
        ).retention_floor
        == 0
    )  # held back by the old replica
    assert _forget(svc, "old-replica").retention_floor == status.max_offset
    assert [s.subscriber_id for s in svc.status().subscribers] == ["live"]
    assert _forget(svc, "live").retention_floor == -1


def test_a_connected_subscriber_cannot_be_forgotten_and_an_unknown_one_is_not_found(
    svc: Running,
) -> None:
    reader = subscribe(svc, "connected")
    assert reader.handshake
    code, message, _ = rpc_error(lambda: _forget(svc, "connected"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "connected" in message
    reader.cancel()
    wait_until(lambda: not svc.status().subscribers[0].connected, "the stream to end")
    assert _forget(svc, "connected").retention_floor == -1
    assert rpc_error(lambda: _forget(svc, "connected"))[0] == grpc.StatusCode.NOT_FOUND
