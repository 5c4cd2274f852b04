"""The load of a chaos run: SDK producers sending the plan's messages, SDK consumers following
the topics and checking every message they are handed.

Producers. One thread and one `mqstore.client.Producer` (its own connection, idempotent
retries) per producer id. Message n of producer p is plan.message(salt, p, n): the oracle
records it once `send` has queued it, and its outcome when the future resolves. A producer
paces itself (`rate_per_s`; in a burst it does not) and keeps at most INFLIGHT_MAX messages
without an answer, so that an outage turns into waiting rather than into an unbounded buffer.

Consumers. One thread and one `mqstore.client.Consumer` per topic, reading every queue from
offset 0 with long polls, for the whole run. Each message handed out is checked at once:

    its body decodes as a chaos message and equals what plan.message says was sent,
    at the place it was sent to                          else: a corrupt read
    its queue offset is the next one of its queue        lower: redelivered (one position
                                                         handed the same offset out twice);
                                                         higher: a gap (skipped messages)

The commit-log offset of every message handed out is kept per queue, so that the end of the
run can compare what the consumer saw with what the log holds (a message seen during the run
that is not in the final log was served and then lost).

A torn-tail cycle (chaos/torn.py) holds the consumers first: each closes its SDK consumer and
waits, so that none reads the log while it is cut and regrown. Then it rewinds them: each
queue's positions from the first one whose record lay at or past the cut are dropped (those
records were zeroed, and the regrown log hands out the same queue offsets again), and the
consumer starts again from there.
"""

from __future__ import annotations

import threading
import time
from array import array
from dataclasses import dataclass, field
from functools import partial

from chaos.oracle import EXAMPLES_MAX, Oracle
from chaos.plan import QUEUES, body_hash, message, parse_header
from mqstore.client.consumer import Consumer
from mqstore.client.errors import ClientError, DataLoss, Unavailable
from mqstore.client.message import Message
from mqstore.client.producer import Producer, ProducerStats, SendFuture
from mqstore.client.settings import ClientSettings

# Messages a producer may have without an answer. At the default rate that is a few seconds
# of load: enough to keep requests pipelined through a restart, small enough that one
# outage does not queue up a minute of messages.
INFLIGHT_MAX = 1_000
RATE_PER_S_DEFAULT = 250.0  # per producer; two producers keep ~500 msg/s on 2 shared cores
PRODUCER_CLOSE_TIMEOUT_S = 60.0  # the SDK retries for 30 s; then every future has failed
# A consumer's poll returns at least this often, to look at the stop and hold flags.
POLL_TIMEOUT_S = 0.5
HOLD_POLL_S = 0.01  # a held consumer looks at its flags this often
CONSUMER_LONG_POLL_MS = 1_000
CONSUMER_BATCH_MESSAGES = 256
# A consumer facing only UNAVAILABLE this long raises; the follower counts it and starts a
# new consumer at its positions (a service down that long also fails the recovery bound).
CONSUMER_RECONNECT_TIMEOUT_S = 60.0
# A held consumer finishes its poll (POLL_TIMEOUT_S) and closes its SDK consumer well within it.
HOLD_TIMEOUT_S = 30.0


