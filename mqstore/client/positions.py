"""Where a consumer's queues are read from: the start, seek targets and the group's offsets.

A Consumer keeps one position per queue on the client (buffer.py: the next offset to hand
out). This module says where a position comes from, and writes positions to the group:

    start       the first time a queue's position is needed:
                  "earliest" / "latest"   the queue's min / max offset (GetQueueInfo)
                  "committed"             the group's offset (FetchOffset); where the group
                                          never committed (-1), `fallback`
                  Offset(n) / {q: n}      as given
                  Timestamp(ms, b)        GetOffsetByTime, "lower" or "upper" boundary
                A queue that appears after the first listing (`late`) holds nothing but what
                was written since: it starts at its beginning, unless the start names it or
                the group committed an offset for it.
    seek        bounds(...) (seek_to_beginning / seek_to_end), offset_for_time(...)
    commit      committed(q), commit({q: offset}), and auto commit: the positions that
                changed since the last commit, every auto_commit_interval_s and on close
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from mqstore.client.checks import check_queue_id
from mqstore.client.errors import InvalidArgument
from mqstore.client.retry import OutageRetry
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

AUTO_COMMIT_INTERVAL_S_DEFAULT = 5.0

StartName = Literal["earliest", "latest", "committed"]
Fallback = Literal["earliest", "latest"]

_BOUNDARIES = {"lower": common_pb2.LOWER, "upper": common_pb2.UPPER}


@dataclass(frozen=True)
class Offset:
    """A start position: offset `n` of every queue."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise InvalidArgument(f"offset {self.n} is negative", field="offset")


@dataclass(frozen=True)
class Timestamp:
    """A store time in epoch milliseconds. boundary "lower": the first message stored at or
    after it; "upper": the last message stored at or before it (RocketMQ's BoundaryType)."""

    ms: int
    boundary: str = "lower"

    def __post_init__(self) -> None:
        if self.ms < 0:
            raise InvalidArgument(f"timestamp {self.ms} ms is negative", field="timestamp_ms")
        if self.boundary not in _BOUNDARIES:
            raise InvalidArgument(
                f"boundary {self.boundary!r} is not 'lower' or 'upper'", field="boundary"
            )

    @property
    def boundary_proto(self) -> common_pb2.Boundary.ValueType:
        return _BOUNDARIES[self.boundary]


Start = StartName | Offset | Timestamp | Mapping[int, int]


def check_start(start: Start, group: str | None) -> Start:
    if isinstance(start, Offset | Timestamp):
        return start
    if isinstance(start, Mapping):
        checked = {}
        for q, n in start.items():
            check_queue_id(q)
            if n < 0:
                raise InvalidArgument(f"start offset {n} of queue {q} is negative", field="start")
            checked[q] = n
        return checked
    if start not in ("earliest", "latest", "committed"):
        raise InvalidArgument(
            f"start {start!r} is not 'earliest', 'latest', 'committed', an Offset, a "
            "Timestamp or a {queue: offset} dict",
            field="start",
        )
    if start == "committed" and group is None:
        raise InvalidArgument("start='committed' needs a group", field="start")
    return start


def check_fallback(fallback: str) -> Fallback:
    if fallback == "earliest":
        return "earliest"
    if fallback == "latest":
        return "latest"
    raise InvalidArgument(f"fallback {fallback!r} is not 'earliest' or 'latest'", field="fallback")


def require_group(group: str | None) -> str:
    if group is None:
        raise InvalidArgument(
            "this needs a consumer group: Consumer(..., group=...)", field="group"
        )
    return group


