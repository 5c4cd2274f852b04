"""The log's history in commitlog_svc: an epoch begins at every start, and the Subscribe
handshake uses the histories to find where a subscriber's view and the log part (issue 23,
item 1: a log cut by recovery and regrown past a subscriber's confirmed offset)."""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc
import pytest

from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import history_from_proto
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.epoch_store import EPOCHS_FILE
from tests.commitlog_svc.support import (
    RPC_TIMEOUT_S,
    Running,
    batch,
    damage_body,
    dispatched_offsets,
    fill,
    offsets_of,
    subscribe,
)


def history_of(running: Running) -> LogHistory:
    return history_from_proto(running.status().history)


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    code, message, _ = error_from_rpc(info.value)
    return code, message


def test_every_start_begins_an_epoch_at_the_end_recovery_kept(
    start: Callable[..., Running],
) -> None:
    svc = start()
    assert history_of(svc) == LogHistory([(1, 0)])
    stored = offsets_of(fill(svc, 10))
    end = svc.status().max_offset
    svc.stop()
    again = start()
    assert history_of(again) == LogHistory([(1, 0), (2, end)])
    again.stop()
    damage_body(again.data_dir, stored[-1])  # recovery cuts the log before the last record
    third = start()
    # Epoch 2 began past the cut and kept nothing; epoch 3 is still newer than it.
    assert history_of(third) == LogHistory([(1, 0), (3, stored[-1])])
    assert os.path.exists(os.path.join(third.data_dir, EPOCHS_FILE))


def test_a_store_from_before_histories_is_epoch_0_up_to_its_end(
    start: Callable[..., Running],
) -> None:
    svc = start()
    fill(svc, 10)
    end = svc.status().max_offset
    svc.stop()
    os.unlink(os.path.join(svc.data_dir, EPOCHS_FILE))
    again = start()
    assert history_of(again) == LogHistory([(0, 0), (1, end)])


def test_a_damaged_epoch_file_gives_the_store_a_new_id_so_every_follower_rebuilds(
    start: Callable[..., Running],
) -> None:
    svc = start()
    stored = offsets_of(fill(svc, 10))
    old = svc.status()
    svc.stop()
    path = os.path.join(svc.data_dir, EPOCHS_FILE)
    with open(path, "r+b") as f:
        f.seek(22)
        f.write(b"\xff")
    again = start()
    status = again.status()
    assert status.store_id != old.store_id
    reader = subscribe(
        again,
        "cq",
        store_id=old.store_id,
        confirmed_offset=old.max_offset,
        history=old.history,
    )
    assert reader.handshake.start_offset == 0
    assert dispatched_offsets(reader.wait_reaching(status.max_offset)) == stored
    reader.cancel()


def cut_and_regrow(
    start: Callable[..., Running],
) -> tuple[Running, pb.GetStatusResponse, int, list[int]]:
    """A log a subscriber followed to its end; recovery then cuts it at its last record and
    appends regrow it past that end. Returns the new service, the status the subscriber saw,
    where the log was cut, and the offsets appended after the cut."""
    svc = start()
    stored = offsets_of(fill(svc, 10))
    seen = svc.status()
    svc.stop()
    damage_body(svc.data_dir, stored[-1])
    again = start()
    cut = stored[-1]
    assert again.status().max_offset == cut
    regrown = offsets_of([again.append_ok(batch(100, 5))])
    assert again.status().max_offset > seen.max_offset
    return again, seen, cut, regrown


def test_a_subscriber_past_a_cut_that_regrew_truncates_at_the_cut_and_replays_from_it(
    start: Callable[..., Running],
) -> None:
    """Its confirmed offset lies inside the regrown log, so an offset alone looked fine: the
    histories say the bytes from the cut on are another epoch's."""
    svc, seen, cut, regrown = cut_and_regrow(start)
    reader = subscribe(
        svc,
        "cq",
        store_id=seen.store_id,
        confirmed_offset=seen.max_offset,
        history=seen.history,
    )
    hs = reader.handshake
    assert (hs.truncate_offset, hs.start_offset) == (cut, cut)
    assert history_from_proto(hs.history) == history_of(svc)
    batches = reader.wait_reaching(svc.status().max_offset)
    assert dispatched_offsets(batches) == regrown
    assert not [b for b in batches if b.corrupt_starts], "nothing corrupt from the cut on"
    reader.cancel()