class ProducerLoad(threading.Thread):
    def __init__(
        self,
        producer: int,
        settings: ClientSettings,
        oracle: Oracle,
        *,
        rate_per_s: float = RATE_PER_S_DEFAULT,
    ) -> None:
        super().__init__(name=f"chaos-producer-{producer}", daemon=True)
        self.producer = producer
        self.settings = settings
        self.oracle = oracle
        self.rate_per_s = rate_per_s
        self.stop_event = threading.Event()
        self.burst = False  # send unpaced (the runner sets it per cycle)
        self._window = threading.Semaphore(INFLIGHT_MAX)
        self.sdk: Producer | None = None
        self.refused_locally = 0  # send() raised: nothing was queued (retried with the same n)
        self.error: BaseException | None = None
        self.unfinished = False  # close() timed out with messages still unanswered
        self.restarts = 0
        self.retired: list[ProducerStats] = []  # stats of the SDK producers restarted away
        self._restart = threading.Event()
        self._restarted = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the runner, not lost in a thread
            self.error = exc

    def _run(self) -> None:
        oracle, salt = self.oracle, self.oracle.salt
        sdk = self.sdk = Producer(self.settings, producer_id=f"chaos-{self.producer}")
        n = 0
        interval_s = 1.0 / self.rate_per_s
        next_at = time.monotonic()
        try:
            while not self.stop_event.is_set():
                if self._restart.is_set():
                    sdk = self._new_life(sdk)
                if not self._window.acquire(timeout=POLL_TIMEOUT_S):
                    continue
                spec = message(salt, self.producer, n)
                try:
                    future = sdk.send(
                        spec.topic,
                        spec.body,
                        key=spec.key,
                        queue_id=spec.queue_id if spec.explicit_queue else None,
                        uniq_key=spec.uniq_key,
                    )
                except ClientError:
                    self._window.release()
                    self.refused_locally += 1
                    self.stop_event.wait(interval_s)
                    continue
                oracle.sent(self.producer, n, body_hash(spec.body))
                future.add_done_callback(partial(self._done, n))
                n += 1
                next_at += interval_s
                pause = next_at - time.monotonic()
                if self.burst:
                    next_at = time.monotonic()
                elif pause > 0:
                    self.stop_event.wait(pause)
                else:
                    next_at = time.monotonic()  # behind (an outage): do not burst to catch up
        finally:
            try:
                sdk.close(PRODUCER_CLOSE_TIMEOUT_S)
            except TimeoutError:
                self.unfinished = True

    def _new_life(self, old: Producer) -> Producer:
        """Close the SDK producer (every message answered) and open a new one under the same
        producer id, as a client process restarting with a stable id does."""
        try:
            old.close(PRODUCER_CLOSE_TIMEOUT_S)
        except TimeoutError:
            self.unfinished = True
        self.retired.append(old.stats)
        sdk = self.sdk = Producer(self.settings, producer_id=f"chaos-{self.producer}")
        self.restarts += 1
        self._restart.clear()
        self._restarted.set()
        return sdk

    def restart(self, timeout_s: float = PRODUCER_CLOSE_TIMEOUT_S + 10.0) -> bool:
        """Ask the thread for a new SDK producer under the same id; True once it has one."""
        self._restarted.clear()
        self._restart.set()
        return self._restarted.wait(timeout_s)

    def all_stats(self) -> list[ProducerStats]:
        return [*self.retired, *([self.sdk.stats] if self.sdk is not None else [])]

    def _done(self, n: int, future: SendFuture) -> None:
        error = future.exception()
        if error is None:
            self.oracle.acked(self.producer, n, future.result())
        else:
            self.oracle.failed(self.producer, n, error)
        self._window.release()

    def stop(self) -> None:
        self.stop_event.set()


@dataclass
class FollowerStats:
    messages: int = 0
    corrupt: int = 0  # bodies that are not what was sent, or records the SDK refused (CRC)
    redelivered: int = 0  # a queue offset handed out again by one consumer position
    gaps: int = 0  # offsets a queue's position stepped over
    restarts: int = 0  # consumers started again after raising
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append(text)


