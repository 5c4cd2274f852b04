"""How a Consumer gets its next batches: one interface, four ways.

A fetcher pulls queues, each from its `fetch_at` (buffer.py), and puts every answer into the
buffer (`Buffer.apply(queue id, offset asked, PullResponse)`); it raises the typed error
(client/errors.py) a call ended with, after applying what did arrive, and swallows only the
cancellations it made itself. The Consumer decides what an error means (consumer.py: `_wait`).

    fetcher.fetch(queue_ids, wait_ms)   answers in; waits up to wait_ms for a caught-up queue
    fetcher.holds(queue_ids)            a call of it is still under way for these queues at
                                        their positions (only a Follow stream outlives fetch)
    fetcher.forget(queue_id)            the queue moved (a seek): drop its calls under way
    fetcher.stop()                      drop every call under way (it can fetch again)

    PullAhead   a round of quick pulls (long_poll_ms=0) of the queues with nothing buffered,
                queues in turn. When an answer leaves more in its queue, the next Pull of it
                is under way at once on a PullStream (the server pulls on from each answer's
                next offset; a batch costs both ends less than a unary call), at most
                PULLS_AHEAD_MAX queues at a time, so that cq_svc and commitlog_svc fetch the
                next batch while this one is decoded and handed out. A stream that ended or
                failed leaves its pull to a plain Pull (which raises the error if there is one)
    Follower    a caught-up consumer: one Follow call over every queue (follow.py reads it on
                a thread of its own), kept from one fetch to the next while its positions
                agree with the buffer's; the server answers each queue as it gets something
    LongPolls   a caught-up consumer of more than FOLLOW_QUEUES_MAX queues: one long-polling
                Pull per queue, at most LONG_POLLS_MAX at once; the first answer cancels the
                others, then a round of quick pulls takes what the others got meanwhile
    IdleWait    long polling off (long_poll_ms=0): a short pause between rounds

Every fetch goes through `PullCalls`, which makes the consumer's PullRequests (its topic,
tags, batch size and byte cap; report_bad_records) and counts each answer in `stats.pulls`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import grpc

from mqstore.client.answers import ConsumerStats
from mqstore.client.buffer import PULL, Buffer
from mqstore.client.checks import PULL_BYTES_DEFAULT
from mqstore.client.errors import ClientError, from_rpc_error
from mqstore.client.follow import FollowStream
from mqstore.client.retry import OutageRetry
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

log = logging.getLogger("mqstore.client.consumer")

# Pulls sent ahead at once (one per queue at most): enough to keep cq_svc and commitlog_svc
# busy while the client decodes, few enough to leave the server's workers to other consumers.
PULLS_AHEAD_MAX = 4
# A PullStream answers at most the server's pull_stream_batches_max (64) batches; past this
# long the stream is dropped and the next batch pulled on its own.
PULL_STREAM_TIMEOUT_S = 60.0
# A caught-up consumer follows at most this many queues on one Follow stream (cq_svc's
# follow_queues_max); a wider assignment long-polls LONG_POLLS_MAX queues at a time instead.
FOLLOW_QUEUES_MAX = 1_024
# A Follow stream ends itself after long_poll_ms with nothing to answer, or after the server's
# follow_batches_max answers; this deadline only bounds one whose server went silent.
FOLLOW_TIMEOUT_S = 300.0
# Long polls one consumer keeps waiting at once: cq_svc serves 24 at most (long_polls_max),
# so one consumer of a wide topic must not take them all.
LONG_POLLS_MAX = 8
# When more queues are caught up than are watched by long polls, the wait is cut to this, so
# that the unwatched queues are looked at again within a second.
UNWATCHED_WAIT_MS = 1_000
# With long polling off (long_poll_ms=0), a caught-up poll pauses this long between rounds
# instead of spinning on the server.
IDLE_PAUSE_S = 0.1

_PULL_STREAM = "ConsumeQueue/PullStream"
FOLLOW = "ConsumeQueue/Follow"


class PullCalls:
    """The consumer's Pull, PullStream and Follow calls (not retried: the caller is)."""

    def __init__(
        self,
        retry: OutageRetry,
        topic: str,
        *,
        tags: tuple[str, ...],
        max_messages: int,
        stats: ConsumerStats,
    ) -> None:
        self.retry = retry
        self.conn = retry.conn
        self.topic = topic
        self.tags = tags
        self.max_messages = max_messages
        self.stats = stats

    def request(
        self,
        queue_id: int,
        offset: int,
        *,
        max_messages: int | None = None,
        long_poll_ms: int = 0,
        tags: tuple[str, ...] | None = None,
    ) -> pb.PullRequest:
        # Queue id and offset are the server's to check (INVALID_ARGUMENT naming the field),
        # so that a raw pull reports exactly what the service says.
        return pb.PullRequest(
            topic=self.topic,
            queue_id=queue_id,
            offset=offset,
            max_messages=self.max_messages if max_messages is None else max_messages,
            max_bytes=PULL_BYTES_DEFAULT,
            tags=self.tags if tags is None else tags,
            long_poll_ms=long_poll_ms,
            report_bad_records=True,
        )

    def pull(self, request: pb.PullRequest) -> pb.PullResponse:
        """One unary Pull."""
        self.stats.pulls += 1
        return self.conn.call_cq(
            lambda s: s.Pull,
            request,
            name=PULL,
            timeout_s=self.retry.timeout_s(request.long_poll_ms),
        )

    def pull_future(self, request: pb.PullRequest) -> grpc.Future[pb.PullResponse]:
        """One unary Pull under way (a long poll)."""
        self.stats.pulls += 1
        future: grpc.Future[pb.PullResponse] = self.conn.call_cq(
            lambda s: s.Pull.future,
            request,
            name=PULL,
            timeout_s=self.retry.timeout_s(request.long_poll_ms),
        )
        return future

    def pull_stream(self, request: pb.PullRequest) -> Any:
        """A PullStream from the request's offset on: an iterator of PullResponses."""
        return self.conn.call_cq(
            lambda s: s.PullStream,
            pb.PullStreamRequest(pull=request),
            name=_PULL_STREAM,
            timeout_s=PULL_STREAM_TIMEOUT_S,
        )

    def follow(self, pulls: Sequence[pb.PullRequest], long_poll_ms: int) -> Any:
        """A Follow call over `pulls`: an iterator of FollowResponses."""
        self.stats.follows += 1
        return self.conn.call_cq(
            lambda s: s.Follow,
            pb.FollowRequest(pulls=pulls, long_poll_ms=long_poll_ms),
            name=FOLLOW,
            timeout_s=FOLLOW_TIMEOUT_S,
        )

    def explain(self, err: grpc.RpcError, method: str) -> ClientError:
        """A failed call's typed error (the connection's words on an unreachable store)."""
        return self.conn.explain(from_rpc_error(err, method))