def test_a_confirm_made_before_a_cut_is_refused_and_one_in_the_new_epoch_is_taken(
    start: Callable[..., Running],
) -> None:
    svc, seen, _, _ = cut_and_regrow(start)
    old_epoch = history_from_proto(seen.history).epoch_before(seen.max_offset)
    request = pb.ConfirmRequest(
        subscriber_id="cq",
        store_id=seen.store_id,
        confirmed_offset=seen.max_offset,
        confirmed_epoch=old_epoch,
    )
    code, message = refused(lambda: svc.stub.Confirm(request, timeout=RPC_TIMEOUT_S))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "cut" in message
    request.confirmed_epoch = history_of(svc).epoch_before(seen.max_offset)
    svc.stub.Confirm(request, timeout=RPC_TIMEOUT_S)
    sub = svc.subscriber("cq")
    assert sub is not None and sub.confirmed_offset == seen.max_offset


def test_confirmed_offsets_past_the_recovered_end_come_down_to_it_at_start(
    start: Callable[..., Running],
) -> None:
    svc = start()
    stored = offsets_of(fill(svc, 10))
    status = svc.status()
    svc.stub.Confirm(
        pb.ConfirmRequest(
            subscriber_id="cq", store_id=status.store_id, confirmed_offset=status.max_offset
        ),
        timeout=RPC_TIMEOUT_S,
    )
    svc.stop()
    damage_body(svc.data_dir, stored[-1])
    again = start()
    sub = again.subscriber("cq")
    assert sub is not None and sub.confirmed_offset == stored[-1]
    assert sub.updated_at_ms > 0


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("a store id of 5 bytes", grpc.StatusCode.INVALID_ARGUMENT),
        ("epochs that go back", grpc.StatusCode.INVALID_ARGUMENT),
        ("more epochs than starts", grpc.StatusCode.INVALID_ARGUMENT),
        ("past the end in the current epoch", grpc.StatusCode.OUT_OF_RANGE),
        ("past the end, unknown, no history", grpc.StatusCode.OUT_OF_RANGE),
    ],
)
def test_a_subscribe_no_subscriber_of_this_log_could_send_is_refused_and_not_registered(
    svc: Running, case: str, code: grpc.StatusCode
) -> None:
    fill(svc, 5)
    status = svc.status()
    request = pb.SubscribeRequest(
        subscriber_id="stranger",
        store_id=status.store_id,
        confirmed_offset=status.max_offset,
        history=status.history,
    )
    if case == "a store id of 5 bytes":
        request.store_id = b"12345"
    elif case == "epochs that go back":
        request.history.CopyFrom(pb.LogHistory(epochs=[5, 4], start_offsets=[0, 10]))
    elif case == "more epochs than starts":
        request.history.CopyFrom(pb.LogHistory(epochs=[1, 2], start_offsets=[0]))
    elif case == "past the end in the current epoch":
        request.confirmed_offset = status.max_offset + 100
    else:
        request.confirmed_offset = status.max_offset + 100
        request.ClearField("history")

    def first_frame() -> object:
        return next(iter(svc.stub.Subscribe(request, timeout=RPC_TIMEOUT_S)))

    got, _ = refused(first_frame)
    assert got == code
    assert svc.subscriber("stranger") is None


def test_a_known_subscriber_without_a_history_past_the_end_is_taken_as_before_histories(
    svc: Running,
) -> None:
    """A follower from before histories (epoch 0 everywhere) that the log cut: it truncates
    where the log's own history begins to differ, not refused."""
    fill(svc, 5)
    status = svc.status()
    first = subscribe(svc, "old", store_id=status.store_id, confirmed_offset=0)
    first.handshake  # noqa: B018 - registers it
    first.cancel()
    reader = subscribe(
        svc, "old", store_id=status.store_id, confirmed_offset=status.max_offset + 100
    )
    assert reader.handshake.truncate_offset == 0  # epoch 1 wrote this log from its start
    reader.cancel()
