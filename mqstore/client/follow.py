"""A cq_svc Follow stream, read ahead by a thread of its own, for a Consumer that has caught up.

A caught-up consumer of several queues used to hold one long-polling Pull per queue and, after
every wake-up, cancel the others and start them all again: about ten calls per batch seen, at
~0.3-0.5 ms of CPU each on both ends. One Follow call watches every queue instead, and the
server answers each queue as it gets something (consumequeue.proto, `rpc Follow`).

gRPC's sync API blocks in `next()` on a stream with no timeout, so a daemon thread reads the
stream into a small buffer that the Consumer waits on with its poll's timeout:

    stream = FollowStream(call, queue_ids, offsets)     # the call is under way
    got = stream.next(timeout_s)    # [(queue id, offset asked, PullResponse), ...]: one round's
                                    # answers; [] when none came in time or the stream ended
                                    # (see `ended`, `error`)
    stream.close()                  # cancels the call; the thread ends

At most FOLLOW_BUFFER_ANSWERS stream messages wait in the buffer; past that the thread stops reading
and HTTP/2 flow control holds the server back, so a slow consumer does not grow the buffer.
`expected[q]` is the offset the stream's next answer for queue q is pulled from (the server
moves on from each answer's next_begin_offset the same way): the Consumer keeps the stream only
while that agrees with its own positions (a seek or a plain pull ends it).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Final, Protocol

import grpc

from mqstore.client.errors import Internal
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

# Stream messages read ahead of the consumer (each the answers of one round, a batch of each
# queue that had something).
FOLLOW_BUFFER_ANSWERS: Final = 8
# How often a reader blocked on a full buffer looks whether the stream was closed.
_PUT_RETRY_S: Final = 0.1
# How long close() waits for the reader thread to see the cancelled call and return: no
# thread of ours stays inside gRPC after close (a process exiting then could hang in it).
_READER_STOP_WAIT_S: Final = 5.0


class _Call(Protocol):
    def __iter__(self) -> Iterator[pb.FollowResponse]: ...

    def cancel(self) -> bool: ...


class _End:
    __slots__ = ("error",)

    def __init__(self, error: grpc.RpcError | None) -> None:
        self.error = error


class FollowStream:
    def __init__(self, call: _Call, queue_ids: Sequence[int], offsets: Mapping[int, int]) -> None:
        self.queue_ids = list(queue_ids)  # pull_index -> queue id
        self.expected = {q: offsets[q] for q in self.queue_ids}
        self.ended = False
        self.error: grpc.RpcError | None = None
        self._call = call
        self._answers: queue.Queue[pb.FollowResponse | _End] = queue.Queue(FOLLOW_BUFFER_ANSWERS)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, name="mqstore-follow", daemon=True)
        self._thread.start()

    def matches(self, queue_ids: Sequence[int], fetch_at: Mapping[int, int]) -> bool:
        """Still the stream for these queues at these positions."""
        return (
            not self.ended
            and len(queue_ids) == len(self.queue_ids)
            and all(self.expected.get(q) == fetch_at.get(q) for q in queue_ids)
        )

    def next(self, timeout_s: float) -> list[tuple[int, int, pb.PullResponse]]:
        """The answers of the next stream message as (queue id, the offset it was pulled from,
        answer), waiting up to `timeout_s` (0: only what is buffered); [] when none came or
        the stream ended."""
        if self.ended:
            return []
        try:
            if timeout_s > 0:
                item = self._answers.get(timeout=timeout_s)
            else:
                item = self._answers.get_nowait()
        except queue.Empty:
            return []
        if isinstance(item, _End):
            self.ended, self.error = True, item.error
            return []
        out = []
        for answer in item.answers:
            index = answer.pull_index
            if not 0 <= index < len(self.queue_ids):
                self.close()
                self.ended = True
                raise Internal(
                    f"a Follow answer names pull {index} of {len(self.queue_ids)}",
                    method="ConsumeQueue/Follow",
                )
            queue_id = self.queue_ids[index]
            out.append((queue_id, self.expected[queue_id], answer))
            self.expected[queue_id] = answer.next_begin_offset
        return out

    def close(self) -> None:
        """Cancel the call (nothing for one that ended) and wait for the reader thread."""
        self._closed.set()
        self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(_READER_STOP_WAIT_S)

    def _read(self) -> None:
        end = _End(None)
        try:
            for response in self._call:
                if not self._put(response):
                    return
        except grpc.RpcError as err:
            end = _End(err)
        self._put(end)

    def _put(self, item: pb.FollowResponse | _End) -> bool:
        while not self._closed.is_set():
            try:
                self._answers.put(item, timeout=_PUT_RETRY_S)
                return True
            except queue.Full:
                continue
        return False
