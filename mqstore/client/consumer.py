"""Consumer: read a topic by offset (pull, iterate, commit) or per message (receive / ack).

Pull mode keeps the positions on the client: `position(q)` is the next offset to hand out of
queue q. Nothing on the server moves when a message is read, so a pull can be repeated at
will, and a restart of cq_svc or commitlog_svc costs a pause, never a message or a duplicate.

    start       where each queue's position comes from, the first time it is needed
                ("earliest", "latest", "committed" with a `fallback`, Offset(n), {q: n},
                Timestamp(ms, boundary): positions.py)
    pull        one queue, one batch, from a given offset (raw: positions do not move)
    poll        the next messages of every assigned queue: one batch per queue per round,
                queues taken in turn; when all are caught up, waits on one Follow stream
                until one answers (a wider assignment: long polls, at most LONG_POLLS_MAX)
    messages    an iterator over poll's batches; a queue's position moves past a message
                when the message is handed out, so `commit()` after handling it covers it

This class is the policy; its parts are modules of their own, read in this order to follow a
pull from the SDK to the server and back:

    fetchers.py     how batches come: quick pulls sent ahead on PullStreams, a Follow stream,
                    long polls, a pause (one interface; which one is used is decided here)
    buffer.py       each queue's position, next pull and batch not handed out yet; answers
                    in (retention gaps, bad records), messages out, queues in turn
    answers.py      an answer's records decoded (message.py) into messages and BadRecords
    positions.py    the start, seek targets and the group's offsets (commit, auto commit)
    retry.py        calls carried through outages (backoff, reconnect_timeout_s)
    checks.py       argument checks
    simple_consumer.py  receive / ack (RocketMQ 5's SimpleConsumer), which `receive`, `ack`
                    and `change_invisible_duration` here call

A record that can never be handed out (the store refuses it as damaged, or its body does not
decompress) does not stall its queue: every message before it is handed out, then it is
surfaced once at its place as BadRecord (client/errors.py: topic, queue id, queue offset,
commit-log offset), and the queue's position moves past it. `on_bad_record` says how:

    "raise" (default)  messages() raises BadRecord when it reaches the record; poll() and
                       poll_batch() return the messages before it, and the next call raises
                       it. Either way once: the position is then past it, and calling again
                       goes on after it. receive() acknowledges such a delivery when it raises.
    "skip"             never raised: logged (WARNING), counted in stats.bad_records, stepped
                       over the same way.

A raw pull() never raises for one: it lists them in PullResult.bad_records. Pulls ask cq_svc
to report a damaged record (PullRequest.report_bad_records) rather than fail the call; the rest
of an answer after a record that does not decode here is pulled again after it is handed out.

When every cq replica is unavailable the consumer backs off and asks again from its position
(retry.py); after `reconnect_timeout_s` of that it raises Unavailable. `poll(timeout_s)`
returns [] when its own time runs out first (the outage keeps counting towards
reconnect_timeout_s across polls).

A Consumer is used from one thread at a time (as Kafka's): auto commit happens inside poll /
messages when its interval has passed, and on close.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

from mqstore.client.answers import ConsumerStats, PullResult, read_answer
from mqstore.client.buffer import PULL, Buffer, QueueState
from mqstore.client.checks import (
    PULL_MESSAGES_DEFAULT,
    PULL_MESSAGES_MAX,
    OnBadRecord,
    check_group,
    check_max_messages,
    check_not_negative,
    check_on_bad_record,
    check_positive,
    check_queue_id,
    check_tags,
    check_topic,
)
from mqstore.client.connection import Connection
from mqstore.client.errors import Cancelled, InvalidArgument, ResourceExhausted, Unavailable
from mqstore.client.fetchers import (
    FOLLOW_QUEUES_MAX,
    IDLE_PAUSE_S,
    LONG_POLLS_MAX,
    PULLS_AHEAD_MAX,
    Fetcher,
    Follower,
    IdleWait,
    LongPolls,
    PullAhead,
    PullCalls,
)
from mqstore.client.message import MADE_CHUNK, Message, PolledBatch, ReceivedMessage
from mqstore.client.positions import (
    AUTO_COMMIT_INTERVAL_S_DEFAULT,
    Fallback,
    Offset,
    Positions,
    Start,
    StartName,
    Timestamp,
    check_fallback,
    check_start,
    require_group,
)
from mqstore.client.retry import RECONNECT_TIMEOUT_S_DEFAULT, OutageRetry
from mqstore.client.settings import LONG_POLL_MS_DEFAULT, ClientSettings
from mqstore.client.simple_consumer import (
    INVISIBLE_DURATION_MS_DEFAULT,
    RECEIVE_MESSAGES_DEFAULT,
    AckResult,
    SimpleConsumer,
)
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

__all__ = [
    "AUTO_COMMIT_INTERVAL_S_DEFAULT",
    "FOLLOW_QUEUES_MAX",
    "INVISIBLE_DURATION_MS_DEFAULT",
    "LONG_POLLS_MAX",
    "PULLS_AHEAD_MAX",
    "PULL_MESSAGES_DEFAULT",
    "PULL_MESSAGES_MAX",
    "QUEUE_REFRESH_INTERVAL_S_DEFAULT",
    "RECEIVE_MESSAGES_DEFAULT",
    "RECONNECT_TIMEOUT_S_DEFAULT",
    "AckResult",
    "Consumer",
    "ConsumerStats",
    "Fallback",
    "Offset",
    "OnBadRecord",
    "PullResult",
    "SimpleConsumer",
    "Start",
    "StartName",
    "Timestamp",
]

log = logging.getLogger(__name__)

# Kafka's consumer re-reads the partition list every 5 minutes; a topic's queues appear the
# first time something is written to them, and 5 s is soon enough for a follower to notice
# while costing one ListQueues per 5 s.
QUEUE_REFRESH_INTERVAL_S_DEFAULT = 5.0
# After RESOURCE_EXHAUSTED on a follow or a long poll (the server's follow streams or waiters
# are all taken), pause before looking again.
BUSY_PAUSE_S = 0.2


class Consumer:
    """Reads one topic: pull mode (client positions, optional group commits) and receive/ack
    mode (server-side invisibility, group required). See the module docstring."""

    def __init__(
        self,
        connection: Connection | ClientSettings | None,
        topic: str,
        *,
        group: str | None = None,
        queues: Iterable[int] | None = None,
        start: Start | None = None,
        fallback: Fallback = "earliest",
        tags: Sequence[str] | str = (),
        max_messages: int = PULL_MESSAGES_DEFAULT,
        long_poll_ms: int = LONG_POLL_MS_DEFAULT,
        auto_commit: bool = False,
        auto_commit_interval_s: float = AUTO_COMMIT_INTERVAL_S_DEFAULT,
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S_DEFAULT,
        queue_refresh_interval_s: float = QUEUE_REFRESH_INTERVAL_S_DEFAULT,
        on_bad_record: OnBadRecord = "raise",
    ) -> None:
        self.topic = check_topic(topic)
        self.on_bad_record = check_on_bad_record(on_bad_record)
        self.group = check_group(group)
        self.start: Start = check_start(
            ("committed" if group else "earliest") if start is None else start, self.group
        )
        self.fallback = check_fallback(fallback)
        self.tags = check_tags(tags)
        self.max_messages = check_max_messages(max_messages)
        self.long_poll_ms = check_not_negative(long_poll_ms, "long_poll_ms")
        if auto_commit and self.group is None:
            raise InvalidArgument("auto_commit needs a group", field="group")
        check_positive(auto_commit_interval_s, "auto_commit_interval_s")
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_s
        self.reconnect_timeout_s = check_not_negative(reconnect_timeout_s, "reconnect_timeout_s")
        self.queue_refresh_interval_s = check_positive(
            queue_refresh_interval_s, "queue_refresh_interval_s"
        )

        self._fixed: list[int] | None = None
        if queues is not None:
            self._fixed = list(dict.fromkeys(check_queue_id(q) for q in queues))
            if not self._fixed:
                raise InvalidArgument("queues is empty (None means every queue)", field="queues")
            if isinstance(self.start, Mapping):
                extra = sorted(set(self.start) - set(self._fixed))
                if extra:
                    raise InvalidArgument(
                        f"start names queues {extra} that are not assigned", field="start"
                    )

        if isinstance(connection, Connection):
            self._conn = connection
            self._owns_connection = False
        else:
            self._conn = Connection(connection)
            self._owns_connection = True

        self.stats = ConsumerStats()
        self._retry = OutageRetry(self._conn, self.topic, self.reconnect_timeout_s, self.stats)
        self._positions = Positions(
            self._retry,
            self.topic,
            group=self.group,
            start=self.start,
            fallback=self.fallback,
            auto_commit=auto_commit,
            auto_commit_interval_s=auto_commit_interval_s,
        )
        self._buffer = Buffer(
            self.topic,
            tags=self.tags,
            on_bad_record=self.on_bad_record,
            stats=self.stats,
            start_of=lambda q: self._positions.initial(q, late=False),
        )
        # The fetchers (fetchers.py): quick pulls, and the wait of a caught-up consumer,
        # which _waiter picks from long_poll_ms and the assignment's width.
        self._pulls = PullCalls(
            self._retry,
            self.topic,
            tags=self.tags,
            max_messages=self.max_messages,
            stats=self.stats,
        )
        self._ahead = PullAhead(self._pulls, self._buffer)
        self._follower = Follower(self._pulls, self._buffer, self.long_poll_ms, self._ahead)
        self._long_polls = LongPolls(self._pulls, self._buffer, self.long_poll_ms, self._ahead)
        self._idle = IdleWait(self._pulls, self._buffer)
        self._fetchers: tuple[Fetcher, ...] = (
            self._ahead,
            self._follower,
            self._long_polls,
            self._idle,
        )
        self._receiver: SimpleConsumer | None = None  # receive / ack, made when first used

        self._assigned: list[int] = list(self._fixed) if self._fixed is not None else []
        self._listed_at: float | None = None  # monotonic time of the last ListQueues
        self._known: set[int] = set()  # every queue ListQueues has shown
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit positions (auto_commit) and release the connection if it is this
        consumer's own. Calling it again does nothing."""
        if self._closed:
            return
        for fetcher in self._fetchers:
            fetcher.stop()
        try:
            if self.auto_commit:
                self._positions.commit_changed(self._buffer.positions())
        finally:
            self._closed = True
            if self._owns_connection:
                self._conn.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise Cancelled("the consumer is closed")

    # -- raw pull --------------------------------------------------------------------------------

    def pull(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int | None = None,
        long_poll_ms: int = 0,
        tags: Sequence[str] | str | None = None,
    ) -> PullResult:
        """One Pull of `queue_id` from `offset`. Positions do not move. A record that can never
        be handed out (damaged in the store, or failing the client's own checks) is never
        returned: it is listed in PullResult.bad_records, and next_offset is past it."""
        self._check_open()
        request = self._pulls.request(
            queue_id,
            offset,
            max_messages=max_messages,
            long_poll_ms=long_poll_ms,
            tags=None if tags is None else check_tags(tags),
        )
        response = self._retry.retry(lambda: self._pulls.pull(request))
        run, _, bad, _ = read_answer(self.topic, queue_id, response, PULL)
        return PullResult(
            status=pb.GetMessageStatus.Name(response.status),
            messages=run[:],
            next_offset=response.next_begin_offset,
            min_offset=response.min_offset,
            max_offset=response.max_offset,
            bad_records=bad,
        )

    # -- positions -------------------------------------------------------------------------------

    def assignment(self) -> list[int]:
        """The queues this consumer reads (with queues=None: every queue of the topic that
        exists, as of the last listing)."""
        self._check_open()
        return list(self._retry.retry(lambda: self._queue_ids(refresh=False)))

    def position(self, queue_id: int) -> int:
        """The next offset of `queue_id` this consumer hands out (resolved from `start` the
        first time)."""
        self._check_open()
        return self._buffer.state(self._assigned_id(queue_id)).position

    def seek(self, queue_id: int, offset: int) -> None:
        self._check_open()
        queue_id = self._assigned_id(queue_id)
        if offset < 0:
            raise InvalidArgument(f"offset {offset} is negative", field="offset")
        self._set(queue_id, offset)

    def seek_to_time(self, ms: int, boundary: str = "lower") -> None:
        """Every assigned queue to the offset of store time `ms` (see Timestamp)."""
        self._check_open()
        at = Timestamp(ms, boundary)
        for q in self._retry.retry(lambda: self._queue_ids(refresh=False)):
            self._set(q, self._positions.offset_for_time(q, at))

    def seek_to_beginning(self) -> None:
        self._check_open()
        for q, (lo, _) in self._positions.bounds(self.assignment()).items():
            self._set(q, lo)

    def seek_to_end(self) -> None:
        self._check_open()
        for q, (_, hi) in self._positions.bounds(self.assignment()).items():
            self._set(q, hi)

    def _set(self, queue_id: int, offset: int) -> None:
        if queue_id in self._buffer.queues:
            for fetcher in self._fetchers:
                fetcher.forget(queue_id)  # they pull from the old position
        self._buffer.set(queue_id, offset)

    def _assigned_id(self, queue_id: int) -> int:
        check_queue_id(queue_id)
        if queue_id in self._retry.retry(lambda: self._queue_ids(refresh=False)):
            return queue_id
        # With queues=None it may have appeared since the last listing.
        if self._fixed is None and queue_id in self._retry.retry(
            lambda: self._queue_ids(refresh=True, force=True)
        ):
            return queue_id
        raise InvalidArgument(
            f"queue {queue_id} of {self.topic} is not assigned to this consumer "
            f"(assigned: {self._assigned})",
            field="queue_id",
        )

    # -- the queue list --------------------------------------------------------------------------

    def _queue_ids(self, *, refresh: bool, force: bool = False) -> list[int]:
        """The assignment. With queues=None: listed once, then again when `refresh` and the
        refresh interval has passed; queues that appear later start at their beginning."""
        if self._fixed is not None:
            return self._assigned
        now = time.monotonic()
        due = (
            force
            or self._listed_at is None
            or (refresh and now - self._listed_at >= self.queue_refresh_interval_s)
        )
        if due:
            # Not retried here: poll's loop rides out an outage within its own time.
            listed = self._conn.call_cq(
                lambda s: s.ListQueues,
                pb.ListQueuesRequest(topic=self.topic),
                name="ConsumeQueue/ListQueues",
            )
            first = self._listed_at is None
            for info in listed.queues:
                q = info.queue_id
                if q in self._known:
                    continue
                if q not in self._buffer.queues:  # else positioned by a seek already
                    if first:
                        offset = self._positions.listed(q, info)
                    else:
                        offset = self._positions.initial(q, late=True)
                        log.info("%s: queue %d appeared; reading it from %d", self.topic, q, offset)
                    self._buffer.set(q, offset)
                self._known.add(q)
                self._assigned.append(q)
            self._assigned.sort()
            self._listed_at = time.monotonic()
        return self._assigned

    def _refresh_due_s(self) -> float | None:
        """Seconds until the queue list is due again (None: a fixed assignment)."""
        if self._fixed is not None or self._listed_at is None:
            return None
        return max(0.0, self._listed_at + self.queue_refresh_interval_s - time.monotonic())

    # -- poll ------------------------------------------------------------------------------------

    def poll(self, timeout_s: float | None = None) -> list[Message]:
        """The next messages of the assigned queues (one batch from each queue that has
        some, queues in turn). When every queue is caught up, waits until something
        arrives or `timeout_s` passes (None: one long poll of `long_poll_ms`; 0: no wait).
        Positions move past everything returned."""
        self._check_open()
        self._poll_fill(timeout_s)
        return self._buffer.drain()

    def poll_batch(self, timeout_s: float | None = None) -> PolledBatch:
        """poll() as columns (PolledBatch: bodies, queue ids, queue offsets), no Message made
        unless one is asked for: the same messages, waits and positions as poll()."""
        self._check_open()
        self._poll_fill(timeout_s)
        return PolledBatch.of(self._buffer.drain_parts())

    def _poll_fill(self, timeout_s: float | None) -> None:
        wait_s = self.long_poll_ms / 1000.0 if timeout_s is None else max(0.0, timeout_s)
        self._maybe_auto_commit()
        self._fill(time.monotonic() + wait_s)

    def __iter__(self) -> Iterator[Message]:
        return self.messages(follow=True)

    def messages(self, *, follow: bool = True, limit: int | None = None) -> Iterator[Message]:
        """Messages one at a time, each queue in order. follow=True: forever (waits when
        caught up; new queues of the topic join when queues=None). follow=False: stops when
        every queue has reached its end as of the moment it got there. `limit`: at most that
        many messages. A queue's position moves past a message as it is handed out."""
        self._check_open()
        if limit is not None and limit < 0:
            raise InvalidArgument("limit must not be negative", field="limit")
        return self._messages(follow, limit)

    def _messages(self, follow: bool, limit: int | None) -> Iterator[Message]:
        handed = 0
        buffer = self._buffer
        if not follow:
            self._follower.stop()  # this walk pulls on its own; a follow would hold a long poll
            for state in buffer.queues.values():
                state.caught_up = False  # only what this walk sees counts
        # Queues that reached their end in this walk, with the state they reached it in (a
        # seek replaces the state, and the queue is read again).
        ended: dict[int, QueueState] = {}
        queues = buffer.queues
        stats = self.stats
        while limit is None or handed < limit:
            self._check_open()
            self._maybe_auto_commit()
            found = buffer.next_buffered()
            if found is not None:
                # A queue's whole batch, then the next queue's: a tight loop that stops when
                # the batch changes under it (a seek, a poll) or the consumer closes.
                q, state = found
                if not state.has_messages:
                    buffer.hand_out_bad(state)  # raises (on_bad_record="raise")
                    continue
                # A chunk of the batch made at once (MessageRun.made), handed out one by one;
                # the queue's position follows `taken` (QueueState.position).
                messages = state.messages
                taken = state.taken
                stop = (
                    len(messages) if limit is None else min(len(messages), taken + limit - handed)
                )
                for at in range(taken, stop, MADE_CHUNK):
                    auto_commit = self.auto_commit
                    for i, message in enumerate(
                        messages.made(at, min(stop, at + MADE_CHUNK)), at + 1
                    ):
                        state.taken = i
                        stats.messages += 1
                        handed += 1
                        yield message
                        # A poll, a seek or a close between two messages: stop here.
                        if state.taken != i or state.dropped or self._closed:
                            break
                        if auto_commit:
                            self._maybe_auto_commit()
                    else:
                        continue
                    break
                continue
            if follow:
                # With long polling off, a caught-up round still pauses (IDLE_PAUSE_S).
                self._fill(time.monotonic() + max(self.long_poll_ms / 1000.0, IDLE_PAUSE_S))
                continue
            queue_ids = self._retry.retry(lambda: self._queue_ids(refresh=False))
            for q in queue_ids:
                current = queues.get(q)
                if current is not None and current.caught_up:
                    ended[q] = current
            active = [q for q in queue_ids if q not in ended or ended[q] is not queues.get(q)]
            if not active:
                return
            self._retry.retry(lambda: self._ahead.fetch(active))  # noqa: B023 - called at once

    # -- filling the buffer: which fetcher, and what its errors mean ------------------------------

    def _fill(self, deadline: float) -> None:
        """Buffer the next batches: a round of quick pulls, then a wait while every queue is
        caught up, until something is buffered or `deadline` passes. Rides out outages."""
        while True:
            try:
                if self._fill_once(deadline):
                    self._retry.recovered()
                    return
                self._retry.recovered()
            except Unavailable as err:
                if not self._retry.back_off(err, deadline):
                    return
                self._buffer.look_again()  # with blocking calls (replica failover)
                continue
            if time.monotonic() >= deadline:
                return

    def _fill_once(self, deadline: float) -> bool:
        """One step of _fill; True when something is buffered."""
        queue_ids = self._queue_ids(refresh=True)
        buffer = self._buffer
        if buffer.buffered():
            return True
        waiter = self._waiter(queue_ids)
        if waiter.holds(queue_ids):
            # A Follow stream answers every queue as it gets something, caught up or not.
            self._wait(waiter, queue_ids, self._wait_ms(deadline))
            if buffer.buffered():
                return True
            if waiter.holds(queue_ids):
                return False  # nothing within the time
        self._follower.stop()  # ended, or its queues or positions are not these
        if not queue_ids:
            pause = deadline - time.monotonic()
            due = self._refresh_due_s()
            if due is not None:
                pause = min(pause, due)
            if pause > 0:
                time.sleep(pause)  # nothing to pull until the topic has a queue
            return False
        wait_ms = self._wait_ms(deadline)
        # A round of quick pulls unless every queue is known to be caught up and there is
        # time for a wait (which answers at once when something came meanwhile).
        if (
            wait_ms <= 0
            or self.long_poll_ms == 0
            or not all(buffer.state(q).caught_up for q in queue_ids)
        ):
            self._ahead.fetch(queue_ids)
            if buffer.buffered():
                return True
            wait_ms = self._wait_ms(deadline)
            if wait_ms <= 0:
                return False
        self._wait(waiter, queue_ids, wait_ms)
        return buffer.buffered()

    def _waiter(self, queue_ids: list[int]) -> Fetcher:
        """The fetcher of a caught-up consumer: a pause with long polling off, else one
        Follow stream over every queue, or long polls past FOLLOW_QUEUES_MAX queues."""
        if self.long_poll_ms == 0:
            return self._idle
        if len(queue_ids) <= FOLLOW_QUEUES_MAX:
            return self._follower
        return self._long_polls

    def _wait(self, waiter: Fetcher, queue_ids: list[int], wait_ms: int) -> None:
        """`waiter`'s fetch, and what its error means: refused (RESOURCE_EXHAUSTED: the
        server's follow streams or long polls are all taken) is a pause, then quick pulls
        until one is free; UNAVAILABLE after some answers came is for the next round (what
        came is handed out first); anything else is the caller's."""
        try:
            waiter.fetch(queue_ids, wait_ms)
        except ResourceExhausted as err:
            log.warning("%s: %s refused (%s); pulling instead", self.topic, waiter.name, err)
            time.sleep(BUSY_PAUSE_S)
            self._buffer.look_again()
        except Unavailable:
            if not self._buffer.buffered():
                raise

    def _wait_ms(self, deadline: float) -> int:
        """How long a wait may last: until `deadline`, and back for the queue list."""
        wait_ms = int((deadline - time.monotonic()) * 1000)
        due = self._refresh_due_s()
        if due is not None:
            wait_ms = min(wait_ms, int(due * 1000))
        return wait_ms

    @property
    def following(self) -> bool:
        """A Follow stream is open: new messages of every assigned queue come without a new
        call (poll, iteration and messages(follow=True) open it once caught up)."""
        return self._follower.following

    # -- group offsets ---------------------------------------------------------------------------

    def committed(self, queue_id: int) -> int | None:
        """The group's committed offset of `queue_id`; None when it never committed one."""
        self._check_open()
        return self._positions.committed(queue_id)

    def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Set the group's offsets: `offsets`, or every queue's position (the next offset to
        read) when None."""
        self._check_open()
        require_group(self.group)
        if offsets is None:
            offsets = self._buffer.positions()
        for q, offset in offsets.items():
            check_queue_id(q)
            if offset < 0:
                raise InvalidArgument(f"offset {offset} is negative", field="offset")
        self._positions.commit(offsets)

    def _maybe_auto_commit(self) -> None:
        self._positions.maybe_auto_commit(self._buffer.positions)

    # -- receive / ack (simple_consumer.py) ------------------------------------------------------

    def receive(
        self,
        queue_id: int,
        *,
        max_messages: int = RECEIVE_MESSAGES_DEFAULT,
        invisible_duration_ms: int = INVISIBLE_DURATION_MS_DEFAULT,
        long_poll_ms: int = 0,
    ) -> list[ReceivedMessage]:
        """SimpleConsumer.receive for this consumer's group: messages of `queue_id`, each
        invisible to the group for `invisible_duration_ms` unless acknowledged.

        A delivery whose record can never be handed out is acknowledged (settled for the
        group) and, with on_bad_record="raise", raised as BadRecord: at once when the answer
        holds nothing else, else by the next receive() of the queue, before it asks for more
        (the messages received with it are returned first)."""
        return self._simple().receive(
            queue_id,
            max_messages=max_messages,
            invisible_duration_ms=invisible_duration_ms,
            long_poll_ms=long_poll_ms,
        )

    def ack(self, items: Iterable[ReceivedMessage | str], queue_id: int | None = None) -> AckResult:
        """SimpleConsumer.ack: acknowledge deliveries (ReceivedMessage, or receipt handles of
        `queue_id`); stale receipts are listed in the result, not raised."""
        return self._simple().ack(items, queue_id)

    def change_invisible_duration(
        self, item: ReceivedMessage | str, ms: int, queue_id: int | None = None
    ) -> str:
        """SimpleConsumer.change_invisible_duration: hide (or show, with 0) a delivery for
        `ms` from now; the receipt to use from now on, or "" when the given one was stale."""
        return self._simple().change_invisible_duration(item, ms, queue_id)

    def _simple(self) -> SimpleConsumer:
        """The SimpleConsumer behind receive / ack, sharing this consumer's connection,
        stats and outage retry."""
        self._check_open()
        group = require_group(self.group)
        if self._receiver is None:
            self._receiver = SimpleConsumer.sharing(
                self._retry, self.topic, group, self.on_bad_record
            )
        return self._receiver
