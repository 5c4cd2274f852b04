"""Admin: what an operator asks of the store, without the protos.

    a = Admin(conn)                                   # a Connection, ClientSettings or None
    a.status()                                        # ClusterStatus (commit log + replicas)
    a.lag()                                           # [SubscriberLag] from the commit log
    a.topics(); a.queues(topic); a.queue(topic, q)    # consume-queue positions
    a.offset_for_time(topic, q, ts_ms, "lower")       # time lookup of one queue
    a.group_offsets(g, topic); a.commit_offset(g, topic, q, n)
    a.reset_group_offsets(g, topic, to="earliest" | "latest" | n | Timestamp(ms))
    a.query_by_key(topic, key); a.iter_key(topic, key); a.query_by_uniq_key(topic, id)
    a.get_message(msg_id)                             # by offset msg id, from the commit log

Index routing. With shard_count > 1 an index replica holds only the keys (and unique ids) whose
`mqstore.sharding.shard_of(topic, key, shard_count)` is its shard_index, and answers a query for
another shard's key with FAILED_PRECONDITION naming the right shard. So the Admin asks every
configured index address for GetStatus once (cached), groups the replicas by shard_index
(caught-up replicas first), and sends each query to a replica of the key's shard, moving to the
next replica of that shard on UNAVAILABLE (down, or still catching up). The cache is refreshed
when a shard has no replica left to try, or when a replica says the key is not its shard (its
configuration changed since the cache was built). Replicas that disagree on shard_count are a
deployment error: every query fails with FailedPrecondition until the replicas agree.
A `dns-all:HOST:PORT` entry (ClientSettings) is resolved at each discovery, so replicas added
or moved behind a headless Service are found at the next refresh.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Literal, TypeVar

import grpc

from mqstore.client.connection import Connection
from mqstore.client.consumer import Timestamp
from mqstore.client.errors import (
    ClientError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings, resolve_addresses
from mqstore.group_lag import queue_lag
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq_pb
from mqstore.rpc.gen.index.v1 import index_pb2 as ix_pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc as ix_grpc
from mqstore.rpc.messages import host_text
from mqstore.sharding import shard_of

__all__ = [
    "INDEX_RESULTS_MAX",
    "ITER_PAGE_SIZE_DEFAULT",
    "Admin",
    "Boundary",
    "ClusterStatus",
    "CommitLogStatus",
    "CqReplicaStatus",
    "IndexReplicaStatus",
    "KeyPageOverflow",
    "QueueInfo",
    "ResetTarget",
    "SubscriberLag",
    "Timestamp",  # the reset target by time, the Consumer's type (re-exported for callers)
]

T = TypeVar("T")


Boundary = Literal["lower", "upper"]
ResetTarget = Literal["earliest", "latest"] | int | Timestamp

_BOUNDARIES = {"lower": common_pb2.LOWER, "upper": common_pb2.UPPER}

# What index_svc answers at most for one QueryByKey (its max_results default, the bound of its
# candidate walk); iter_key never asks for more in one page.
INDEX_RESULTS_MAX = 1_024
# iter_key's page: a quarter of the cap, leaving room in one answer for the matches a page
# re-reads at its boundary (see iter_key).
ITER_PAGE_SIZE_DEFAULT = 256
# The index stores an entry's time in whole seconds from its file's begin time: an entry's
# indexed time lies in (store time - 1 s, store time]. index_svc answers a window exactly to the
# millisecond (it checks the records' store times); iter_key's pages also hold at this
# resolution.
INDEX_TIME_RESOLUTION_MS = 1_000
# Replica GetStatus calls in flight at once for status() and shard discovery.
STATUS_FANOUT_MAX = 16


class KeyPageOverflow(ResourceExhausted):
    """iter_key cannot get past a point: more matches than one index answer may hold (1,024)
    fall within one second of the index's time resolution, so no time range separates them."""