class Positions:
    """The start of each queue, seek targets, and the group's offsets of one topic."""

    def __init__(
        self,
        retry: OutageRetry,
        topic: str,
        *,
        group: str | None,
        start: Start,
        fallback: Fallback,
        auto_commit: bool,
        auto_commit_interval_s: float,
    ) -> None:
        self._retry = retry
        self.topic = topic
        self.group = group
        self.start = start
        self.fallback = fallback
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_s
        self._last_committed: dict[int, int] = {}
        self._next_auto_commit = time.monotonic() + auto_commit_interval_s

    # -- the start ---------------------------------------------------------------------------------

    def initial(self, queue_id: int, *, late: bool) -> int:
        """Where a queue starts (see the module docstring; `late`: it appeared after the
        first listing)."""
        start = self.start
        missing: Fallback = "earliest" if late else self.fallback
        if isinstance(start, Mapping):
            if queue_id in start:
                return int(start[queue_id])
            return self.end(queue_id, missing)
        if start == "committed":
            committed = self.committed(queue_id)
            if committed is None:
                return self.end(queue_id, missing)
            self._last_committed[queue_id] = committed  # auto commit: nothing to repeat
            return committed
        if late:
            return self.end(queue_id, "earliest")
        if isinstance(start, Offset):
            return start.n
        if isinstance(start, Timestamp):
            return self.offset_for_time(queue_id, start)
        return self.end(queue_id, "latest" if start == "latest" else "earliest")

    def listed(self, queue_id: int, info: pb.QueueInfo) -> int:
        """The start of a queue of the first listing, without a GetQueueInfo when the listing
        already holds the answer."""
        if self.start == "earliest":
            return info.min_offset
        if self.start == "latest":
            return info.max_offset
        return self.initial(queue_id, late=False)

    # -- seek targets ------------------------------------------------------------------------------

    def end(self, queue_id: int, which: str) -> int:
        lo, hi = self.bounds([queue_id])[queue_id]
        return lo if which == "earliest" else hi

    def bounds(self, queue_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
        """Each queue's (min offset, max offset)."""
        out = {}
        for q in queue_ids:
            info = self._retry.call(
                lambda s: s.GetQueueInfo,
                pb.GetQueueInfoRequest(topic=self.topic, queue_id=q),
                "ConsumeQueue/GetQueueInfo",
            )
            out[q] = (info.min_offset, info.max_offset)
        return out

    def offset_for_time(self, queue_id: int, at: Timestamp) -> int:
        request = pb.GetOffsetByTimeRequest(
            topic=self.topic, queue_id=queue_id, timestamp_ms=at.ms, boundary=at.boundary_proto
        )
        response = self._retry.call(
            lambda s: s.GetOffsetByTime, request, "ConsumeQueue/GetOffsetByTime"
        )
        return response.offset

    # -- the group's offsets -----------------------------------------------------------------------

    def committed(self, queue_id: int) -> int | None:
        """The group's committed offset of `queue_id`; None when it never committed one."""
        request = pb.FetchOffsetRequest(
            group=require_group(self.group), topic=self.topic, queue_id=check_queue_id(queue_id)
        )
        response = self._retry.call(lambda s: s.FetchOffset, request, "ConsumeQueue/FetchOffset")
        return None if response.offset < 0 else response.offset

    def commit(self, offsets: Mapping[int, int]) -> None:
        group = require_group(self.group)
        for q, offset in offsets.items():
            request = pb.CommitOffsetRequest(
                group=group, topic=self.topic, queue_id=q, offset=offset
            )
            self._retry.call(lambda s: s.CommitOffset, request, "ConsumeQueue/CommitOffset")
            self._last_committed[q] = offset

    def commit_changed(self, positions: Mapping[int, int]) -> None:
        """Commit the positions that changed since they were last committed."""
        changed = {q: p for q, p in positions.items() if self._last_committed.get(q) != p}
        if changed:
            self.commit(changed)
        self._next_auto_commit = time.monotonic() + self.auto_commit_interval_s

    def maybe_auto_commit(self, positions: Callable[[], Mapping[int, int]]) -> None:
        """With auto commit: commit_changed once its interval has passed."""
        if self.auto_commit and time.monotonic() >= self._next_auto_commit:
            self.commit_changed(positions())
