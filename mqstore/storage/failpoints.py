"""Named crash points.

Production code calls `hit("commitlog.after_flush")` at each durable step. Nothing happens
unless a test armed that name, so the cost is one dict lookup. A test arms a point with an
action, usually raising `SimulatedCrash` so that the engine stops exactly there, and then
crashes the SimDisk underneath to see what a power loss at that step leaves behind.

    with failpoints.armed("checkpoint.before_write", failpoints.crash):
        ...

Every point is declared once, in `POINTS` below (the production points) or by the test that
owns it (`declare`). Arming, disarming or (while anything is armed) hitting an undeclared
name raises `UnknownFailpoint`, so a misspelled name fails the test instead of arming nothing.
`armed()` also fails a block that ends without the point having been hit; `hits(name)` counts
the hits since the point was last armed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Each production point: where it sits (the step just done or about to be done).
POINTS: dict[str, str] = {
    # mqstore/storage/mapped_file_queue.py
    "segment.after_create": "a new segment file is created, not yet in the queue",
    "segment.after_delete": "one expired segment file is deleted, the next not yet",
    # commitlog_svc/flush.py
    "commitlog.before_flush": "the flush thread is about to flush the log's pages",
    "commitlog.after_flush": "the flush thread flushed the log's pages",
    # commitlog_svc/store_files.py
    "checkpoint.before_write": "the commit log is about to write its checkpoint",
    "checkpoint.after_write": "the commit log wrote its checkpoint",
    "epochs.before_write": "the commit log is about to write its epoch history",
    "commitlog.before_remove_abort": "a clean close is about to remove the abort marker",
    # commitlog_svc/replica.py: a replica's truncation, in order
    "replica.truncate.before_checkpoint": "the cut's checkpoint is not yet written",
    "replica.truncate.after_checkpoint": "the cut's checkpoint is written",
    "replica.truncate.after_zero": "the cut segment's tail is zeroed",
    "replica.truncate.after_segments": "the segments past the cut are removed",
    "replica.truncate.after_history": "the epoch history is cut",
    # commitlog_svc/replica.py: a replica starting afresh at a leader's offset
    "replica.start.after_delete": "the old segments are deleted",
    "replica.start.after_checkpoint": "the new start's checkpoint is written",
    # cq_svc/file_store.py, cq_svc/rocks_store.py
    "cq.after_put": "a batch of consume-queue entries is applied",
    "cq.rocks.before_sync": "the RocksDB store is about to sync its WAL",
    # cq_svc/checkpoint.py
    "cq.checkpoint.before_write": "cq_svc is about to write its checkpoint",
    "cq.checkpoint.after_write": "cq_svc wrote its checkpoint",
    # cq_svc/servicer.py
    "cq.pull_stream.after_answer": "a pull stream's answer is sent, the next not yet read",
    # cq_svc/acks.py
    "cq.ack.after_append": "ack entries are appended to the journal, not yet synced",
    "cq.ack.fold.after_segments": "a fold wrote the ack segments, not yet the meta",
    "cq.ack.fold.after_meta": "a fold wrote the meta, the journal not yet emptied",
    # index_svc/engine.py
    "index.after_apply": "a batch is applied to the index files",
    "index.after_create": "a new index file is created",
    "index.after_seal": "an index file is sealed",
    "index.before_checkpoint": "the index is about to write its checkpoint",
    "index.after_checkpoint": "the index wrote its checkpoint",
}

_declared: dict[str, str] = dict(POINTS)
_armed: dict[str, Callable[[str], None]] = {}
_hits: dict[str, int] = {}
_lock = threading.Lock()


class SimulatedCrash(BaseException):
    """Raised by an armed crash point. A BaseException so that `except Exception` in the
    engine cannot swallow it: the process is meant to be dead at this point."""


class UnknownFailpoint(LookupError):
    """A name that no `POINTS` entry or `declare()` call introduced (a misspelling)."""


class FailpointNotHit(AssertionError):
    """An `armed()` block ended without the code under test reaching the point."""


def crash(name: str) -> None:
    raise SimulatedCrash(name)


def declare(name: str, where: str) -> str:
    """A point of a test's own (production points go in `POINTS`); returns the name."""
    with _lock:
        if name in _declared:
            raise ValueError(f"failpoint {name!r} is already declared: {_declared[name]}")
        _declared[name] = where
    return name


def _check(name: str) -> None:
    if name not in _declared:
        raise UnknownFailpoint(f"no failpoint is named {name!r} (see failpoints.POINTS)")


def hit(name: str) -> None:
    if _armed:
        _check(name)
        action = _armed.get(name)
        if action is not None:
            with _lock:
                _hits[name] = _hits.get(name, 0) + 1
            action(name)


def hits(name: str) -> int:
    """How many times `name` was hit since it was last armed (0 when never armed)."""
    _check(name)
    with _lock:
        return _hits.get(name, 0)


def arm(name: str, action: Callable[[str], None] = crash) -> None:
    _check(name)
    with _lock:
        _armed[name] = action
        _hits[name] = 0


def disarm(name: str) -> None:
    _check(name)
    with _lock:
        _armed.pop(name, None)


def disarm_all() -> None:
    with _lock:
        _armed.clear()


@contextmanager
def armed(name: str, action: Callable[[str], None] = crash) -> Iterator[None]:
    """`name` armed for the block; a block that ends normally without a hit fails with
    `FailpointNotHit` (a block ended by an exception keeps that exception)."""
    arm(name, action)
    try:
        yield
    finally:
        disarm(name)
    if hits(name) == 0:
        raise FailpointNotHit(f"failpoint {name!r} was armed but never hit")