# -- status ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubscriberLag:
    """A subscriber of the commit log (a cq or index replica) and how far behind it is."""

    subscriber_id: str
    confirmed_offset: int
    lag_bytes: int  # max_offset - confirmed_offset
    lag_ms: int  # store time of the newest message - that of the first unconfirmed one
    connected: bool
    # How far its open stream has sent (-1: not connected): the lag as of now is the log's
    # max offset minus this; confirmed_offset trails it by what is not yet durable there.
    sent_offset: int = -1
    # When it last subscribed or confirmed (wall clock, ms; 0: unknown). One not seen for long
    # still holds retention back until it is forgotten (`mqstore subscribers forget`).
    last_seen_ms: int = 0

    @property
    def last_seen_age_s(self) -> float | None:
        if self.last_seen_ms <= 0:
            return None
        return max(0.0, time.time() - self.last_seen_ms / 1000)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class CommitLogStatus:
    address: str
    store_id: str  # hex
    store_host: str
    min_offset: int
    max_offset: int
    flushed_offset: int
    confirm_offset: int  # how far dispatch may go
    flush: str  # "sync" | "async"
    writable: bool
    subscribers: tuple[SubscriberLag, ...] = ()
    epoch: int = -1  # the log's current epoch (a new one at every start)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["subscribers"] = [s.to_json() for s in self.subscribers]
        return out


@dataclass(frozen=True)
class CqReplicaStatus:
    """One consume-queue replica; when `reachable` is False only `error` says anything."""

    address: str
    reachable: bool
    error: str = ""
    store_id: str = ""  # hex of the commit log it follows; "" before its first handshake
    confirmed_offset: int = 0
    applied_offset: int = 0
    caught_up: bool = False
    store: str = ""  # "file" | "rocksdb"
    queue_count: int = 0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class IndexReplicaStatus:
    """One index replica; when `reachable` is False only `error` says anything."""

    address: str
    reachable: bool
    error: str = ""
    store_id: str = ""
    confirmed_offset: int = 0
    applied_offset: int = 0
    caught_up: bool = False
    shard_count: int = 0
    shard_index: int = 0
    exact: bool = False

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ClusterStatus:
    commitlog: CommitLogStatus
    cq: tuple[CqReplicaStatus, ...] = ()
    index: tuple[IndexReplicaStatus, ...] = ()

    @property
    def unreachable(self) -> list[str]:
        """Addresses of the replicas that did not answer."""
        down = [r.address for r in self.cq if not r.reachable]
        return down + [r.address for r in self.index if not r.reachable]

    def to_json(self) -> dict[str, object]:
        return {
            "commitlog": self.commitlog.to_json(),
            "cq": [r.to_json() for r in self.cq],
            "index": [r.to_json() for r in self.index],
        }


@dataclass(frozen=True)
class QueueInfo:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int  # the next offset to be written

    @property
    def messages(self) -> int:
        return self.max_offset - self.min_offset

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_proto(cls, q: cq_pb.QueueInfo) -> QueueInfo:
        return cls(q.topic, q.queue_id, q.min_offset, q.max_offset)


@dataclass(frozen=True)
class QueueLag:
    """A consumer group on one queue: what it committed and what it has still to read."""

    queue_id: int
    committed: int | None  # the next offset the group reads; None: it never committed here
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        """Messages still to read (mqstore/group_lag.py)."""
        return queue_lag(self.committed, self.min_offset, self.max_offset)

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "lag": self.lag}


@dataclass(frozen=True)
class GroupLag:
    """A consumer group on one topic: every queue of the topic, committed there or not."""

    group: str
    topic: str
    queues: tuple[QueueLag, ...]

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    def to_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "topic": self.topic,
            "queues": [q.to_json() for q in self.queues],
            "total_lag": self.lag,
        }


@dataclass(frozen=True)
class GroupListing:
    groups: tuple[GroupLag, ...]
    truncated: bool  # cq_svc listed only its first GROUP_OFFSETS_LISTED_MAX queue offsets


# -- index shards ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shards:
    """The index replicas by shard, as last discovered; caught-up replicas first."""

    shard_count: int
    replicas: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def demoted(self, shard: int, address: str) -> _Shards:
        """The same, with `address` tried last in its shard (it just failed)."""
        order = self.replicas.get(shard, ())
        if address not in order:
            return self
        moved = (*(a for a in order if a != address), address)
        return _Shards(self.shard_count, {**self.replicas, shard: moved})


