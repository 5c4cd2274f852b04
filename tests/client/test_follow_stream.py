"""FollowStream, the reader of a Follow call, over calls that a real server cannot be made to
produce (a pull_index out of range, an error after some answers) and the bound of its buffer.
The Consumer's use of it against real services is in test_consumer_follow.py."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest

from mqstore.client.errors import Internal
from mqstore.client.follow import FOLLOW_BUFFER_ANSWERS, FollowStream
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.e2e.support import eventually

WAIT_S = 5.0


class _Failed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class _Call:
    """A call that yields the given messages, then ends (or raises `error`); counts how many
    messages its reader took."""

    def __init__(self, messages: list[pb.FollowResponse], error: grpc.RpcError | None = None):
        self.messages = messages
        self.error = error
        self.taken = 0
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[pb.FollowResponse]:
        for m in self.messages:
            if self.cancelled.is_set():
                return
            self.taken += 1
            yield m
        if self.error is not None:
            raise self.error

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def answer(index: int, next_begin: int) -> pb.PullResponse:
    return pb.PullResponse(status=pb.FOUND, pull_index=index, next_begin_offset=next_begin)


class _FullPuts:
    count = 0


def count_full_puts(stream: FollowStream) -> _FullPuts:
    """Counts the reader's puts into its buffer that found it full (and timed out)."""
    full = _FullPuts()
    buffer = stream._answers
    put = buffer.put

    def counted(item: object, block: bool = True, timeout: float | None = None) -> None:
        try:
            put(item, block, timeout)  # type: ignore[arg-type]
        except queue.Full:
            full.count += 1
            raise

    buffer.put = counted  # type: ignore[method-assign]
    return full


def test_each_answer_names_its_queue_and_the_offset_it_was_pulled_from() -> None:
    call = _Call(
        [
            pb.FollowResponse(answers=[answer(0, 12), answer(1, 30)]),
            pb.FollowResponse(answers=[answer(0, 15)]),
        ]
    )
    stream = FollowStream(call, [7, 9], {7: 10, 9: 20})
    got = stream.next(5.0)
    assert [(q, asked, a.next_begin_offset) for q, asked, a in got] == [(7, 10, 12), (9, 20, 30)]
    assert [(q, asked) for q, asked, _ in stream.next(5.0)] == [(7, 12)]
    assert stream.expected == {7: 15, 9: 30}
    assert stream.matches([7, 9], {7: 15, 9: 30})
    assert not stream.matches([7, 9], {7: 14, 9: 30})
    assert stream.next(5.0) == []  # the call ended
    assert stream.ended and stream.error is None
    assert not stream.matches([7, 9], {7: 15, 9: 30})


def test_an_error_after_answers_is_kept_for_the_consumer() -> None:
    failure = _Failed()
    stream = FollowStream(_Call([pb.FollowResponse(answers=[answer(0, 1)])], failure), [0], {0: 0})
    assert len(stream.next(5.0)) == 1
    assert stream.next(5.0) == []
    assert stream.ended and stream.error is failure


def test_an_answer_naming_no_asked_pull_is_an_internal_error() -> None:
    call = _Call([pb.FollowResponse(answers=[answer(2, 1)])])
    stream = FollowStream(call, [0, 1], {0: 0, 1: 0})
    with pytest.raises(Internal):
        stream.next(5.0)
    assert stream.ended and call.cancelled.is_set()


def test_the_reader_stops_at_a_full_buffer_and_ends_when_closed() -> None:
    many = [pb.FollowResponse(answers=[answer(0, i + 1)]) for i in range(FOLLOW_BUFFER_ANSWERS * 4)]
    call = _Call(many)
    stream = FollowStream(call, [0], {0: 0})
    full = count_full_puts(stream)
    # The buffer holds FOLLOW_BUFFER_ANSWERS; the reader holds one more, waiting to put it: it
    # finds the buffer full again and again, and reads no further.
    eventually(lambda: full.count >= 2, timeout_s=WAIT_S, step_s=0.01)
    assert call.taken == FOLLOW_BUFFER_ANSWERS + 1
    assert [q for q, _, _ in stream.next(0)] == [0]  # one taken: the reader moves one on
    eventually(lambda: call.taken == FOLLOW_BUFFER_ANSWERS + 2, timeout_s=WAIT_S, step_s=0.01)
    stream.close()
    assert call.cancelled.is_set()
    eventually(lambda: not stream._thread.is_alive(), timeout_s=WAIT_S, step_s=0.01)
