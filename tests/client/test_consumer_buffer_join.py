"""A consumer's buffer joined with the next answer (message.py's MessageRun.after): the join
itself, and a consumer slower than its Follow stream on a real store (the
module's cluster of conftest.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from mqstore.client import ClientSettings, Consumer, Producer
from mqstore.client.message import MessageRun, decode_run

from .test_message_lazy import record

pytestmark = pytest.mark.timeout(120)


def _run(bodies: Sequence[bytes], first: int) -> MessageRun:
    records = [record(first + i, body=b) for i, b in enumerate(bodies)]
    run, _ = decode_run(b"".join(records), [len(r) for r in records])
    return run


@pytest.mark.parametrize("taken", [0, 2, 3])
def test_a_buffer_joins_the_next_answer(taken: int) -> None:
    """MessageRun.after: what is left of the buffer, then the next answer's messages."""
    first = _run([b"a", b"b", b"c"], 0)
    second = _run([b"d", b"e"], 3)
    want = [b"a", b"b", b"c", b"d", b"e"][taken:]
    joined = first.after(taken, second)
    assert isinstance(joined, MessageRun)
    assert [m.body for m in joined] == want
    assert [m.queue_offset for m in joined] == list(range(100 + taken, 105))


def test_a_consumer_behind_its_follow_stream_hands_out_every_message_once_in_order(
    settings: ClientSettings, topic: str
) -> None:
    """The follow path with a buffer left when the next answers of its queue come (Buffer.apply:
    MessageRun.after): a consumer slower than its stream, each message once,
    in queue order."""
    n = 600
    with Producer(settings, linger_ms=1) as p:
        p.send_sync(topic, b"m0", queue_id=0)

        def produce() -> None:
            time.sleep(0.3)  # the consumer is caught up and following by then
            p.send_batch(topic, [b"m%d" % j for j in range(1, n)], queue_id=0).result(20)

        producer = threading.Thread(target=produce)
        got: list[bytes] = []
        with Consumer(settings, topic, queues=[0], max_messages=7, long_poll_ms=5_000) as c:
            for m in c.messages(follow=True, limit=n):
                if not got:
                    producer.start()
                got.append(m.body)
                time.sleep(0.002)  # slower than the stream: its answers pile up
            assert c.stats.follows >= 1
        producer.join(30)
    assert got == [b"m%d" % j for j in range(n)]