class Fetcher:
    """The interface (see the module docstring); the defaults suit a fetcher whose calls all
    end within fetch."""

    name = "fetch"

    def __init__(self, pulls: PullCalls, buffer: Buffer) -> None:
        self._pulls = pulls
        self._buffer = buffer

    def fetch(self, queue_ids: list[int], wait_ms: int) -> None:
        raise NotImplementedError

    def holds(self, queue_ids: list[int]) -> bool:
        return False

    def forget(self, queue_id: int) -> None:
        return None

    def stop(self) -> None:
        return None


class PullAhead(Fetcher):
    """Quick pulls, the next one of a queue sent ahead on a PullStream (module docstring)."""

    name = "pull"

    def __init__(self, pulls: PullCalls, buffer: Buffer) -> None:
        super().__init__(pulls, buffer)
        # Per queue: the offset the stream's next answer is pulled from, and the stream.
        self._streams: dict[int, tuple[int, Any]] = {}

    def fetch(self, queue_ids: list[int], wait_ms: int = 0) -> None:
        """One quick pull of every queue with nothing buffered, starting with the next queue
        in turn: sent at once (up to PULLS_AHEAD_MAX in flight), answers taken in turn, and
        the next Pull of a queue sent as soon as an answer says there is more."""
        buffer = self._buffer
        todo = [q for q in buffer.rotated(queue_ids) if not buffer.state(q).buffered]
        for q in todo:
            self._send_ahead(q, buffer.queues[q].fetch_at)
        for q in todo:
            asked = buffer.queues[q].fetch_at
            response = self._collect(q, asked)
            if response.status == pb.FOUND and response.next_begin_offset < response.max_offset:
                self._send_ahead(q, response.next_begin_offset)
            buffer.apply(q, asked, response)
        buffer.turn()

    def forget(self, queue_id: int) -> None:
        ahead = self._streams.pop(queue_id, None)
        if ahead is not None:
            ahead[1].cancel()

    def stop(self) -> None:
        for q in list(self._streams):
            self.forget(q)

    def _send_ahead(self, queue_id: int, offset: int) -> None:
        """Have the Pull of `queue_id` from `offset` under way without waiting for it, when
        the queue has none and fewer than PULLS_AHEAD_MAX queues have."""
        ahead = self._streams.get(queue_id)
        if ahead is not None and ahead[0] == offset:
            return  # the stream's next answer is this pull
        self.forget(queue_id)
        if len(self._streams) >= PULLS_AHEAD_MAX:
            return
        stream = self._pulls.pull_stream(self._pulls.request(queue_id, offset))
        self._streams[queue_id] = (offset, stream)

    def _collect(self, queue_id: int, fetch_at: int) -> pb.PullResponse:
        """The answer of the Pull of the queue from `fetch_at`: the stream's next, else a
        plain call."""
        ahead = self._streams.pop(queue_id, None)
        if ahead is not None:
            asked, call = ahead
            if asked == fetch_at:
                try:
                    response: pb.PullResponse = next(call)
                except (StopIteration, grpc.RpcError):
                    pass
                else:
                    self._pulls.stats.pulls += 1  # a pull's answer, as a plain Pull's is
                    self._streams[queue_id] = (response.next_begin_offset, call)
                    return response
            else:
                call.cancel()
        return self._pulls.pull(self._pulls.request(queue_id, fetch_at))


