"""The ConsumeQueue gRPC service over CqEngine, with message bytes from commitlog_svc.

Pull (RocketMQ's getMessage, rocketmq-store.md §6.2):

    validate -> store.pull (range checks, unit scan, tag-code filter: status, corrections,
    the units to fetch) -> their records from the first source that has them all
    (record_sources.py: the segment files, the dispatch-frame tail, else ONE commit-log Read
    for all of them; every source answers as a Read would) -> the records, in order:

      READ_OK            served, after two checks: the record is the one the unit names (size,
                         queue id, queue offset, physical offset; else the log and the queue
                         disagree: UNAVAILABLE until the next handshake brings them together)
                         and, with a tag filter, its TAGS is one of the tags asked for (the unit
                         holds only the tag's hash; a colliding tag is filtered here)
      READ_OUT_OF_RANGE  the log no longer holds it: skipped while nothing is gathered yet
                         (MESSAGE_WAS_REMOVING if nothing else is), else the answer stops there
      READ_CORRUPT       never served. With report_bad_records (the SDK sets it) the answer
                         names it in bad_record after the records before it and steps over it
                         (next_begin_offset past it), so a consumer hands out what precedes
                         it, surfaces it with its offsets and goes on. Without (a caller that
                         does not set it): the answer stops before it; DATA_LOSS naming its
                         offset when nothing precedes it (the consumer must decide to skip it)

    Statuses keep RocketMQ's meaning: an out-of-range offset is a status with a correction in
    next_begin_offset, never an error; malformed input (negative numbers, bad names) is
    INVALID_ARGUMENT with the field. An unknown queue is an empty one (RocketMQ creates queues
    on demand): NO_MESSAGE_IN_QUEUE, and GetQueueInfo answers min = max = 0.

Long polling: when a pull finds nothing new at the queue's end (OFFSET_OVERFLOW_ONE,
NO_MESSAGE_IN_QUEUE, or NO_MATCHED_MESSAGE with nothing left to scan) and long_poll_ms > 0,
the call registers a waiter for its queue (watch.py) and looks again whenever a dispatch
batch touches that queue, until something matches or the time (long_poll_ms, capped, and the
caller's deadline less a margin) runs out; then it answers what the last look found. At most
`long_polls_max` wait at once (RESOURCE_EXHAUSTED beyond). A cancelled call or a shutdown
wakes the waiter at once. Receive long-polls the same way, and also wakes when an invisible
message of the queue becomes receivable again. Follow is one long poll over many queues that
answers each as it gets something, on one stream (one waiter for all, watch.KeysWaiter, which
keeps the queues a dispatch woke so only those are looked at again).

Streams (PullStream, Follow) hold a server thread from start to end, also while their reader
is slow (gRPC asks for the next answer once the last is written, as HTTP/2 flow control lets
it): at most pull_streams_max and follow_streams_max at once, refused RESOURCE_EXHAUSTED before
they start (settings.stream_caps, mqstore/rpc/streams.py), and each answer carries at most
stream_answer_bytes_max of records, so a slow reader holds one bounded answer and one thread.

Reads of queue positions (Pull, GetOffsetByTime, GetQueueInfo, ListQueues, Receive) answer
UNAVAILABLE until the subscription has caught up with the log after start-up: a queue being
replayed would answer OFFSET_OVERFLOW_BADLY and move consumers backwards. Group offsets and
acks are served throughout.
"""

# ruff: noqa: N802 (gRPC method names are the proto's)
from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import grpc
import numpy as np
from prometheus_client import Counter

