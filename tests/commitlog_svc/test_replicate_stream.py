"""The Replicate stream over real gRPC on loopback (commitlog_svc/replication/feed.py and
link.py): a follower copies a leader's log while it appends, to byte-identity; its acks move
the in-sync tracker's commit offset; a diverged follower truncates to the agreed offset; an
empty follower of a leader whose first segments expired starts from the leader's tables; the
hello is checked."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replication.feed import LeaderFeed
from commitlog_svc.replication.in_sync import InSyncTracker
from commitlog_svc.replication.link import FollowerLink
from mqstore.errors import FailedPrecondition, Unavailable
from mqstore.rpc.errors import ErrorInterceptor
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.storage.clock import SystemClock
from tests.commitlog_svc.replica_support import (
    FILE_BYTES,
    Producers,
    assert_same_log,
    leader,
    replica,
)

GROUP = "g"


class _Feeding(pb_grpc.CommitLogServicer):
    def __init__(self, feed: LeaderFeed) -> None:
        self.feed = feed

    def Replicate(
        self, request_iterator: Iterator[pb.ReplicateRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateResponse]:
        return self.feed.serve(request_iterator, context)


class Leader:
    """A leader's ReplicaLog behind a real gRPC server answering Replicate."""

    def __init__(self, log: ReplicaLog, members: tuple[str, ...] = ("a", "b")) -> None:
        self.log = log
        self.tracker = InSyncTracker(
            "a", members, min_insync=1, lag_max_ms=10_000, clock=SystemClock()
        )
        self.feed = LeaderFeed(log, group=GROUP, name="a", tracker=lambda: self.tracker)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8), interceptors=[ErrorInterceptor()]
        )
        pb_grpc.add_CommitLogServicer_to_server(_Feeding(self.feed), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = f"127.0.0.1:{port}"
        self.server.start()

    def progress(self) -> None:
        self.tracker.leader_progress(self.log.end_offset, self.log.end_offset)

    def stop(self) -> None:
        self.feed.stop()
        self.server.stop(grace=None).wait()


class Following:
    """A FollowerLink running in a thread until stopped; its error kept."""

    def __init__(self, log: ReplicaLog, target: str, name: str = "b") -> None:
        self.link = FollowerLink(log, group=GROUP, name=name)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self.thread.start()

    def _run(self, target: str) -> None:
        try:
            self.link.run(target, self.stop_event)
        except BaseException as err:  # kept for the test to look at
            self.error = err

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def started() -> Iterator[list[Any]]:
    running: list[Any] = []
    yield running
    for item in reversed(running):
        item.stop()


def wait_until(condition: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_follower_copies_the_leader_while_it_appends_and_the_commit_offset_follows(
    tmp_path: Path, started: list[Any]
) -> None:
    lead = Leader(leader(tmp_path / "a"))
    started.append(lead)
    producers = Producers(seed=7)
    for _ in range(40):
        producers.append(lead.log)
    follower_log = replica(tmp_path / "b")  # empty: adopts the group's store id
    follower = Following(follower_log, lead.target)
    started.append(follower)
    for _ in range(300):  # several segments, appended while it copies
        producers.append(lead.log)
    lead.progress()
    wait_until(lambda: follower_log.end_offset == lead.log.end_offset)
    wait_until(lambda: lead.tracker.commit_offset == lead.log.end_offset)
    assert follower.error is None
    assert_same_log(lead.log, follower_log)
    (view,) = [r for r in lead.tracker.view().replicas if r.name == "b"]
    assert view.connected and view.end_offset == lead.log.end_offset
    wait_until(lambda: follower.link.commit_offset == lead.log.end_offset)


def test_a_diverged_follower_truncates_to_the_agreed_offset_then_copies(
    tmp_path: Path, started: list[Any]
) -> None:
    """The follower led epoch 1 and wrote a tail the new leader never had; the new leader
    (epoch 2) wrote other bytes from the same offset. The stream cuts the follower's tail."""
    old = leader(tmp_path / "b", epoch=1)
    producers = Producers(seed=11)
    for _ in range(30):
        producers.append(old)
    new_log = replica(tmp_path / "a")
    new_log.adopt_store_id(old.store_id)
    while new_log.end_offset < old.end_offset:
        new_log.append_replicated(old.read_chunk(new_log.end_offset, max_bytes=2_000))
    agreed = new_log.end_offset
    for _ in range(10):  # the old leader's tail the new one never receives
        producers.append(old)
    assert old.end_offset > agreed
    old.become_follower()
    new_log.become_leader(2)
    lead = Leader(new_log)
    started.append(lead)
    for _ in range(25):
        producers.append(new_log)
    follower = Following(old, lead.target)
    started.append(follower)
    wait_until(lambda: old.end_offset == new_log.end_offset and old.history == new_log.history)
    assert follower.error is None
    assert_same_log(new_log, old)
    assert old.history.epoch_at(agreed) == 2


def test_an_empty_follower_of_a_log_whose_first_segments_expired_starts_from_its_tables(
    tmp_path: Path, started: list[Any]
) -> None:
    lead_log = leader(tmp_path / "a")
    producers = Producers(seed=3)
    while lead_log.max_offset < 6 * FILE_BYTES:
        producers.append(lead_log)
    deleted = lead_log.queue.delete_expired_file_by_time(
        expired_before_ms=0, floor_offset=3 * FILE_BYTES, clean_immediately=True, max_files=3
    )
    assert deleted == 3 and lead_log.min_offset == 3 * FILE_BYTES
    lead = Leader(lead_log)
    started.append(lead)
    follower_log = replica(tmp_path / "b")
    follower = Following(follower_log, lead.target)
    started.append(follower)
    for _ in range(20):
        producers.append(lead_log)
    wait_until(lambda: follower_log.end_offset == lead_log.end_offset)
    assert follower.error is None
    assert_same_log(lead_log, follower_log)


def test_a_follower_of_another_log_is_refused(tmp_path: Path, started: list[Any]) -> None:
    lead = Leader(leader(tmp_path / "a"))
    started.append(lead)
    Producers(seed=1).append(lead.log)
    other = leader(tmp_path / "b")  # its own store id, and bytes
    Producers(seed=2).append(other)
    other.become_follower()
    follower = Following(other, lead.target)
    follower.thread.join(timeout=20)
    assert isinstance(follower.error, FailedPrecondition), follower.error
    assert "can join only empty" in str(follower.error)


@pytest.mark.parametrize(
    ("hello", "code", "words"),
    [
        (pb.ReplicaHello(group="other", replica="b"), "FAILED_PRECONDITION", "not 'other'"),
        (pb.ReplicaHello(group=GROUP, replica=""), "INVALID_ARGUMENT", "replica name"),
        (pb.ReplicaHello(group=GROUP, replica="x" * 65), "INVALID_ARGUMENT", "replica name"),
        (pb.ReplicaHello(group=GROUP, replica="a"), "FAILED_PRECONDITION", "own name"),
        (
            pb.ReplicaHello(group=GROUP, replica="b", end_offset=-1),
            "INVALID_ARGUMENT",
            "end_offset",
        ),
    ],
)
def test_a_bad_hello_is_refused_with_its_reason(
    tmp_path: Path, started: list[Any], hello: pb.ReplicaHello, code: str, words: str
) -> None:
    lead = Leader(leader(tmp_path / "a"))
    started.append(lead)
    with grpc.insecure_channel(lead.target) as channel:
        stub = pb_grpc.CommitLogStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            list(stub.Replicate(iter([pb.ReplicateRequest(hello=hello)]), timeout=10))
    assert raised.value.code().name == code
    assert words in (raised.value.details() or "")


def test_a_replica_that_does_not_lead_refuses_to_feed(tmp_path: Path, started: list[Any]) -> None:
    lead = Leader(leader(tmp_path / "a"))
    started.append(lead)
    lead.log.become_follower()
    follower = Following(replica(tmp_path / "b"), lead.target)
    follower.thread.join(timeout=20)
    assert isinstance(follower.error, Unavailable), follower.error
    assert "does not lead" in str(follower.error)