def _shards_of(statuses: Sequence[IndexReplicaStatus]) -> _Shards:
    reachable = [s for s in statuses if s.reachable]
    if not statuses:
        raise FailedPrecondition("no index address is configured", field="index")
    if not reachable:
        errors = "; ".join(f"{s.address}: {s.error}" for s in statuses)
        raise Unavailable(f"no index replica is reachable ({errors})")
    counts = {max(1, s.shard_count) for s in reachable}
    if len(counts) > 1:
        seen = ", ".join(f"{s.address} has {s.shard_count}" for s in reachable)
        raise FailedPrecondition(f"the index replicas disagree on shard_count: {seen}")
    by_shard: dict[int, list[IndexReplicaStatus]] = {}
    for s in reachable:
        by_shard.setdefault(s.shard_index, []).append(s)
    replicas = {
        # sorted() is stable: within each group, the configured order stays.
        shard: tuple(s.address for s in sorted(group, key=lambda s: not s.caught_up))
        for shard, group in by_shard.items()
    }
    return _Shards(counts.pop(), replicas)


# -- the Admin -------------------------------------------------------------------------------------


class Admin:
    """Status, queues, group offsets, lag and key queries over one Connection.

    `connection`: a Connection is shared and left open by close(); a ClientSettings (or None,
    for ClientSettings()) makes a Connection of the Admin's own, closed by close()."""

    def __init__(self, connection: Connection | ClientSettings | None = None) -> None:
        if isinstance(connection, Connection):
            self._conn = connection
            self._owns_connection = False
        else:
            self._conn = Connection(connection or ClientSettings())
            self._owns_connection = True
        self._shards_lock = threading.Lock()
        self._shards: _Shards | None = None

    @property
    def connection(self) -> Connection:
        return self._conn

    def close(self) -> None:
        if self._owns_connection:
            self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- status ------------------------------------------------------------------------------------

    def _commitlog(self) -> commitlog_pb2_grpc.CommitLogStub:
        """The commit log; with several addresses (a broker group), the replica leading now:
        looked for at every call (admin calls are rare, and a failover may have moved it)."""
        if len(self._conn.settings.commitlog_targets) > 1:
            self._conn.find_commitlog_leader()
        return self._conn.commitlog()

    def status(self) -> ClusterStatus:
        """The commit log's status (it must answer: without it there is no store to describe)
        and every configured cq and index replica's; a replica that does not answer shows as
        unreachable, with the error, and does not fail the call. Replicas are asked in
        parallel, so a few down ones cost one deadline, not one each."""
        settings = self._conn.settings
        response = self._conn.call(
            self._commitlog().GetStatus, cl_pb.GetStatusRequest(), name="CommitLog/GetStatus"
        )
        commitlog = CommitLogStatus(
            address=self._conn.commitlog_target,
            store_id=response.store_id.hex(),
            store_host=host_text(response.store_host) if response.store_host else "",
            min_offset=response.min_offset,
            max_offset=response.max_offset,
            flushed_offset=response.flushed_offset,
            confirm_offset=response.confirm_offset,
            flush=response.flush,
            writable=response.writable,
            subscribers=tuple(_lag(s) for s in response.subscribers),
            epoch=response.history.epochs[-1] if response.history.epochs else -1,
        )
        jobs: list[Callable[[], CqReplicaStatus | IndexReplicaStatus]] = [
            *(partial(self._cq_status, a) for a in settings.cq),
            *(partial(self._index_status, a) for a in resolve_addresses(settings.index)),
        ]
        answers = _fan_out(jobs)
        cq = tuple(a for a in answers if isinstance(a, CqReplicaStatus))
        index = tuple(a for a in answers if isinstance(a, IndexReplicaStatus))
        try:
            shards = _shards_of(index)
        except ClientError:
            pass  # a query will say why; the status shows the replicas as they are
        else:
            with self._shards_lock:
                self._shards = shards
        return ClusterStatus(commitlog, cq, index)

    def lag(self) -> list[SubscriberLag]:
        """Each subscriber of the commit log (cq and index replicas) and how far behind it is."""
        response = self._conn.call(
            self._commitlog().GetStatus, cl_pb.GetStatusRequest(), name="CommitLog/GetStatus"
        )
        return [_lag(s) for s in response.subscribers]

    def forget_subscriber(self, subscriber_id: str) -> int:
        """Forget a subscriber of the commit log that will not come back (a replica scaled
        away), so that it no longer holds retention back; returns the new retention floor
        (-1: no subscriber left). NotFound when unknown, FailedPrecondition while connected."""
        if not subscriber_id:
            raise InvalidArgument("a subscriber id is required", field="subscriber_id")
        response = self._conn.call(
            self._commitlog().ForgetSubscriber,
            cl_pb.ForgetSubscriberRequest(subscriber_id=subscriber_id),
            name="CommitLog/ForgetSubscriber",
        )
        return int(response.retention_floor)

    def _cq_status(self, address: str) -> CqReplicaStatus:
        try:
            r = self._conn.call(
                self._conn.cq(address).GetStatus,
                cq_pb.GetStatusRequest(),
                name="ConsumeQueue/GetStatus",
            )
        except ClientError as err:
            return CqReplicaStatus(address, reachable=False, error=str(err))
        return CqReplicaStatus(
            address,
            reachable=True,
            store_id=r.store_id.hex(),
            confirmed_offset=r.confirmed_offset,
            applied_offset=r.applied_offset,
            caught_up=r.caught_up,
            store=r.store,
            queue_count=r.queue_count,
        )

    def _index_status(self, address: str) -> IndexReplicaStatus:
        try:
            r = self._conn.call(
                self._conn.index(address).GetStatus,
                ix_pb.GetStatusRequest(),
                name="Index/GetStatus",
            )
        except ClientError as err:
            return IndexReplicaStatus(address, reachable=False, error=str(err))
        return IndexReplicaStatus(
            address,
            reachable=True,
            store_id=r.store_id.hex(),
            confirmed_offset=r.confirmed_offset,
            applied_offset=r.applied_offset,
            caught_up=r.caught_up,
            shard_count=r.shard_count,
            shard_index=r.shard_index,
            exact=r.exact,
        )

    # -- queues ------------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Every topic that has a consume queue, sorted."""
        response = self._conn.call_cq(
            lambda s: s.ListTopics, cq_pb.ListTopicsRequest(), name="ConsumeQueue/ListTopics"
        )
        return list(response.topics)

    def queues(self, topic: str) -> list[QueueInfo]:
        """The topic's queues with their offsets; [] for a topic nothing was stored in."""
        response = self._conn.call_cq(
            lambda s: s.ListQueues,
            cq_pb.ListQueuesRequest(topic=topic),
            name="ConsumeQueue/ListQueues",
        )
        return [QueueInfo.from_proto(q) for q in response.queues]

    def existing_queues(self, topic: str, queues: Iterable[int] | None = None) -> list[QueueInfo]:
        """The topic's queues (those in `queues` when given), in queue order. NotFound for a
        topic nothing was stored in (field topic), or for named queues it does not have
        (field queues, naming the ones it has)."""
        listed = {q.queue_id: q for q in self.queues(topic)}
        if not listed:
            raise NotFound(
                f"topic {topic!r} has no consume queues: nothing was ever stored in it",
                field="topic",
            )
        if queues is None:
            return [listed[q] for q in sorted(listed)]
        wanted = sorted(set(queues))
        missing = [q for q in wanted if q not in listed]
        if missing:
            raise NotFound(
                f"topic {topic!r} has no queue {', '.join(map(str, missing))}; its queues: "
                f"{', '.join(map(str, sorted(listed)))}",
                field="queues",
            )
        return [listed[q] for q in wanted]

    def queue(self, topic: str, queue_id: int) -> QueueInfo:
        """One queue's offsets; an unknown queue is an empty one (min = max = 0), as RocketMQ
        creates queues on demand."""
        response = self._conn.call_cq(
            lambda s: s.GetQueueInfo,
            cq_pb.GetQueueInfoRequest(topic=topic, queue_id=queue_id),
            name="ConsumeQueue/GetQueueInfo",
        )
        return QueueInfo.from_proto(response)

    def offset_for_time(
        self, topic: str, queue_id: int, ts_ms: int, boundary: Boundary = "lower"
    ) -> int:
        """ "lower": the offset of the first message stored at or after ts_ms (the queue's max
        offset when there is none); "upper": that of the last message stored at or before it."""
        if boundary not in _BOUNDARIES:
            raise InvalidArgument(
                f"boundary must be 'lower' or 'upper', got {boundary!r}", field="boundary"
            )
        response = self._conn.call_cq(
            lambda s: s.GetOffsetByTime,
            cq_pb.GetOffsetByTimeRequest(
                topic=topic, queue_id=queue_id, timestamp_ms=ts_ms, boundary=_BOUNDARIES[boundary]
            ),
            name="ConsumeQueue/GetOffsetByTime",
        )
        return response.offset

    # -- group offsets -----------------------------------------------------------------------------

    def group_offsets(self, group: str, topic: str) -> dict[int, int | None]:
        """The group's committed offset (the next to read) for every queue of the topic; None
        where it never committed one."""
        return self._fetch_offsets(group, topic, self.queues(topic))

    def _fetch_offsets(
        self, group: str, topic: str, infos: Iterable[QueueInfo]
    ) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for q in infos:
            response = self._conn.call_cq(
                lambda s: s.FetchOffset,
                cq_pb.FetchOffsetRequest(group=group, topic=topic, queue_id=q.queue_id),
                name="ConsumeQueue/FetchOffset",
            )
            out[q.queue_id] = None if response.offset < 0 else response.offset
        return out

    def group_lag(self, group: str, topic: str) -> GroupLag:
        """The group's committed offset and lag on every queue of the topic (NotFound when the
        topic has no queues)."""
        infos = self.existing_queues(topic)
        return _group_lag(group, topic, infos, self._fetch_offsets(group, topic, infos))

    def groups(self, group: str | None = None) -> GroupListing:
        """Every consumer group that committed an offset (or received with acks), with its lag
        on each topic it read, sorted by group and topic; `group`: that one only. Needs an
        admin token under --secure (the answer names every group)."""
        response = self._conn.call_cq(
            lambda s: s.ListGroups,
            cq_pb.ListGroupsRequest(group=group or ""),
            name="ConsumeQueue/ListGroups",
        )
        committed: dict[tuple[str, str], dict[int, int | None]] = {}
        for o in response.offsets:
            committed.setdefault((o.group, o.topic), {})[o.queue_id] = o.offset
        queues: dict[str, list[QueueInfo]] = {}
        out = []
        for (g, topic), offsets in sorted(committed.items()):
            if topic not in queues:
                queues[topic] = self.queues(topic)
            out.append(_group_lag(g, topic, queues[topic], offsets))
        return GroupListing(tuple(out), response.truncated)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._conn.call_cq(
            lambda s: s.CommitOffset,
            cq_pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset),
            name="ConsumeQueue/CommitOffset",
        )

    def reset_group_offsets(
        self,
        group: str,
        topic: str,
        to: ResetTarget,
        queues: Iterable[int] | None = None,
        *,
        dry_run: bool = False,
    ) -> dict[int, int]:
        """Set the group's offsets on `queues` (None: every queue of the topic) and return what
        each queue was set to:

            "earliest"     the queue's min offset
            "latest"       its max offset (only messages stored from now on are read)
            n (int >= 0)   n, brought into [min, max] so that the group never points past the
                           end or at expired messages
            Timestamp      offset_for_time(ts.ms, ts.boundary), as a Consumer starting there

        A topic without queues, or a named queue the topic does not have, is NotFound: a
        misspelt topic or queue must not look like a successful reset. `dry_run`: what each
        queue would be set to, nothing committed."""
        target = _check_target(to)
        infos = self.existing_queues(topic, queues)
        out: dict[int, int] = {}
        for info in infos:
            offset = self._reset_offset(info, target)
            if not dry_run:
                self.commit_offset(group, topic, info.queue_id, offset)
            out[info.queue_id] = offset
        return out

    def _reset_offset(self, info: QueueInfo, to: ResetTarget) -> int:
        if isinstance(to, Timestamp):
            boundary: Boundary = "upper" if to.boundary == "upper" else "lower"
            return self.offset_for_time(info.topic, info.queue_id, to.ms, boundary)
        if to == "earliest":
            return info.min_offset
        if to == "latest":
            return info.max_offset
        assert isinstance(to, int)
        return min(max(to, info.min_offset), info.max_offset)

    # -- queries -----------------------------------------------------------------------------------

    def get_message(self, msg_id: str) -> Message:
        """The message with this offset msg id (RocketMQ's viewMessage): NotFound when the store
        never held it or no longer does, InvalidArgument when the id is malformed."""
        response = self._conn.call(
            self._commitlog().GetMessage,
            cl_pb.GetMessageRequest(msg_id=msg_id),
            name="CommitLog/GetMessage",
        )
        return Message.from_proto(response)

    def query_by_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = 0,
        end_ms: int = 0,
        max_messages: int = 64,
    ) -> list[Message]:
        """Messages of `topic` whose KEYS hold `key`, stored within [begin_ms, end_ms] (end 0:
        now; both inclusive, to the millisecond), newest first. The index answers at most
        1,024 (its max_results) whatever max_messages says: iter_key has no such cap."""
        request = ix_pb.QueryByKeyRequest(
            topic=topic,
            key=key,
            begin_timestamp_ms=begin_ms,
            end_timestamp_ms=end_ms,
            max_messages=max_messages,
        )
        response = self._index_call(
            topic, key, lambda s: s.QueryByKey, request, name="Index/QueryByKey"
        )
        return [Message.from_proto(m) for m in response.messages]

    def iter_key(
        self,
        topic: str,
        key: str,
        *,
        begin_ms: int = 0,
        end_ms: int = 0,
        page_size: int = ITER_PAGE_SIZE_DEFAULT,
    ) -> Iterator[Message]:
        """Every message of `topic` with `key` in [begin_ms, end_ms] (end 0: now), newest first,
        each once, with no cap: queries page backwards in time.

        Paging. The index walks newest first and answers at most 1,024; the next page asks for
        messages up to the oldest store time seen, so it re-reads the matches stored at that
        millisecond (and, from an index_svc that matched windows at its files' 1-second
        resolution, those of about the last second) already yielded: they are skipped by commit-log
        offset, and the page asks for page_size plus that many (up to 1,024), so that it
        reaches past them. Memory holds only those boundary matches, not everything yielded.

        When more than 1,024 matches (the most one answer holds) share one second, no time
        range separates them and no query reaches the older ones: iter_key raises
        KeyPageOverflow (a ResourceExhausted) after yielding what it could, rather than
        stopping early as if it had seen everything or looping forever. (A full page that
        brings nothing new can only mean this: each page asks for more than it can re-read.)
        The older messages of that second are still readable from the consume queues, by
        offset_for_time and a pull.

        Store times come from the commit log's wall clock: if it stepped back while the key's
        messages were stored, paging by time can skip messages stored before the step."""
        if not 1 <= page_size <= INDEX_RESULTS_MAX:
            raise InvalidArgument(
                f"page_size must be in [1, {INDEX_RESULTS_MAX}], got {page_size}",
                field="page_size",
            )
        end = end_ms
        # (store time, commit-log offset) of the yielded matches a later page may re-read.
        boundary: deque[tuple[int, int]] = deque()
        boundary_offsets: set[int] = set()
        while True:
            asked = min(page_size + len(boundary), INDEX_RESULTS_MAX)
            page = self.query_by_key(topic, key, begin_ms=begin_ms, end_ms=end, max_messages=asked)
            fresh = [m for m in page if m.commit_log_offset not in boundary_offsets]
            if not fresh:
                if len(page) >= asked:
                    raise KeyPageOverflow(
                        f"more than {INDEX_RESULTS_MAX} messages with key {key!r} of topic "
                        f"{topic!r} share one second of the index near store time {end} ms: "
                        "no time range reaches the older ones",
                        method="Index/QueryByKey",
                    )
                return
            for m in fresh:
                boundary.append((m.store_timestamp_ms, m.commit_log_offset))
                boundary_offsets.add(m.commit_log_offset)
                yield m
            oldest = min(m.store_timestamp_ms for m in fresh)
            end = oldest if end == 0 else min(end, oldest)
            if end < begin_ms:
                return  # not expected (a match is stored at or after begin_ms), but final
            # A match stored a second or more after `end` has an indexed time above it: no
            # later page returns it again.
            while boundary and boundary[0][0] >= end + INDEX_TIME_RESOLUTION_MS:
                boundary_offsets.discard(boundary.popleft()[1])

    def query_by_uniq_key(self, topic: str, uniq_key: str) -> list[Message]:
        """Every message stored with this unique id (a producer's retry can store one twice),
        newest first, at most 32 (the index's uniq_max_results), over all time."""
        request = ix_pb.QueryByUniqKeyRequest(topic=topic, uniq_key=uniq_key)
        response = self._index_call(
            topic, uniq_key, lambda s: s.QueryByUniqKey, request, name="Index/QueryByUniqKey"
        )
        return [Message.from_proto(m) for m in response.messages]

    # -- index routing -----------------------------------------------------------------------------

    def _index_call(
        self,
        topic: str,
        key: str,
        pick: Callable[[ix_grpc.IndexStub], Callable[..., T]],
        request: object,
        *,
        name: str,
    ) -> T:
        """One query at the key's shard: its replicas in turn (caught-up first) while they answer
        UNAVAILABLE; then, once, the shards discovered again and the shard's replicas tried
        again; then Unavailable naming the shard."""
        shards = self._index_shards(refresh=False)
        rediscovered = False
        while True:
            shard = shard_of(topic, key, shards.shard_count)
            last: ClientError | None = None
            for address in shards.replicas.get(shard, ()):
                try:
                    return self._conn.call(pick(self._conn.index(address)), request, name=name)
                except ClientError as err:
                    if err.code == grpc.StatusCode.UNAVAILABLE:
                        last = err
                        self._demote(shard, address)
                        continue
                    # FAILED_PRECONDITION from a query means "another shard's key": this
                    # replica's shard is not what the cache says. Rediscover, once.
                    if err.code == grpc.StatusCode.FAILED_PRECONDITION and not rediscovered:
                        last = err
                        break
                    raise
            if rediscovered:
                why = f": {last}" if last is not None else ": no replica of it is reachable"
                raise Unavailable(
                    f"index shard {shard} of {shards.shard_count} did not answer{why}",
                    method=name,
                )
            try:
                shards = self._index_shards(refresh=True)
            except Unavailable as err:
                raise Unavailable(
                    f"index shard {shard} of {shards.shard_count} did not answer: {err.details}",
                    method=name,
                ) from None
            rediscovered = True

    def _index_shards(self, *, refresh: bool) -> _Shards:
        with self._shards_lock:
            if self._shards is not None and not refresh:
                return self._shards
            configured = self._conn.settings.index
            # dns-all: entries are resolved here, on every discovery: scaling shows up.
            addresses = resolve_addresses(configured)
            if configured and not addresses:
                raise Unavailable(
                    f"the index addresses {', '.join(configured)} resolve to no address "
                    "(no ready replica)"
                )
            statuses = _fan_out([partial(self._index_status, a) for a in addresses])
            self._shards = _shards_of(statuses)
            return self._shards

    def _demote(self, shard: int, address: str) -> None:
        with self._shards_lock:
            if self._shards is not None:
                self._shards = self._shards.demoted(shard, address)