class Follower(threading.Thread):
    """A consumer of one topic, every queue from offset 0, for the whole run."""

    def __init__(self, topic: str, settings: ClientSettings, salt: int) -> None:
        super().__init__(name=f"chaos-consumer-{topic}", daemon=True)
        self.topic = topic
        self.settings = settings
        self.salt = salt
        self.stats = FollowerStats()
        # Per queue, the commit-log offset of each queue offset handed out (-1: stepped over).
        self.seen: dict[int, array[int]] = {q: array("q") for q in range(QUEUES)}
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self._hold = threading.Event()  # asked to stop consuming (a torn cycle)
        self._held = threading.Event()  # it has: no SDK consumer open
        self.rewound = 0  # positions dropped by rewinds

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if self._hold.is_set():
                    self._held.set()
                    self.stop_event.wait(HOLD_POLL_S)
                    continue
                try:
                    self._follow()
                except Unavailable as err:
                    self.stats.restarts += 1
                    self.stats.note(f"{self.topic}: consumer gave up ({err}); started again")
        except DataLoss as err:
            self.stats.corrupt += 1
            self.stats.note(f"{self.topic}: the store served a record failing its checks: {err}")
            self.error = err
        except BaseException as exc:
            self.error = exc

    def _follow(self) -> None:
        start = {q: len(s) for q, s in self.seen.items()}
        with Consumer(
            self.settings,
            self.topic,
            queues=range(QUEUES),
            start=start,
            max_messages=CONSUMER_BATCH_MESSAGES,
            long_poll_ms=CONSUMER_LONG_POLL_MS,
            reconnect_timeout_s=CONSUMER_RECONNECT_TIMEOUT_S,
        ) as consumer:
            while not self.stop_event.is_set() and not self._hold.is_set():
                for m in consumer.poll(POLL_TIMEOUT_S):
                    self._check(m)

    def hold(self, timeout_s: float = HOLD_TIMEOUT_S) -> bool:
        """Stop consuming: True once the thread has closed its consumer (or has ended)."""
        self._held.clear()
        self._hold.set()
        deadline = time.monotonic() + timeout_s
        while not self._held.wait(HOLD_POLL_S):
            if not self.is_alive():
                return True
            if time.monotonic() > deadline:
                return False
        return True

    @property
    def held(self) -> bool:
        """It consumes nothing now (held, or its thread ended)."""
        return self._held.is_set() or not self.is_alive()

    def rewind(self, cut: int) -> int:
        """While held: forget every position from the first whose record lies at or past
        `cut`, per queue; returns how many were dropped."""
        if not self.held:
            raise RuntimeError("rewind() of a consumer that is not held")
        dropped = 0
        for seen in self.seen.values():
            at = len(seen)  # queue offsets follow log order: the records past the cut are last
            while at > 0 and seen[at - 1] >= cut:
                at -= 1
            dropped += len(seen) - at
            del seen[at:]
        self.rewound += dropped
        return dropped

    def release(self) -> None:
        """Consume again, from the (rewound) positions."""
        self._held.clear()
        self._hold.clear()

    def _check(self, m: Message) -> None:
        s = self.stats
        s.messages += 1
        seen = self.seen.get(m.queue_id)
        where = f"{self.topic}/{m.queue_id}@{m.queue_offset} (log {m.commit_log_offset})"
        if seen is None:
            s.corrupt += 1
            s.note(f"{where}: a queue this consumer does not read")
            return
        if m.queue_offset < len(seen):
            s.redelivered += 1
            s.note(f"{where}: handed out again (first at log {seen[m.queue_offset]})")
            return
        if m.queue_offset > len(seen):
            s.gaps += m.queue_offset - len(seen)
            s.note(f"{where}: offsets {len(seen)}..{m.queue_offset - 1} stepped over")
            seen.extend([-1] * (m.queue_offset - len(seen)))
        seen.append(m.commit_log_offset)
        ids = parse_header(m.body)
        if ids is None:
            s.corrupt += 1
            s.note(f"{where}: body is not a chaos message: {m.body[:32]!r}")
            return
        spec = message(self.salt, *ids)
        if (m.body, m.topic, m.queue_id, m.uniq_key) != (
            spec.body,
            spec.topic,
            spec.queue_id,
            spec.uniq_key,
        ):
            s.corrupt += 1
            s.note(f"{where}: producer {ids[0]} message {ids[1]} differs from what was sent")

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Has this consumer handed out everything up to `ends` (queue -> max offset)?"""
        return all(len(self.seen.get(q, ())) >= end for q, end in ends.items())

    def stop(self) -> None:
        self.stop_event.set()
