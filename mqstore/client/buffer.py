"""A Consumer's queues on the client: each queue's position, its next pull, and the batch
pulled but not handed out yet.

    QueueState of one queue:
        fetch_at    where the next pull starts
        position    the next offset to hand out (== fetch_at when nothing is buffered)
        messages    the buffered batch (message.MessageRun), `offsets` its queue offsets,
                    `taken` how many of it are handed out
        bad         a record that can never be handed out, right after the buffered
                    messages (fetch_at is past it): surfaced once they are handed out
        caught_up   the last pull found nothing more at the queue's end

    Buffer.apply(q, asked, answer)   a pull's answer (from any fetcher, fetchers.py) into
                                     the queue's state; ignored when the queue was sought
                                     elsewhere since the pull was sent
    Buffer.drain_parts()             every buffered message, a queue's batch after another's
    Buffer.hand_out_bad(state)       a bad record reached: raised or skipped (on_bad_record)

Queues are taken in turn: `rotated()` starts each round with the next queue (`turn()`).

A pull whose offset the store no longer holds (retention moved the queue's start: answers
OFFSET_TOO_SMALL, MESSAGE_WAS_REMOVING, OFFSET_FOUND_NULL) moves to the store's correction
and counts the offsets it stepped over in `stats.skipped` (data that cannot come back).
OFFSET_OVERFLOW_BADLY (past the end) moves back to the end; NO_MATCHED_MESSAGE (a tag filter
skipped everything scanned) moves on past what was scanned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from mqstore.client.answers import ConsumerStats, read_answer
from mqstore.client.checks import OnBadRecord
from mqstore.client.errors import BadRecord
from mqstore.client.message import Message, MessageRun, decode_answer
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

log = logging.getLogger("mqstore.client.consumer")

PULL = "ConsumeQueue/Pull"

# Statuses after which the offsets stepped over are gone for good (retention, removed files).
_LOST = frozenset({pb.OFFSET_TOO_SMALL, pb.MESSAGE_WAS_REMOVING, pb.OFFSET_FOUND_NULL})
# Statuses that say "nothing more at the end of this queue right now".
_AT_END = frozenset({pb.OFFSET_OVERFLOW_ONE, pb.NO_MESSAGE_IN_QUEUE})


class QueueState:
    """Client-side state of one assigned queue (see the module docstring)."""

    __slots__ = (
        "_position",
        "bad",
        "caught_up",
        "dropped",
        "fetch_at",
        "messages",
        "offsets",
        "taken",
    )

    def __init__(self, fetch_at: int, position: int) -> None:
        self.fetch_at = fetch_at
        self._position = position  # where the queue stood when the buffered batch came
        self.messages: MessageRun = decode_answer(b"", ())[0]
        self.offsets: list[int] = []
        self.taken = 0
        self.bad: BadRecord | None = None
        # A hint for poll, and what messages(follow=False) stops on.
        self.caught_up = False
        # Replaced by a new state (Buffer.set, a seek): a messages() loop handing this one's
        # batch out stops at its next message (one flag read, not a look-up a message).
        self.dropped = False

    @property
    def position(self) -> int:
        """The next offset to hand out: past the last message handed out (the buffer's end
        once it is all out), so that handing one out moves `taken` alone."""
        taken = self.taken
        if not taken:
            return self._position
        if taken < len(self.offsets):
            return self.offsets[taken - 1] + 1
        return self.end

    @position.setter
    def position(self, value: int) -> None:
        self._position = value

    @property
    def buffered(self) -> bool:
        return self.taken < len(self.messages) or self.bad is not None

    @property
    def has_messages(self) -> bool:
        return self.taken < len(self.messages)

    @property
    def end(self) -> int:
        """The position once every buffered message is handed out: the bad record's offset
        when one comes next, else where the next pull starts."""
        return self.bad.queue_offset if self.bad is not None else self.fetch_at

    def __repr__(self) -> str:
        return (
            f"QueueState(fetch_at={self.fetch_at}, position={self.position}, "
            f"buffered={len(self.messages) - self.taken}, bad={self.bad!r}, "
            f"caught_up={self.caught_up})"
        )


class Buffer:
    """Every resolved queue's state of one consumer. `start_of(q)` says where a queue not
    seen yet starts (positions.py)."""

    def __init__(
        self,
        topic: str,
        *,
        tags: tuple[str, ...],
        on_bad_record: OnBadRecord,
        stats: ConsumerStats,
        start_of: Callable[[int], int],
    ) -> None:
        self.topic = topic
        self.tags = tags
        self.on_bad_record: OnBadRecord = on_bad_record
        self.stats = stats
        self.queues: dict[int, QueueState] = {}
        self._start_of = start_of
        self._rotation = 0  # fairness: the queue a round starts with

    def state(self, queue_id: int) -> QueueState:
        """The queue's state, resolved from the start the first time."""
        state = self.queues.get(queue_id)
        if state is None:
            offset = self._start_of(queue_id)
            state = self.queues[queue_id] = QueueState(fetch_at=offset, position=offset)
        return state

    def set(self, queue_id: int, offset: int) -> None:
        """The queue starts again at `offset`: what is buffered of it is dropped."""
        old = self.queues.get(queue_id)
        if old is not None:
            old.dropped = True
        self.queues[queue_id] = QueueState(fetch_at=offset, position=offset)

    def positions(self) -> dict[int, int]:
        return {q: s.position for q, s in self.queues.items()}

    def buffered(self) -> bool:
        return any(state.buffered for state in self.queues.values())

    def look_again(self) -> None:
        """Forget which queues were caught up: the next fill starts with quick pulls."""
        for state in self.queues.values():
            state.caught_up = False

    # -- fairness ----------------------------------------------------------------------------------

    def rotated(self, queue_ids: list[int]) -> list[int]:
        if not queue_ids:
            return []
        k = self._rotation % len(queue_ids)
        return queue_ids[k:] + queue_ids[:k]

    def turn(self) -> None:
        """A round is over: the next starts with the next queue."""
        self._rotation += 1

    # -- answers in --------------------------------------------------------------------------------

    def apply(self, queue_id: int, asked: int, response: pb.PullResponse) -> None:
        """A pull's answer into the queue's state (buffer, next offset, caught up)."""
        state = self.queues.get(queue_id)
        if state is None or state.fetch_at != asked:
            return  # sought elsewhere since the pull was sent
        status = response.status
        next_begin = response.next_begin_offset
        if status == pb.FOUND:
            if state.bad is not None:
                return  # after a bad record still to surface: pulled again once it is
            run, offsets, bads, failed = read_answer(self.topic, queue_id, response, PULL)
            messages = run
            bad = bads[0] if bads else None
            if failed:  # the answer's messages before it; the rest is pulled again after it
                messages = run.head(failed[0].index)
                offsets = offsets[: failed[0].index]
            if bad is not None:
                next_begin = bad.queue_offset + 1
            first = offsets[0] if offsets else (bad.queue_offset if bad is not None else asked)
            if not self.tags and first > asked:
                # Without a filter a gap is messages the log no longer held (the server
                # steps over them): retention got there first.
                self.skip(queue_id, asked, first, "MESSAGE_WAS_REMOVING")
            if state.buffered:  # a follow's next answer; pulls go to queues with nothing buffered
                if state.taken == 0:
                    # Nothing of it handed out yet (it came earlier in this same look), so
                    # nobody holds it: grown in place, not copied once an answer.
                    state.messages.extend(messages)
                    state.offsets.extend(offsets)
                    messages, offsets = state.messages, state.offsets
                else:
                    # The rest of the buffer, then the answer's: joined without making a
                    # Message (making the buffer's at each answer would cost a consumer
                    # behind a follow stream time quadratic in its backlog).
                    messages = state.messages.after(state.taken, messages)
                    offsets = state.offsets[state.taken :] + offsets
            state.position = state.position  # what was handed out stays out
            state.messages, state.offsets, state.taken = messages, offsets, 0
            state.bad = bad
            state.fetch_at = next_begin
            state.caught_up = next_begin >= response.max_offset
            return
        if status in _AT_END:
            state.caught_up = True
            return
        if status in _LOST and next_begin > asked:
            self.skip(queue_id, asked, next_begin, pb.GetMessageStatus.Name(status))
        elif status == pb.OFFSET_OVERFLOW_BADLY:
            log.warning(
                "%s/%d: offset %d is past the end %d: moving back to it",
                self.topic,
                queue_id,
                asked,
                next_begin,
            )
        if next_begin == asked:
            state.caught_up = True  # no progress to make: wait instead of spinning
            return
        state.fetch_at = next_begin
        if not state.buffered:
            state.position = next_begin
        state.caught_up = status == pb.NO_MATCHED_MESSAGE and next_begin >= response.max_offset

    def skip(self, queue_id: int, begin: int, end: int, why: str) -> None:
        self.stats.skipped[queue_id] = self.stats.skipped.get(queue_id, 0) + end - begin
        log.warning(
            "%s/%d: offsets %d..%d are no longer in the store (%s): skipped",
            self.topic,
            queue_id,
            begin,
            end - 1,
            why,
        )

    # -- messages out ------------------------------------------------------------------------------

    def next_buffered(self) -> tuple[int, QueueState] | None:
        """The queue to hand out from next: a queue's whole batch, then the next queue's."""
        for q in self.rotated(list(self.queues)):
            state = self.queues[q]
            if state.buffered:
                return q, state
        return None

    def drain(self) -> list[Message]:
        """Every buffered message, a queue's batch after another's; positions move past them."""
        out: list[Message] = []
        for _, messages, _ in self.drain_parts():
            out.extend(messages[:])
        return out

    def drain_parts(self) -> list[tuple[int, Sequence[Message], list[int]]]:
        """drain as (queue id, messages, their queue offsets) a queue, no Message made. A bad
        record a queue has reached is handed out first (raised before anything is drained,
        with on_bad_record="raise"); one after a queue's messages waits for the next call
        (or is skipped now, with "skip")."""
        order = self.rotated(list(self.queues))
        for q in order:
            state = self.queues[q]
            if state.bad is not None and not state.has_messages:
                self.hand_out_bad(state)
        parts: list[tuple[int, Sequence[Message], list[int]]] = []
        for q in order:
            state = self.queues[q]
            if state.has_messages:
                taken, messages = state.taken, state.messages
                parts.append((q, messages.tail(taken), state.offsets[taken:]))
                self.stats.messages += len(messages) - taken
                state.taken = len(messages)
                state.position = state.end
                if state.bad is not None and self.on_bad_record == "skip":
                    self.hand_out_bad(state)
        return parts

    def hand_out_bad(self, state: QueueState) -> None:
        """The queue's bad record, reached: the position moves past it, then it is raised
        (on_bad_record="raise") or logged and skipped."""
        bad = state.bad
        assert bad is not None
        state.bad = None
        state.position = state.fetch_at
        self.stats.bad_records += 1
        if self.on_bad_record == "raise":
            raise bad
        log.warning("%s; skipped", bad)
