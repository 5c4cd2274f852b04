"""The log's history: which epoch wrote each byte of the commit log, and where two logs agree.

An offset alone cannot say which log it was confirmed against: after a recovery cuts the log
and appends regrow it past a follower's confirmed offset, the same offset names other bytes.
So the commit log keeps a history, a list of epochs:

    epoch   start_offset
      0          0          the log before it kept a history (an upgraded store), or a
      1      4_096_000      follower's "epoch 0 from 0" when it has no history at all
      2      9_113_450      each start of the commit log (and, with replication, each new
                            leader) begins the next epoch at the end of what it recovered

Epoch e covers [start_e, start_{e+1}); the last covers everything from its start on. The rule
that makes the history useful: within one epoch an offset always holds the same bytes. A
recovery that cuts the log never writes the cut range again under the epoch that wrote it,
because the next writes are the next start's, and every start begins a new epoch. So two
copies of the log (the commit log and a follower's view of it: cq_svc, index_svc, a replica)
hold the same bytes wherever their histories give the same epoch.

`agreed_offset` is the handshake's question: the last offset up to which both histories give
every byte the same epoch. The follower drops everything at or past it and replays from there
(Kafka's leader-epoch truncation, RocketMQ 5's epoch file; DESIGN.md "The log's history").

Entries: epochs strictly increase, starts never decrease, an epoch that wrote nothing is
replaced by the next one at the same start (it covers no byte). Pure: no I/O
(mqstore/formats/epoch_file.py is the file; the services keep it with write_atomic).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from mqstore.errors import InvalidArgument

# Entries a history keeps. Each start of the commit log adds one; entries wholly below the
# log's minimum are dropped (compacted). 10,000 restarts within the retained log is far beyond
# any real store, and keeps the file and a handshake under 160 KB.
EPOCHS_MAX = 10_000
# A follower with no history (a store from before histories, or a lost history file) is taken
# to hold epoch 0 from offset 0: it agrees with an upgraded log up to the first epoch the log
# began after the upgrade, and with a log created with a history nowhere (a full replay).
LEGACY_EPOCH = 0


@dataclass(frozen=True, slots=True)
class Epoch:
    epoch: int
    start_offset: int


class LogHistory:
    """An immutable history of epochs (see the module docstring)."""

    __slots__ = ("_epochs", "_starts")

    def __init__(self, entries: Iterable[tuple[int, int] | Epoch] = ()) -> None:
        epochs: list[int] = []
        starts: list[int] = []
        for entry in entries:
            epoch, start = (entry.epoch, entry.start_offset) if isinstance(entry, Epoch) else entry
            if epoch < 0 or start < 0:
                raise InvalidArgument(
                    f"epoch {epoch} at {start}: epochs and offsets are not negative",
                    field="history",
                )
            if epochs and (epoch <= epochs[-1] or start < starts[-1]):
                raise InvalidArgument(
                    f"epoch {epoch} at {start} after epoch {epochs[-1]} at {starts[-1]}: "
                    "epochs must increase and their starts must not decrease",
                    field="history",
                )
            if starts and start == starts[-1]:  # the earlier epoch wrote nothing
                epochs[-1] = epoch
                continue
            epochs.append(epoch)
            starts.append(start)
        if len(epochs) > EPOCHS_MAX:
            raise InvalidArgument(
                f"{len(epochs)} epochs; a history holds at most {EPOCHS_MAX}", field="history"
            )
        self._epochs = tuple(epochs)
        self._starts = tuple(starts)

    @classmethod
    def legacy(cls) -> LogHistory:
        return cls([(LEGACY_EPOCH, 0)])

    # -- reading --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._epochs)

    def __iter__(self) -> Iterator[Epoch]:
        return (Epoch(e, s) for e, s in zip(self._epochs, self._starts, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogHistory):
            return NotImplemented
        return self._epochs == other._epochs and self._starts == other._starts

    def __hash__(self) -> int:
        return hash((self._epochs, self._starts))

    def __repr__(self) -> str:
        inner = ", ".join(f"{e}@{s}" for e, s in zip(self._epochs, self._starts, strict=True))
        return f"LogHistory([{inner}])"

    @property
    def epochs(self) -> tuple[int, ...]:
        return self._epochs

    @property
    def starts(self) -> tuple[int, ...]:
        return self._starts

    @property
    def last_epoch(self) -> int:
        """The newest epoch (-1 for an empty history)."""
        return self._epochs[-1] if self._epochs else -1

    def epoch_at(self, offset: int) -> int | None:
        """The epoch that wrote the byte at `offset` (None: before the first entry)."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def epoch_before(self, offset: int) -> int:
        """The epoch of the last byte below `offset`: what a confirmed offset was confirmed
        in (-1 at offset 0 or before the first entry)."""
        if offset <= 0:
            return -1
        epoch = self.epoch_at(offset - 1)
        return -1 if epoch is None else epoch

    # -- changes (each returns a new history) ----------------------------------------------

    def begin(self, epoch: int, start_offset: int) -> LogHistory:
        """The history with epoch `epoch` beginning at `start_offset` (the end of the log):
        it must be newer than every epoch here. At EPOCHS_MAX the oldest entry goes."""
        entries: list[tuple[int, int]] = list(zip(self._epochs, self._starts, strict=True))
        entries.append((epoch, start_offset))
        if len(entries) > EPOCHS_MAX:
            entries = entries[-EPOCHS_MAX:]
        return LogHistory(entries)

    def next_epoch(self) -> int:
        return self.last_epoch + 1 if self._epochs else LEGACY_EPOCH + 1

    def compacted(self, min_offset: int) -> LogHistory:
        """Without the entries that cover nothing at or above `min_offset` (the log's oldest
        byte): the newest entry starting at or below it stays, it covers the minimum."""
        keep_from = max(bisect.bisect_right(self._starts, min_offset) - 1, 0)
        return LogHistory(zip(self._epochs[keep_from:], self._starts[keep_from:], strict=True))

    def truncated(self, offset: int) -> LogHistory:
        """The history of a log cut at `offset`: entries starting at or past it go."""
        keep = bisect.bisect_left(self._starts, offset)
        return LogHistory(zip(self._epochs[:keep], self._starts[:keep], strict=True))

    # -- agreement ------------------------------------------------------------------------------

    def agreed_offset(self, other: LogHistory, end_offset: int) -> int:
        """The largest offset P <= end_offset such that every byte below P has the same epoch
        in both histories, where both know it (a byte before a history's first entry is
        taken to agree: the follower holds nothing the log no longer has there)."""
        if end_offset <= 0:
            return max(end_offset, 0)
        # Every place where either history's epoch can change, in order; between two of them
        # both epochs are constant, so comparing at each boundary compares every byte.
        boundaries = sorted(set(self._starts) | set(other._starts))
        for at in boundaries:
            if at >= end_offset:
                break
            mine, theirs = self.epoch_at(at), other.epoch_at(at)
            if mine is not None and theirs is not None and mine != theirs:
                return at
        return end_offset