from cq_svc import metrics, receipts
from cq_svc.engine import CqEngine, Received
from cq_svc.errors import ReceiptExpired
from cq_svc.record_sources import RecordsAnswer, RecordSources, is_unit_record
from cq_svc.settings import CqSettings
from cq_svc.store import PullResult, PullStatus, UnitColumns
from cq_svc.watch import QueueWatch
from mqstore.cpu_section import CPU_SECTION
from mqstore.errors import (
    CorruptRecord,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from mqstore.formats import _core, pull_wire
from mqstore.formats.cq_time import Boundary
from mqstore.formats.cq_unit import Unit
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import TAGS
from mqstore.formats.record import Bad, Blank, read_record, validate_topic
from mqstore.limits import MessageLimits, validate_group
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc
from mqstore.storage import failpoints

log = logging.getLogger(__name__)

LIMITS = MessageLimits()
# A long poll answers this long before the caller's deadline, so the answer still arrives.
DEADLINE_MARGIN_S = 0.05
# Receive settles messages the log no longer holds and looks again: at most this many looks.
RECEIVE_ROUNDS_MAX = 8
# ListGroups answers at most this many (group, topic, queue) offsets: ~100 bytes each, well
# under the 4 MiB message limit.
GROUP_OFFSETS_LISTED_MAX = 20_000

_COMMIT_LOG_OFFSET = operator.attrgetter("commit_log_offset")
_SIZE = operator.attrgetter("size")

_STATUS = {s: pb.GetMessageStatus.Value(s.value) for s in PullStatus}
# A pull stream answers on after these (a tag filter may skip a whole window and find more).
_STREAM_GOES_ON = frozenset({pb.FOUND, pb.NO_MATCHED_MESSAGE})

R = TypeVar("R")  # what a long poll's look answers (a pull or a receive response)


@dataclass(frozen=True, slots=True)
class _PullArgs:
    """A Pull's arguments, checked; the offset apart (a stream moves it)."""

    topic: str
    queue_id: int
    max_messages: int
    max_bytes: int
    tags: TagFilter | None
    report_bad: bool  # PullRequest.report_bad_records


@dataclass(frozen=True, slots=True)
class TagFilter:
    """The tags of a request: Java hash codes for the unit scan, names for the exact check."""

    names: frozenset[str]
    codes: frozenset[int]

    @staticmethod
    def parse(tags: Sequence[str], tags_max: int) -> TagFilter | None:
        """RocketMQ's subscription rules: "*" (or nothing) matches everything; names are
        trimmed and empty ones ignored."""
        if len(tags) > tags_max:
            raise InvalidArgument(f"{len(tags)} tags, at most {tags_max}", field="tags")
        names = {t.strip() for t in tags} - {""}
        if not names or "*" in names:
            return None
        return TagFilter(frozenset(names), frozenset(tags_code(n) for n in names))

    def matches(self, record: bytes) -> bool:
        got = read_record(record, 0, len(record), check_crc=False)
        if isinstance(got, Bad | Blank):
            return False
        return got.properties_dict().get(TAGS, "") in self.names


@dataclass(slots=True)
class _Gathered:
    """What a pull serves: its records one by one with their queue offsets, or (the usual
    answer) laid end to end in `blob`, their queue offsets and sizes as the response's wire
    bytes (`columns_wire`, formats/_core_pull_answer.pxi) for `wired` records."""

    records: list[bytes] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    next_begin: int = 0
    removed: int = 0
    blob: bytes | memoryview = b""
    columns_wire: bytes = b""
    wired: int = 0
    # With report_bad_records: the damaged record that ends the answer.
    bad: pb.BadRecord | None = None

    @property
    def served(self) -> int:
        return len(self.offsets) + self.wired


@dataclass(slots=True)
class _Answer:
    """A pull's answer: its response without records_blob, whose bytes wait aside in
    `records` until `wire` splices them in (formats/pull_wire.py). Put into the message they
    would be copied in, then out again by SerializeToString: on pulls of 1 KiB messages those
    copies were the largest part of cq_svc's CPU. The usual answer's queue offsets and record
    sizes wait aside too, as the wire bytes the core wrote (`columns`), rather than parsed
    into the message and serialized again. The servicer's logic reads `response` (statuses,
    offsets, the long poll's tests) and `served`, the records answered; gRPC is handed
    `wire()`."""

    response: pb.PullResponse
    records: Sequence[bytes | memoryview] = ()
    columns: bytes = b""
    served: int = 0

    def head(self) -> tuple[bytes, Sequence[bytes | memoryview]]:
        return self.response.SerializeToString() + self.columns, self.records

    def wire(self) -> bytes:
        return pull_wire.pull_answer(*self.head())


class CqServicer(pb_grpc.ConsumeQueueServicer):
    def __init__(
        self,
        engine: CqEngine,
        settings: CqSettings,
        *,
        watch: QueueWatch,
        sources: RecordSources,
        caught_up: Callable[[], bool],
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.watch = watch
        self.sources = sources  # where the records come from (record_sources.py)
        self._caught_up = caught_up

    # -- Pull --------------------------------------------------------------------------------------

    def Pull(  # type: ignore[override]
        self, request: pb.PullRequest, context: grpc.ServicerContext
    ) -> bytes:
        """A PullResponse, as its wire bytes (_Answer)."""
        wait_s = self._long_poll_s(request.long_poll_ms, context)
        look = self._pull_look(request, context)

        def look_again(last: _Answer) -> _Answer:
            offset = _retry_offset(request.offset, last.response)
            answer = look(offset)
            if offset != request.offset and answer.response.status == pb.OFFSET_OVERFLOW_ONE:
                # Everything from the asked offset on was filtered out: say so.
                answer.response.status = pb.NO_MATCHED_MESSAGE
            return answer

        answer = look(request.offset)
        if wait_s > 0 and _nothing_new(answer.response):
            answer = self._long_poll(
                (request.topic, request.queue_id),  # checked by _pull_look
                wait_s,
                context,
                look=look_again,
                found=lambda a: not _nothing_new(a.response),
                first=answer,
                next_due_s=lambda: None,
            )
        _count_pull(answer)
        return answer.wire()

    def PullStream(  # type: ignore[override]
        self, request: pb.PullStreamRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Consecutive Pulls of one queue, each from the previous answer's next_begin_offset
        (the proto's contract). The stream holds a server thread while the caller reads, as a
        long poll does: at most pull_streams_max at once (RESOURCE_EXHAUSTED beyond, taken
        before this runs: settings.stream_caps), each at most pull_stream_batches_max answers
        long, each answer at most stream_answer_bytes_max of records. Each PullResponse goes as
        its wire bytes (_Answer)."""
        top = self.settings.pull_stream_batches_max
        batches = _limit(request.max_batches, top, top, "max_batches")
        args = self._stream_args(request.pull)
        offset = request.pull.offset
        for _ in range(batches):
            answer = self._pull_many([args], [offset], context)[0]
            response = answer.response
            _count_pull(answer)
            yield answer.wire()
            failpoints.hit("cq.pull_stream.after_answer")
            if (
                response.status not in _STREAM_GOES_ON
                or response.next_begin_offset >= response.max_offset
                or not context.is_active()
            ):
                return
            offset = response.next_begin_offset

    def Follow(  # type: ignore[override]
        self, request: pb.FollowRequest, context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Pulls of several queues on one stream, answered as each queue gets something new
        (the proto's contract). One waiter watches every queue and keeps the ones a dispatch
        touched: after the first look of each, a queue is looked at again only when woken or
        when its last answer left more to read. At most follow_streams_max at once (taken
        before this runs: settings.stream_caps); a round answers at most
        stream_answer_bytes_max of records, the queues it leaves answered in the next. Each
        FollowResponse goes as its wire bytes (_follow_round)."""
        s = self.settings
        pulls = request.pulls
        if not pulls:
            raise InvalidArgument("a follow names at least one queue", field="pulls")
        if len(pulls) > s.follow_queues_max:
            raise InvalidArgument(
                f"a follow names at most {s.follow_queues_max} queues, not {len(pulls)}",
                field="pulls",
            )
        batches = _limit(
            request.max_batches, s.follow_batches_max, s.follow_batches_max, "max_batches"
        )
        keys = [(p.topic, p.queue_id) for p in pulls]
        if len(set(keys)) != len(keys):
            raise InvalidArgument("a follow names each queue once", field="pulls")
        idle_s = self._long_poll_s(request.long_poll_ms, context)
        args = [self._stream_args(p) for p in pulls]
        offsets = [p.offset for p in pulls]
        index_of = {key: i for i, key in enumerate(keys)}
        ready = set(range(len(pulls)))
        waiter = self.watch.register_many(keys)
        self.sources.count_waiting_at_tail(+1)
        try:
            if not context.add_callback(waiter.wake):
                return
            turn = 0
            answered = 0
            idle_until = time.monotonic() + idle_s
            while context.is_active() and not self.watch.closed:
                ready.update(index_of[key] for key in waiter.take())
                order = sorted(ready)
                if order:
                    k = turn % len(order)
                    order = (order[k:] + order[:k])[: batches - answered]
                    turn += 1
                answers = self._follow_round(args, offsets, order, ready, context)
                if answers:
                    yield pull_wire.follow_answers([a.head() for a in answers])
                    answered += len(answers)
                    if answered >= batches:
                        return
                    idle_until = time.monotonic() + idle_s
                if ready:
                    continue
                left = idle_until - time.monotonic()
                remaining = context.time_remaining()
                if remaining is not None:
                    left = min(left, remaining - DEADLINE_MARGIN_S)
                if left <= 0:
                    return
                waiter.wait(left)
        finally:
            self.watch.unregister(waiter)
            self.sources.count_waiting_at_tail(-1)

    def _follow_round(
        self,
        args: Sequence[_PullArgs],
        offsets: list[int],
        order: Sequence[int],
        ready: set[int],
        context: grpc.ServicerContext,
    ) -> list[_Answer]:
        """One look at each pull in `order` (one Read for all): the answers worth sending,
        named by pull_index, in order (a FollowResponse's). Moves `offsets` past what is
        answered; drops from `ready` the pulls a dispatch must wake before they are looked at
        again."""
        looked = self._pull_many(
            [args[i] for i in order],
            [offsets[i] for i in order],
            context,
            budget_bytes=self.settings.stream_answer_bytes_max,
        )
        order = order[: len(looked)]  # the rest stay ready: the budget is spent
        sent = []
        for i, answer in zip(order, looked, strict=True):
            response = answer.response
            if response.next_begin_offset == offsets[i] and not answer.served:
                ready.discard(i)  # answered again when a dispatch wakes it
                if _nothing_new(response):
                    continue
            response.pull_index = i
            _count_pull(answer)
            offsets[i] = response.next_begin_offset
            if response.status == pb.FOUND and offsets[i] >= response.max_offset:
                ready.discard(i)  # at the queue's end: a dispatch wakes it
            sent.append(answer)
        return sent

    def _pull_look(
        self, request: pb.PullRequest, context: grpc.ServicerContext
    ) -> Callable[[int], _Answer]:
        """A Pull's arguments checked, as a function of the offset to pull from."""
        args = self._pull_args(request)
        return lambda offset: self._pull_many([args], [offset], context)[0]

    def _stream_args(self, request: pb.PullRequest) -> _PullArgs:
        """_pull_args for a stream: an answer of at most stream_answer_bytes_max."""
        args = self._pull_args(request)
        return replace(args, max_bytes=min(args.max_bytes, self.settings.stream_answer_bytes_max))

    def _pull_args(self, request: pb.PullRequest) -> _PullArgs:
        s = self.settings
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        if request.offset < 0:
            raise InvalidArgument("a queue offset is never negative", field="offset")
        max_messages = _limit(
            request.max_messages, s.pull_messages_default, s.pull_messages_max, "max_messages"
        )
        max_bytes = _limit(request.max_bytes, s.pull_bytes_default, s.pull_bytes_max, "max_bytes")
        tags = TagFilter.parse(request.tags, s.tags_max)
        self._require_caught_up()
        return _PullArgs(
            topic,
            queue_id,
            max_messages,
            max_bytes,
            tags,
            request.report_bad_records,
        )

    def _pull_many(
        self,
        args: Sequence[_PullArgs],
        offsets: Sequence[int],
        context: grpc.ServicerContext,
        *,
        budget_bytes: int | None = None,
    ) -> list[_Answer]:
        """Pulls of several queues (each args[i] from offsets[i]) with one fetch of records for
        all of them (record_sources.py; several when their records pass pull_bytes_max
        together): a Follow cycle over the queues a dispatch woke costs one Read, not one a
        queue. With `budget_bytes`, the pulls together take at most that many bytes of records
        (the first pull at least one record, whatever its size): the answers are those of the
        first pulls that fit. Each answer's records are kept aside from its response (_Answer)."""
        began = time.perf_counter()
        started: list[tuple[_Answer, PullResult]] = []
        left = budget_bytes
        # The computation in CPU_SECTION (mqstore/cpu_section.py: handler threads in numpy at
        # once hand the GIL to each other at every call); the sources' chain leaves out of it
        # what may wait (the copies out of the segment files, the commit-log Read).
        with CPU_SECTION:
            for a, offset in zip(args, offsets, strict=True):
                if left is not None and left <= 0:
                    break
                result = self.engine.store.pull(
                    a.topic,
                    a.queue_id,
                    offset,
                    a.max_messages,
                    a.max_bytes if left is None else min(a.max_bytes, left),
                    a.tags.codes if a.tags is not None else (),
                )
                if left is not None and result.status is PullStatus.FOUND:
                    taken_bytes = int(result.taken.size.sum())
                    if started and taken_bytes > left:
                        break  # its first record alone is past the budget: the next round's
                    left -= taken_bytes
                response = pb.PullResponse(
                    status=_STATUS[result.status],
                    next_begin_offset=result.next_begin_offset,
                    min_offset=result.min_offset,
                    max_offset=result.max_offset,
                )
                started.append((_Answer(response), result))
            found = [k for k, (_, r) in enumerate(started) if r.status is PullStatus.FOUND]
            taken_found = [started[k][1].taken for k in found]
            groups = []
            for group in _read_groups(found, taken_found, self.settings.pull_bytes_max):
                taken = [started[k][1].taken for k in group]
                joined = UnitColumns.concat(taken)
                groups.append((group, taken, joined.phy, joined.size))
        answers = self.sources.pulls.answers([(phy, size) for _, _, phy, size in groups], context)
        for (group, taken, _, _), answer in zip(groups, answers, strict=True):
            with CPU_SECTION:
                for k, part in zip(group, answer.parts([len(t) for t in taken]), strict=True):
                    pulled, result = started[k]
                    self._pull_finish(args[k], pulled, result, part)
        took = time.perf_counter() - began
        for _ in started:
            metrics.PULL_SECONDS.observe(took / len(started))
        return [pulled for pulled, _ in started]

    def _pull_finish(
        self, a: _PullArgs, out: _Answer, result: PullResult, answer: RecordsAnswer
    ) -> None:
        """A FOUND pull's answer filled from the sources' answer for its units: the records
        aside in `out.records`, the rest in its response."""
        got = self._gather(a, result, answer)
        response = out.response
        out.served = got.served
        if got.blob:
            out.records = [got.blob]
            out.columns = got.columns_wire  # queue_offsets and record_sizes, spliced in
        else:
            out.records = got.records
            response.record_sizes.extend(map(len, got.records))
            response.queue_offsets.extend(got.offsets)
        response.next_begin_offset = got.next_begin
        if got.bad is not None:
            response.bad_record.CopyFrom(got.bad)  # FOUND: something is at the offset
        elif not got.served:
            response.status = pb.MESSAGE_WAS_REMOVING if got.removed else pb.NO_MATCHED_MESSAGE

    def _gather(self, a: _PullArgs, result: PullResult, answer: RecordsAnswer) -> _Gathered:
        """The engine's units from the sources' answer for them, in queue order (module
        docstring)."""
        queue_id, tags = a.queue_id, a.tags
        taken = result.taken
        read_ok = answer.statuses.count(cl_pb.READ_OK)
        _READ_OK.inc(read_ok)  # once a pull, not once a record
        if read_ok == len(taken) and answer.names_units(queue_id, taken):
            # The usual answer: every record read and the one its unit names; the checks of
            # _gather_read, a column at a time.
            if tags is None:
                # (names_units found the answer's sizes equal to the units')
                return _Gathered(
                    next_begin=result.next_begin_offset,
                    blob=answer.blob,
                    columns_wire=_core.pull_answer_wire(taken.queue_offset, taken.size),
                    wired=len(taken),
                )
            queue_offsets = taken.queue_offset.tolist()
            records = answer.as_records()
            kept = [i for i, record in enumerate(records) if tags.matches(record)]
            return _Gathered(
                [records[i] for i in kept],
                [queue_offsets[i] for i in kept],
                result.next_begin_offset,
            )
        return self._gather_read(a, result, result.units, answer.as_records(), answer.statuses)

    def _gather_read(
        self,
        a: _PullArgs,
        result: PullResult,
        units: list[Unit],
        records: list[bytes],
        statuses: Sequence[int],
    ) -> _Gathered:
        topic, queue_id, tags = a.topic, a.queue_id, a.tags
        got = _Gathered(next_begin=result.next_begin_offset)
        for unit, record, status in zip(units, records, statuses, strict=True):
            if status == cl_pb.READ_OK and not is_unit_record(record, unit, queue_id):
                metrics.READ_RECORDS.labels("mismatch").inc()
                log.warning(
                    "%s/%d@%d: the commit log holds another record at %d: not served",
                    topic,
                    queue_id,
                    unit.queue_offset,
                    unit.commit_log_offset,
                )
                if got.records:
                    got.next_begin = unit.queue_offset
                    return got
                raise Unavailable(
                    f"{topic}/{queue_id} offset {unit.queue_offset}: the consume queue and the "
                    f"commit log disagree at {unit.commit_log_offset}; resynchronising"
                )
            if status == cl_pb.READ_OK:
                if tags is not None and not tags.matches(record):
                    continue  # a tag whose hash collides with one asked for
                got.records.append(record)
                got.offsets.append(unit.queue_offset)
            elif status == cl_pb.READ_OUT_OF_RANGE:
                metrics.READ_RECORDS.labels("removed").inc()
                if got.records:
                    got.next_begin = unit.queue_offset
                    return got
                got.removed += 1  # RocketMQ steps over removed messages too
            else:
                self.sources.log.raise_if_cut(unit.commit_log_offset)
                _count_corrupt(topic, queue_id, unit)
                if a.report_bad:
                    got.bad = _bad_record(unit)
                    got.next_begin = unit.queue_offset + 1
                    return got
                if got.records:
                    got.next_begin = unit.queue_offset
                    return got
                raise CorruptRecord(
                    unit.commit_log_offset,
                    f"the record of {topic}/{queue_id} queue offset {unit.queue_offset} fails "
                    "its checks; it is never served (commit an offset past it to skip it)",
                )
        return got

    # -- long polling ------------------------------------------------------------------------------

    def _long_poll_s(self, long_poll_ms: int, context: grpc.ServicerContext) -> float:
        if long_poll_ms < 0:
            raise InvalidArgument("long_poll_ms must not be negative", field="long_poll_ms")
        wait_s = min(long_poll_ms, self.settings.long_poll_max_ms) / 1000.0
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, remaining - DEADLINE_MARGIN_S)
        return max(0.0, wait_s)

    def _long_poll(
        self,
        key: tuple[str, int],
        wait_s: float,
        context: grpc.ServicerContext,
        *,
        look: Callable[[R], R],
        found: Callable[[R], bool],
        first: R,
        next_due_s: Callable[[], float | None],
        at_tail: bool = True,
    ) -> R:
        """Look again whenever the queue gets a dispatch (or `next_due_s` passes), until
        `found` or the time runs out; returns the last look. `at_tail`: a pull waiting at the
        queue's end (it counts for tail_wanted; a Receive does not: it reads the log)."""
        try:
            waiter = self.watch.register(key)
        except ResourceExhausted:
            metrics.LONG_POLLS_REFUSED.inc()
            raise
        if at_tail:
            self.sources.count_waiting_at_tail(+1)
        began = time.monotonic()
        end = began + wait_s
        outcome = "timeout"
        last = first
        try:
            if not context.add_callback(waiter.wake):
                outcome = "cancelled"
                return last
            while True:
                last = look(last)  # after registering: a batch applied from now on wakes us
                if found(last):
                    outcome = "dispatched"
                    return last
                if self.watch.closed:
                    outcome = "shutdown"
                    return last
                if not context.is_active():
                    outcome = "cancelled"
                    return last
                now = time.monotonic()
                if now >= end:
                    return last
                timeout_s = end - now
                due = next_due_s()
                if due is not None:
                    timeout_s = min(timeout_s, max(0.0, due))
                waiter.wait(timeout_s)
        finally:
            self.watch.unregister(waiter)
            if at_tail:
                self.sources.count_waiting_at_tail(-1)
            metrics.LONG_POLL_WAIT_SECONDS.labels(outcome).observe(time.monotonic() - began)

    # -- time and positions ------------------------------------------------------------------------

    def GetOffsetByTime(
        self, request: pb.GetOffsetByTimeRequest, context: grpc.ServicerContext
    ) -> pb.GetOffsetByTimeResponse:
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        if request.timestamp_ms < 0:
            raise InvalidArgument("timestamp_ms must not be negative", field="timestamp_ms")
        if request.boundary == common_pb2.LOWER:
            boundary = Boundary.LOWER
        elif request.boundary == common_pb2.UPPER:
            boundary = Boundary.UPPER
        else:
            raise InvalidArgument(f"unknown boundary {request.boundary}", field="boundary")
        self._require_caught_up()
        offset = self.engine.store.get_offset_by_time(
            topic, queue_id, request.timestamp_ms, boundary
        )
        return pb.GetOffsetByTimeResponse(offset=offset)

    def GetQueueInfo(
        self, request: pb.GetQueueInfoRequest, context: grpc.ServicerContext
    ) -> pb.QueueInfo:
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        self._require_caught_up()
        return self._queue_info(topic, queue_id)

    def _queue_info(self, topic: str, queue_id: int) -> pb.QueueInfo:
        store = self.engine.store
        return pb.QueueInfo(
            topic=topic,
            queue_id=queue_id,
            min_offset=store.min_offset(topic, queue_id),
            max_offset=store.max_offset(topic, queue_id),
        )

    def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.ServicerContext
    ) -> pb.ListQueuesResponse:
        topic = _topic(request.topic)
        self._require_caught_up()
        return pb.ListQueuesResponse(
            queues=[self._queue_info(topic, q) for q in self.engine.store.list_queues(topic)]
        )

    def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.ServicerContext
    ) -> pb.ListTopicsResponse:
        self._require_caught_up()
        return pb.ListTopicsResponse(topics=sorted(self.engine.store.list_topics()))

    # -- group offsets -----------------------------------------------------------------------------

    def CommitOffset(
        self, request: pb.CommitOffsetRequest, context: grpc.ServicerContext
    ) -> pb.CommitOffsetResponse:
        group = validate_group(request.group)
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        if request.offset < 0:
            raise InvalidArgument("a committed offset is never negative", field="offset")
        self.engine.commit_offset(group, topic, queue_id, request.offset)
        return pb.CommitOffsetResponse()

    def FetchOffset(
        self, request: pb.FetchOffsetRequest, context: grpc.ServicerContext
    ) -> pb.FetchOffsetResponse:
        group = validate_group(request.group)
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        return pb.FetchOffsetResponse(offset=self.engine.fetch_offset(group, topic, queue_id))

    def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.ServicerContext
    ) -> pb.ListGroupsResponse:
        group = validate_group(request.group) if request.group else None
        found = self.engine.group_offsets(group)
        return pb.ListGroupsResponse(
            offsets=[
                pb.GroupOffset(group=g, topic=t, queue_id=q, offset=offset)
                for (g, t, q), offset in found[:GROUP_OFFSETS_LISTED_MAX]
            ],
            truncated=len(found) > GROUP_OFFSETS_LISTED_MAX,
        )

    # -- receive / ack -----------------------------------------------------------------------------

    def Receive(
        self, request: pb.ReceiveRequest, context: grpc.ServicerContext
    ) -> pb.ReceiveResponse:
        s = self.settings
        group = validate_group(request.group)
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        count = _limit(
            request.max_messages,
            s.receive_messages_default,
            s.receive_messages_max,
            "max_messages",
        )
        invisible_ms = self._invisible_ms(request.invisible_duration_ms, allow_zero=False)
        wait_s = self._long_poll_s(request.long_poll_ms, context)
        self._require_caught_up()

        report_bad = request.report_bad_records

        def look(_: pb.ReceiveResponse) -> pb.ReceiveResponse:
            return self._receive_once(
                group, topic, queue_id, count, invisible_ms, report_bad, context
            )

        def next_due_s() -> float | None:
            due_ms = self.engine.acks.next_deadline_ms((group, topic, queue_id))
            if due_ms is None:
                return None
            return (due_ms - self.engine.clock.now_ms()) / 1000.0

        # queue_offsets has one entry per record served.
        response = look(pb.ReceiveResponse())
        if wait_s > 0 and not _delivered(response):
            response = self._long_poll(
                (topic, queue_id),
                wait_s,
                context,
                look=look,
                found=_delivered,
                at_tail=False,
                first=response,
                next_due_s=next_due_s,
            )
        metrics.RECEIVED_MESSAGES.inc(len(response.queue_offsets))
        return response

    def _receive_once(
        self,
        group: str,
        topic: str,
        queue_id: int,
        count: int,
        invisible_ms: int,
        report_bad: bool,
        context: grpc.ServicerContext,
    ) -> pb.ReceiveResponse:
        response = pb.ReceiveResponse()
        for _ in range(RECEIVE_ROUNDS_MAX):
            got = self.engine.receive(group, topic, queue_id, count, invisible_ms)
            if not got:
                return response
            removed = self._serve_received(
                group, topic, queue_id, got, response, report_bad, context
            )
            if _delivered(response) or not removed:
                return response
            # Everything handed out was gone from the log (and is settled now): look again.
        return response

    def _serve_received(
        self,
        group: str,
        topic: str,
        queue_id: int,
        got: list[Received],
        response: pb.ReceiveResponse,
        report_bad: bool,
        context: grpc.ServicerContext,
    ) -> int:
        """Fetch the deliveries' records into `response`; returns how many the log no longer
        held (settled: nobody can ever consume them). A damaged record is never served: with
        `report_bad` its delivery goes into bad_records (receipt included), else it stays
        invisible and comes back after its invisibility, each time refused."""
        units = [r.unit for r in got]
        offsets, sizes = list(map(_COMMIT_LOG_OFFSET, units)), list(map(_SIZE, units))
        try:
            ranges = (np.asarray(offsets, dtype=np.int64), np.asarray(sizes, dtype=np.int64))
            answer = next(self.sources.receives.answers([ranges], context))
            records, statuses = answer.as_records(), answer.statuses
        except Exception:
            self._release(group, topic, queue_id, got)
            raise
        removed: list[tuple[int, int]] = []
        corrupt: Received | None = None
        read_ok = 0
        served: list[bytes] = []
        for r, record, status in zip(got, records, statuses, strict=True):
            d = r.delivery
            if status == cl_pb.READ_OK and is_unit_record(record, r.unit, queue_id):
                read_ok += 1
                served.append(record)
                response.queue_offsets.append(d.queue_offset)
                response.receipt_handles.append(
                    receipts.encode(group, topic, queue_id, d.queue_offset, d.delivery_count)
                )
                response.delivery_counts.append(d.delivery_count)
            elif status == cl_pb.READ_OUT_OF_RANGE:
                metrics.READ_RECORDS.labels("removed").inc()
                removed.append((d.queue_offset, d.delivery_count))
            elif status == cl_pb.READ_OK:
                metrics.READ_RECORDS.labels("mismatch").inc()
                self._release(group, topic, queue_id, [r])  # the log and queue disagree: later
            else:
                # Never served, never settled: it comes back after its invisibility until the
                # group acknowledges it (reported) or commits past it.
                try:
                    self.sources.log.raise_if_cut(r.unit.commit_log_offset)
                except Unavailable:
                    self._release(group, topic, queue_id, got)
                    raise
                _count_corrupt(topic, queue_id, r.unit)
                if report_bad:
                    bad = response.bad_records.add()
                    bad.CopyFrom(_bad_record(r.unit))
                    bad.receipt_handle = receipts.encode(
                        group, topic, queue_id, d.queue_offset, d.delivery_count
                    )
                    bad.delivery_count = d.delivery_count
                corrupt = corrupt or r
        metrics.READ_RECORDS.labels("ok").inc(read_ok)
        _put_records(response, served)
        if removed:
            self.engine.acks.ack((group, topic, queue_id), removed)
        if corrupt is not None and not _delivered(response):
            raise CorruptRecord(
                corrupt.unit.commit_log_offset,
                f"the record of {topic}/{queue_id} queue offset "
                f"{corrupt.delivery.queue_offset} fails its checks; it is never served",
            )
        return len(removed)

    def _release(self, group: str, topic: str, queue_id: int, got: list[Received]) -> None:
        """Deliveries that were not handed out after all: receivable again at once."""
        for r in got:
            d = r.delivery
            try:
                self.engine.acks.change_invisible(
                    (group, topic, queue_id), d.queue_offset, d.delivery_count, 0
                )
            except ReceiptExpired:
                pass

    def Ack(self, request: pb.AckRequest, context: grpc.ServicerContext) -> pb.AckResponse:
        group = validate_group(request.group)
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        handles = list(request.receipt_handles)
        if len(handles) > self.settings.receive_messages_max:
            raise InvalidArgument(
                f"{len(handles)} receipts, at most {self.settings.receive_messages_max}",
                field="receipt_handles",
            )
        decoded = [
            receipts.decode(h, group, topic, queue_id, field="receipt_handles") for h in handles
        ]
        if not decoded:
            return pb.AckResponse(committed_offset=self.engine.fetch_offset(group, topic, queue_id))
        committed, stale = self.engine.acks.ack((group, topic, queue_id), decoded)
        stale_set = set(stale)
        stale_handles = [h for h, d in zip(handles, decoded, strict=True) if d in stale_set]
        metrics.ACKS.labels("acked").inc(len(handles) - len(stale_handles))
        if stale_handles:
            metrics.ACKS.labels("stale").inc(len(stale_handles))
        return pb.AckResponse(stale_receipt_handles=stale_handles, committed_offset=committed)

    def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: grpc.ServicerContext
    ) -> pb.ChangeInvisibleDurationResponse:
        """A new deadline for a delivery. The handle stays the same (a receipt names the
        delivery, not its deadline); an empty handle in the answer means the receipt was stale
        (redelivered since, or acknowledged) and nothing changed."""
        group = validate_group(request.group)
        topic = _topic(request.topic)
        queue_id = _queue_id(request.queue_id)
        offset, count = receipts.decode(request.receipt_handle, group, topic, queue_id)
        invisible_ms = self._invisible_ms(request.invisible_duration_ms, allow_zero=True)
        try:
            d = self.engine.acks.change_invisible(
                (group, topic, queue_id), offset, count, invisible_ms
            )
        except ReceiptExpired:
            metrics.ACKS.labels("stale_change").inc()
            return pb.ChangeInvisibleDurationResponse()
        self.watch.notify([(topic, queue_id)])  # a shorter deadline may be due before the wait
        return pb.ChangeInvisibleDurationResponse(
            receipt_handle=receipts.encode(group, topic, queue_id, d.queue_offset, d.delivery_count)
        )

    def _invisible_ms(self, value: int, *, allow_zero: bool) -> int:
        s = self.settings
        if value < 0:
            raise InvalidArgument(
                "invisible_duration_ms must not be negative", field="invisible_duration_ms"
            )
        if value == 0 and not allow_zero:
            return s.invisible_default_ms
        if value > s.invisible_max_ms:
            raise InvalidArgument(
                f"invisible_duration_ms {value} is over the maximum {s.invisible_max_ms}",
                field="invisible_duration_ms",
            )
        return value

    # -- status ------------------------------------------------------------------------------------

    def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        store = self.engine.store
        queues = sum(len(store.list_queues(t)) for t in store.list_topics())
        sid = store.store_id
        return pb.GetStatusResponse(
            store_id=b"" if not any(sid) else sid,
            confirmed_offset=store.confirmed_offset,
            applied_offset=store.applied_offset,
            caught_up=self._caught_up(),
            store=self.engine.config.cq_store.value,
            queue_count=queues,
        )

    def _require_caught_up(self) -> None:
        if not self._caught_up():
            raise Unavailable("replaying the commit log after start-up: not caught up yet")


