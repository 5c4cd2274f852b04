"""The shared subscriber loop (mqstore/rpc/subscriber.py), with the index as its sink: after a
handshake from a replaced commit log, the replica is not caught up (not ready) until it has
replayed the new log, so it never answers with a partial index."""

from __future__ import annotations

from pathlib import Path

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.sink import IndexSink
from mqstore.dispatch import DispatchEntry
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.subscriber import Subscriber, wait_until
from tests.index_svc.conftest import EPHEMERAL, SEGMENT_ARGS, start_commitlog
from tests.index_svc.support import append


class WatchedSink(IndexSink):
    """The index sink, noting at each batch of a new store whether the loop says caught up."""

    def __init__(self, engine: IndexEngine) -> None:
        super().__init__(engine)
        self.subscriber: Subscriber | None = None
        self.caught_up_at_batches_of_new_store: list[bool] = []
        self.first_store = b""

    def on_batch(self, entries: list[DispatchEntry], next_offset: int) -> None:
        if self.first_store and self.store_id != self.first_store:
            assert self.subscriber is not None
            self.caught_up_at_batches_of_new_store.append(self.subscriber.caught_up)
        super().on_batch(entries, next_offset)


def test_a_replaced_log_makes_the_subscriber_catch_up_again(tmp_path: Path) -> None:
    first = start_commitlog(tmp_path, "first")
    port = first.ports["port"]
    with make_channel(first.target) as channel:
        append(commitlog_pb2_grpc.CommitLogStub(channel), "T", [("k", "")])
    # The replacement log: another store, with messages, prepared on a port of its own.
    second = start_commitlog(tmp_path, "second")
    with make_channel(second.target) as channel:
        stored = append(commitlog_pb2_grpc.CommitLogStub(channel), "T", [("k", "")] * 5)
    assert second.stop() == 0

    engine = IndexEngine(IndexConfig.for_tests(str(tmp_path / "index")))
    engine.open()
    sink = WatchedSink(engine)
    subscriber = Subscriber(first.target, "index-0", sink, include_keys=True, max_batch_entries=1)
    sink.subscriber = subscriber
    subscriber.start()
    replacement: ServiceProcess | None = None
    try:
        assert subscriber.wait_caught_up(30)
        sink.first_store = sink.store_id
        assert first.stop() == 0
        replacement = ServiceProcess(
            "commitlog_svc",
            second.data_dir,
            args=[EPHEMERAL[0], str(port), *EPHEMERAL[2:], *SEGMENT_ARGS],
            log_path=second.log_path,
        )
        replacement.start()
        replacement.wait_listening()
        assert wait_until(lambda: sink.applied_offset >= stored.end_offset, 30)
        # One entry a batch: the first batches of the new store came before it was caught up.
        assert sink.caught_up_at_batches_of_new_store
        assert sink.caught_up_at_batches_of_new_store[0] is False
    finally:
        subscriber.stop()
        engine.close()
        if replacement is not None:
            replacement.stop()
