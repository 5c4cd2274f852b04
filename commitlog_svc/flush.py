"""The flush thread: group commit (sync), interval flush (async), checkpoints.

One thread does every flush of the commit log, so positions only ever move forward from one
place. What it does each round:

    mode    trigger                               work
    sync    an append waits on an offset           flush(0) of everything written; wake waiters
    async   every flush_interval_ms                flush(least_pages), least 0 when thorough
    both    every checkpoint_interval_ms           the checkpoint callback (flushes, then writes)

A flush that raises stops everything: the failure is recorded, every waiting append is answered
FLUSH_DISK_FAILED, the store's owner is told (it stops accepting writes), and no flush is ever
retried. After a failed fsync the kernel may have dropped the dirty pages and a retry could
"succeed" without the data (fsyncgate; RocketMQ #2706): restart and recovery are the only way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.messages import PutStatus
from mqstore.storage import failpoints
from mqstore.storage.clock import Clock
from mqstore.storage.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)


class FlushService:
    def __init__(
        self,
        queue: MappedFileQueue,
        config: CommitLogConfig,
        clock: Clock,
        *,
        checkpoint: Callable[[], None],
        on_failure: Callable[[BaseException], None],
        after_flush: Callable[[float], None] | None = None,
    ) -> None:
        """`after_flush(seconds)` runs after every flush (its duration: msync of the dirty
        range, which is fsync of that range); the store uses it to wake dispatch and to feed
        the latency histogram."""
        self._queue = queue
        self._after_flush = after_flush
        self._config = config
        self._clock = clock
        self._checkpoint = checkpoint
        self._on_failure = on_failure
        self._sync = config.flush is FlushMode.SYNC
        self._cond = threading.Condition()
        # One flush at a time: the thread's rounds, and flush_now from another thread (a
        # replica's truncation). A round's checkpoint calls flush_now after its flush let go.
        self._flush_lock = threading.Lock()
        self._requested = 0
        self._stop = False
        self.failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        now = clock.monotonic_ms()
        self._next_flush = now + config.flush_interval_ms
        self._next_thorough = now + config.flush_thorough_interval_ms
        self._next_checkpoint = now + config.checkpoint_interval_ms

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="commitlog-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # -- appenders ------------------------------------------------------------------------------

    def wait_durable(self, end_offset: int, timeout_ms: int) -> PutStatus:
        """Sync mode: block until every byte below `end_offset` is flushed."""
        deadline = self._clock.monotonic_ms() + timeout_ms
        with self._cond:
            if end_offset > self._requested:
                self._requested = end_offset
                self._cond.notify_all()
            while self._queue.flushed_where < end_offset:
                if self.failure is not None:
                    return PutStatus.FLUSH_DISK_FAILED
                remaining_ms = deadline - self._clock.monotonic_ms()
                if remaining_ms <= 0:
                    return PutStatus.FLUSH_DISK_TIMEOUT
                self._cond.wait(remaining_ms / 1000.0)
        return PutStatus.PUT_OK

    def request(self, end_offset: int) -> None:
        """Sync mode: flush every byte below `end_offset` soon, without waiting for it (a
        follower's group commit: it reports its durable offset when the flush is done)."""
        with self._cond:
            if end_offset > self._requested:
                self._requested = end_offset
                self._cond.notify_all()

    def truncated(self, offset: int) -> None:
        """The log was cut at `offset`: requests beyond it can never be met (and would keep
        the thread flushing)."""
        with self._cond:
            self._requested = min(self._requested, offset)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------------------

    def _due(self, now: float) -> bool:
        if self._sync and self._requested > self._queue.flushed_where:
            return True
        if now >= self._next_checkpoint:
            return True
        return not self._sync and now >= self._next_flush

    def _next_deadline(self) -> float:
        deadline = self._next_checkpoint
        if not self._sync:
            deadline = min(deadline, self._next_flush)
        return deadline

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._due(self._clock.monotonic_ms()):
                        wait_ms = self._next_deadline() - self._clock.monotonic_ms()
                        self._cond.wait(max(wait_ms, 1.0) / 1000.0)
                    if self._stop:
                        return
                self._round(self._clock.monotonic_ms())
        except failpoints.SimulatedCrash:
            with self._cond:
                self.failure = failpoints.SimulatedCrash("flush thread crashed")
                self._cond.notify_all()
        except Exception as exc:  # the environment failed: stop writes, never retry
            log.critical("commit log flush failed, writes stop until restart: %r", exc)
            with self._cond:
                self.failure = exc
                self._cond.notify_all()
            self._on_failure(exc)

    def _round(self, now: float) -> None:
        config = self._config
        if self._sync:
            if self._requested > self._queue.flushed_where:
                self._flush(0)
        elif now >= self._next_flush:
            least = config.flush_least_pages
            if now >= self._next_thorough:
                least = 0
                self._next_thorough = now + config.flush_thorough_interval_ms
            self._flush(least)
            self._next_flush = now + config.flush_interval_ms
        if now >= self._next_checkpoint:
            self._checkpoint()
            self._next_checkpoint = now + config.checkpoint_interval_ms
            with self._cond:
                self._cond.notify_all()

    def _flush(self, least_pages: int) -> None:
        with self._flush_lock:
            failpoints.hit("commitlog.before_flush")
            began = time.perf_counter()
            self._queue.flush(least_pages)
            took = time.perf_counter() - began
            failpoints.hit("commitlog.after_flush")
        with self._cond:
            self._cond.notify_all()
        if self._after_flush is not None:
            self._after_flush(took)

    def flush_now(self) -> None:
        """Flush everything (used by the checkpoint and on shutdown)."""
        self._flush(0)

    @property
    def alive(self) -> bool:
        """The thread runs and no flush failed (the service's liveness)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self.failure is None
