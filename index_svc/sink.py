"""The index engine as the subscriber loop's DispatchSink, and the idle flush timer.

    engine = IndexEngine(config); engine.open()
    sink = IndexSink(engine)
    Subscriber(target, subscriber_id, sink, include_keys=True).start()
    flusher = Flusher(engine); flusher.start()

The subscriber thread is the only writer: it calls on_handshake once per connection (the
engine agrees with the log: another store, a lost tail, expired segments) and on_batch per
dispatch batch (the engine skips replayed entries). The engine flushes after a batch once its
interval has passed; the Flusher covers the idle case, so that the confirmed offset reaches the
applied one within about one interval after the last batch.

A failure of the engine (a failed flush, a full disk) raises out of on_batch and stops the
subscriber loop for good; liveness then fails and the process is restarted into recovery.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from index_svc import metrics
from index_svc.engine import IndexEngine
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import FlushFailed
from mqstore.formats.index_checkpoint import NO_STORE_ID
from mqstore.history import LogHistory

log = logging.getLogger(__name__)

# The idle timer ticks at half the flush interval, within these bounds (a tick costs a lock).
FLUSH_TICK_MIN_S = 0.01
FLUSH_TICK_MAX_S = 1.0


class IndexSink:
    def __init__(self, engine: IndexEngine) -> None:
        self.engine = engine
        # The end of the log as far as this replica knows: the handshake's max offset, then
        # the end of each batch. What lies between it and the applied offset is dispatch lag.
        self._known_end = 0
        self.handshakes = 0

    @property
    def store_id(self) -> bytes:
        """The store followed; empty before the first handshake (the subscribe protocol's
        "never subscribed"), where the checkpoint holds zeros."""
        store_id = self.engine.store_id
        return b"" if store_id == NO_STORE_ID else store_id

    @property
    def confirmed_offset(self) -> int:
        return self.engine.confirmed_offset

    @property
    def applied_offset(self) -> int:
        return self.engine.applied_offset

    @property
    def known_end_offset(self) -> int:
        return self._known_end

    @property
    def history(self) -> LogHistory:
        """The epochs of what the index holds (the last handshake's history)."""
        return self.engine.history

    def on_handshake(
        self,
        store_id: bytes,
        min_offset: int,
        max_offset: int,
        truncate_offset: int,
        history: LogHistory,
    ) -> None:
        start = self.engine.handshake(store_id, min_offset, truncate_offset, history)
        self.handshakes += 1
        self._known_end = max_offset
        log.info(
            "index agrees with the log [%d, %d) in epoch %d, truncated at %d: dispatch from %d",
            min_offset,
            max_offset,
            history.last_epoch,
            truncate_offset,
            start,
        )
        self._gauges()

    def on_batch(self, entries: Sequence[DispatchEntry], next_offset: int) -> None:
        """Apply a batch: a frame as columns (from the subscriber loop) or an entry list."""
        try:
            if isinstance(entries, DispatchColumns):
                written = self.engine.apply_columns(entries)
            else:
                written = self.engine.apply(entries)
        except FlushFailed:
            metrics.FLUSH_FAILURES.inc()
            raise
        metrics.KEYS_INDEXED.inc(written)
        metrics.ENTRIES_APPLIED.inc(len(entries))
        self._known_end = max(self._known_end, next_offset)
        if len(entries):
            if isinstance(entries, DispatchColumns):
                last_ms = int(entries.store_timestamps_ms[-1])
            else:
                last_ms = entries[-1].store_timestamp_ms
            lag_ms = time.time() * 1000 - last_ms
            metrics.DISPATCH_LAG_SECONDS.set(max(lag_ms, 0.0) / 1000)
        self._gauges()

    def _gauges(self) -> None:
        applied = self.engine.applied_offset
        metrics.APPLIED_OFFSET.set(applied)
        metrics.CONFIRMED_OFFSET.set(self.engine.confirmed_offset)
        metrics.DISPATCH_LAG_BYTES.set(max(self._known_end - applied, 0))


class Flusher:
    """Flushes the engine when its interval has passed and nothing else did (idle log)."""

    def __init__(self, engine: IndexEngine) -> None:
        self.engine = engine
        interval_s = engine.config.flush_interval_ms / 1000
        self._tick_s = min(max(interval_s / 2, FLUSH_TICK_MIN_S), FLUSH_TICK_MAX_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="index-flush", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                if self.engine.flush_if_due():
                    metrics.CONFIRMED_OFFSET.set(self.engine.confirmed_offset)
            except Exception as exc:
                metrics.FLUSH_FAILURES.inc()
                log.exception("index flush failed; writes stop until a restart")
                self.failure = exc
                return
