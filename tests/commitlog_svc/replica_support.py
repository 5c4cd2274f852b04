"""Helpers of the replica tests (commitlog_svc/replica.py): replicas on real files or a SimDisk,
a leader's appends of every kind, copying chunk by chunk, crashes, and the check that two
replicas hold the same log."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.messages import PutStatus
from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import Chunk
from mqstore.formats.properties import encode_properties
from mqstore.formats.record_batch import table_to_pairs
from mqstore.storage.disk import Disk
from tests.commitlog.message_in import MessageIn, as_batches

FILE_BYTES = 4096
TOPICS = ("orders", "audit")
# No timer fires within a test with these: flushes and checkpoints happen when a test asks.
NEVER_MS = 600_000

OPENED: list[ReplicaLog] = []


def config(data_dir: Path | str, **overrides: Any) -> CommitLogConfig:
    values: dict[str, Any] = {"file_bytes": FILE_BYTES}
    values.update(overrides)
    return CommitLogConfig.for_tests(str(data_dir), **values)


def replica(data_dir: Path | str, *, disk: Disk | None = None, **overrides: Any) -> ReplicaLog:
    """A replica opened on `data_dir` (a follower), closed at the end of the test."""
    log = ReplicaLog(config(data_dir, **overrides), disk=disk)
    OPENED.append(log)
    log.open()
    return log


def reopen(log: ReplicaLog, *, disk: Disk | None = None) -> ReplicaLog:
    again = ReplicaLog(log.config, disk=disk if disk is not None else log.disk)
    OPENED.append(again)
    again.open()
    return again


def leader(data_dir: Path | str, *, epoch: int = 1, **overrides: Any) -> ReplicaLog:
    log = replica(data_dir, **overrides)
    log.become_leader(epoch)
    return log


def follower_of(
    lead: ReplicaLog, data_dir: Path | str, *, disk: Disk | None = None, **overrides: Any
) -> ReplicaLog:
    log = replica(data_dir, disk=disk, **overrides)
    log.adopt_store_id(lead.store_id)
    return log


def close_all() -> None:
    while OPENED:
        log = OPENED.pop()
        if log.running:
            log.close()


# -- appends -----------------------------------------------------------------------------------


def message(rng: random.Random, i: int, *, body_bytes: int | None = None) -> MessageIn:
    """Message i: a topic and queue drawn from a few, a body of a drawn size (a few close to
    a segment, so that rolls come often), KEYS/TAGS properties on most."""
    size = body_bytes if body_bytes is not None else rng.choice([1, 20, 100, 300, 1500, 3000])
    props = encode_properties({"KEYS": f"k{i}", "TAGS": "t"}) if rng.random() < 0.8 else b""
    return MessageIn(
        topic=rng.choice(TOPICS),
        queue_id=rng.randrange(3),
        body=rng.randbytes(size),
        properties=props,
        born_timestamp_ms=1_700_000_000_000 + i,
    )


class Producers:
    """Appends of every kind to a leader: single messages and batches, plain and idempotent
    (a few producers, each with increasing sequences)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sequences = {f"producer-{k}": 0 for k in range(3)}
        self.count = 0

    def append(self, log: ReplicaLog, *, messages: int | None = None) -> None:
        rng = self.rng
        n = messages if messages is not None else rng.choice([1, 1, 2, 5, 12])
        # A batch is written into one segment: several messages are small ones.
        body_bytes = None if n == 1 else rng.choice([1, 20, 100, 200])
        batch = [message(rng, self.count + j, body_bytes=body_bytes) for j in range(n)]
        self.count += n
        producer = None
        if rng.random() < 0.6:
            pid = rng.choice(sorted(self.sequences))
            self.sequences[pid] += rng.randrange(1, 3)
            producer = (pid, self.sequences[pid])
        result = log.append_batch(as_batches(batch), producer=producer)
        assert all(s is PutStatus.PUT_OK for s in result.statuses), result.reasons


# -- copying -----------------------------------------------------------------------------------


def copy(
    lead: ReplicaLog,
    follower: ReplicaLog,
    *,
    rng: random.Random | None = None,
    max_bytes: int = 1 << 20,
    chunks_max: int | None = None,
) -> list[Chunk]:
    """Copy the leader's log to the follower chunk by chunk (sizes drawn from `rng` when
    given) until it holds everything readable, or `chunks_max` chunks. Returns the chunks."""
    sent: list[Chunk] = []
    while chunks_max is None or len(sent) < chunks_max:
        bound = rng.choice([100, 300, 1000, 2500, 5000, 1 << 20]) if rng else max_bytes
        chunk = lead.read_chunk(follower.end_offset, max_bytes=bound)
        follower.append_replicated(chunk)
        sent.append(chunk)
        if not chunk.data:
            break
    return sent


# -- comparing ---------------------------------------------------------------------------------


def segments(log: ReplicaLog) -> dict[str, bytes]:
    """Every segment file of the log, by name, as its disk holds it."""
    directory = log.config.commitlog_dir
    return {
        name: log.disk.read(os.path.join(directory, name)) for name in log.disk.listdir(directory)
    }


def producers_of(log: ReplicaLog) -> dict[str, tuple[int, list[Any]]]:
    return {e.producer_id: (e.last_sequence, e.requests) for e in log.producers.snapshot()}


def assert_same_log(lead: ReplicaLog, follower: ReplicaLog) -> None:
    """The follower holds the leader's log: segment files byte-identical, the same ends,
    queue-offset and producer tables, history and newest store time."""
    assert follower.end_offset == lead.end_offset
    assert follower.min_offset == lead.min_offset
    mine, theirs = segments(lead), segments(follower)
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        assert mine[name] == theirs[name], f"segment {name} differs"
    assert follower.queue_offsets() == lead.queue_offsets()
    assert producers_of(follower) == producers_of(lead)
    assert follower.history == lead.history
    assert follower.newest_store_timestamp_ms() == lead.newest_store_timestamp_ms()


def table_of(log: ReplicaLog) -> dict[tuple[str, int], int]:
    return table_to_pairs(log._queue_offsets)


# -- crashes -----------------------------------------------------------------------------------


# Settings under which nothing is flushed or checkpointed unless a test asks (a crash then finds
# the checkpoint behind and unflushed bytes to lose).
QUIET: dict[str, Any] = {
    "flush": FlushMode.ASYNC,
    "flush_interval_ms": NEVER_MS,
    "flush_thorough_interval_ms": NEVER_MS,
    "checkpoint_interval_ms": NEVER_MS,
}