def _group_lag(
    group: str, topic: str, infos: Sequence[QueueInfo], committed: dict[int, int | None]
) -> GroupLag:
    return GroupLag(
        group,
        topic,
        tuple(
            QueueLag(q.queue_id, committed.get(q.queue_id), q.min_offset, q.max_offset)
            for q in infos
        ),
    )


def _lag(s: cl_pb.SubscriberStatus) -> SubscriberLag:
    return SubscriberLag(
        s.subscriber_id,
        s.confirmed_offset,
        s.lag_bytes,
        s.lag_ms,
        s.connected,
        s.sent_offset,
        s.updated_at_ms,
    )


def _fan_out(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Run the calls in parallel, answers in the calls' order."""
    if len(jobs) <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(len(jobs), STATUS_FANOUT_MAX)) as pool:
        return list(pool.map(lambda job: job(), jobs))


def _check_target(to: object) -> ResetTarget:
    if isinstance(to, Timestamp):
        return to  # checked when it was made
    if to in ("earliest", "latest"):
        return "earliest" if to == "earliest" else "latest"
    if isinstance(to, int) and not isinstance(to, bool):
        if to < 0:
            raise InvalidArgument(f"an offset is never negative, got {to}", field="to")
        return to
    raise InvalidArgument(
        f"reset to 'earliest', 'latest', an offset or a Timestamp, not {to!r}", field="to"
    )