class Follower(Fetcher):
    """One Follow stream over every caught-up queue (module docstring, follow.py)."""

    name = "follow"

    def __init__(self, pulls: PullCalls, buffer: Buffer, long_poll_ms: int, ahead: PullAhead):
        super().__init__(pulls, buffer)
        self.long_poll_ms = long_poll_ms
        self.stream: FollowStream | None = None
        self._ahead = ahead

    @property
    def following(self) -> bool:
        return self.stream is not None and not self.stream.ended

    def holds(self, queue_ids: list[int]) -> bool:
        stream = self.stream
        if stream is None:
            return False
        states = self._buffer.queues
        return stream.matches(queue_ids, {q: states[q].fetch_at for q in queue_ids if q in states})

    def fetch(self, queue_ids: list[int], wait_ms: int) -> None:
        """The stream's answers (opened first unless it holds these queues): the first
        waited for up to `wait_ms`, then whatever else is already buffered. An ended stream
        is dropped; its error, if any, raised."""
        if not self.holds(queue_ids):
            self._open(queue_ids)
        stream = self.stream
        assert stream is not None
        got = stream.next(wait_ms / 1000.0)
        while got:
            for q, asked, response in got:
                self._pulls.stats.pulls += 1  # a pull's answer, as a plain Pull's is
                self._buffer.apply(q, asked, response)
            got = stream.next(0)
        if not stream.ended:
            return
        self.stream = None
        if stream.error is None:
            return
        error = self._pulls.explain(stream.error, FOLLOW)
        if error.code is not grpc.StatusCode.CANCELLED:
            raise error

    def forget(self, queue_id: int) -> None:
        self.stop()  # it pulls from the old position: its long poll freed now

    def stop(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def _open(self, queue_ids: list[int]) -> None:
        """One Follow call over every queue, each from its next offset."""
        self.stop()
        offsets = {}
        for q in queue_ids:
            offsets[q] = self._buffer.state(q).fetch_at
            self._ahead.forget(q)  # the stream asks the same
        pulls = [self._pulls.request(q, offsets[q]) for q in queue_ids]
        call = self._pulls.follow(pulls, self.long_poll_ms)
        self.stream = FollowStream(call, queue_ids, offsets)


class LongPolls(Fetcher):
    """Long-polling Pulls of the caught-up queues of a wide assignment (module docstring)."""

    name = "long poll"

    def __init__(self, pulls: PullCalls, buffer: Buffer, long_poll_ms: int, ahead: PullAhead):
        super().__init__(pulls, buffer)
        self.long_poll_ms = long_poll_ms
        self._ahead = ahead

    def fetch(self, queue_ids: list[int], wait_ms: int) -> None:
        """Long polls on the caught-up queues at once; the first answer cancels the others
        (a cancelled call frees its server thread at once)."""
        buffer = self._buffer
        wait_ms = min(wait_ms, self.long_poll_ms)
        watched = buffer.rotated(queue_ids)[:LONG_POLLS_MAX]
        if len(watched) < len(queue_ids):
            wait_ms = min(wait_ms, UNWATCHED_WAIT_MS)
        woke = threading.Event()
        calls: dict[int, tuple[int, grpc.Future[pb.PullResponse]]] = {}
        try:
            for q in watched:
                self._ahead.forget(q)  # the long poll asks the same
                request = self._pulls.request(q, buffer.state(q).fetch_at, long_poll_ms=wait_ms)
                future = self._pulls.pull_future(request)
                future.add_done_callback(lambda _: woke.set())
                calls[q] = (request.offset, future)
            woke.wait(self._pulls.retry.timeout_s(wait_ms))
        finally:
            for _, future in calls.values():
                future.cancel()  # nothing for calls that are done
        failed: ClientError | None = None
        for q, (asked, future) in calls.items():
            if future.cancelled():
                continue
            try:
                response = future.result()
            except grpc.RpcError as err:
                error = self._pulls.explain(err, PULL)
                if error.code is not grpc.StatusCode.CANCELLED:
                    failed = failed or error
                continue
            buffer.apply(q, asked, response)
        if failed is not None:
            raise failed
        if buffer.buffered():
            # The first answer cancelled the other polls: a quick pull of those queues takes
            # what they got meanwhile, so one poll hands out a batch of every queue that has one.
            others = [q for q in queue_ids if not buffer.state(q).buffered]
        else:
            # Nothing came: the queues no long poll watched are looked at now (the round
            # turns the rotation, so the next long polls watch others).
            others = [q for q in queue_ids if q not in calls]
        if others:
            self._ahead.fetch(others)


class IdleWait(Fetcher):
    """Long polling off: a pause of IDLE_PAUSE_S (at most `wait_ms`) instead of a wait."""

    name = "pause"

    def fetch(self, queue_ids: list[int], wait_ms: int) -> None:
        time.sleep(min(IDLE_PAUSE_S, wait_ms / 1000.0))