# -- validation -----------------------------------------------------------------------------------


def _topic(topic: str) -> str:
    validate_topic(topic, LIMITS)  # MessageIllegal (INVALID_ARGUMENT) naming "topic"
    return topic


def _queue_id(queue_id: int) -> int:
    if not 0 <= queue_id <= LIMITS.queue_id_max:
        raise InvalidArgument(
            f"queue id {queue_id} is outside [0, {LIMITS.queue_id_max}]", field="queue_id"
        )
    return queue_id


def _limit(value: int, default: int, top: int, name: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative", field=name)
    return min(value, top) if value else default


# -- pull helpers ---------------------------------------------------------------------------------


def _read_groups(
    found: Sequence[int], taken: Sequence[UnitColumns], bytes_max: int
) -> list[list[int]]:
    """`found` (pull indexes, their units in `taken`) in consecutive groups whose records add
    up to at most `bytes_max`, each group one Read (a single pull is never split)."""
    groups: list[list[int]] = []
    total = 0
    for k, units in zip(found, taken, strict=True):
        size = int(units.size.sum())
        if groups and total + size <= bytes_max:
            groups[-1].append(k)
            total += size
        else:
            groups.append([k])
            total = size
    return groups


def _bad_record(unit: Unit) -> pb.BadRecord:
    return pb.BadRecord(
        queue_offset=unit.queue_offset,
        commit_log_offset=unit.commit_log_offset,
        size=unit.size,
        reason=(
            f"the commit log refuses the record at {unit.commit_log_offset} ({unit.size} bytes) "
            "as damaged: it fails its checks and is never served"
        ),
    )


def _count_corrupt(topic: str, queue_id: int, unit: Unit) -> None:
    metrics.READ_RECORDS.labels("corrupt").inc()
    log.error(
        "%s/%d@%d: the commit log refuses the record at %d as corrupt",
        topic,
        queue_id,
        unit.queue_offset,
        unit.commit_log_offset,
    )


def _delivered(response: pb.ReceiveResponse) -> bool:
    """A receive answered something: a record, or a damaged one reported with its receipt."""
    return bool(response.queue_offsets) or bool(response.bad_records)


# Labelled children looked up once, not once a pull (a labels() call takes a lock and hashes
# the label values); PULLS' children made on first use, so the series appear as before.
_READ_OK = metrics.READ_RECORDS.labels("ok")
_PULLS_BY_STATUS: dict[int, Counter] = {}


def _count_pull(answer: _Answer) -> None:
    """A pull's answer in the metrics (Pull, PullStream and Follow alike): its status, and its
    records."""
    status = answer.response.status
    counter = _PULLS_BY_STATUS.get(status)
    if counter is None:
        counter = metrics.PULLS.labels(pb.GetMessageStatus.Name(status))
        _PULLS_BY_STATUS[status] = counter
    counter.inc()
    metrics.PULLED_MESSAGES.inc(answer.served)


def _nothing_new(response: pb.PullResponse) -> bool:
    """Nothing to hand out and nothing left to scan: what a long poll waits on."""
    status = response.status
    if status in (pb.OFFSET_OVERFLOW_ONE, pb.NO_MESSAGE_IN_QUEUE):
        return True
    return status == pb.NO_MATCHED_MESSAGE and response.next_begin_offset >= response.max_offset


def _retry_offset(asked: int, last: pb.PullResponse) -> int:
    """Where the next look of a long poll starts: past what the filter skipped already."""
    if last.status == pb.NO_MATCHED_MESSAGE:
        return last.next_begin_offset
    return asked


def _put_records(response: pb.PullResponse | pb.ReceiveResponse, records: list[bytes]) -> None:
    """Records into an answer: laid end to end, with their sizes."""
    if records:
        blob = b"".join(records)
        # Assigned, not appended, when it is the first: `+=` would copy the blob twice more.
        response.records_blob = response.records_blob + blob if response.records_blob else blob
        response.record_sizes.extend(map(len, records))
