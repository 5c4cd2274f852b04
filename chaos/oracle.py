"""The oracle: what the producers were told, kept apart from the store, and the verdicts.

Every message a producer hands to the SDK is recorded here when `send` returns, and its
outcome when the future resolves:

    ACKED     a SendResult: topic, queue id, queue offset, commit-log offset, msg id, size
    FAILED    an error (retries ran out, a refusal, FLUSH_DISK_TIMEOUT ...): the outcome is
              unknown, the message may or may not be stored
    PENDING   no answer by the end of the run: also unknown
    FORFEITED acknowledged, and then its record was in the unflushed tail a torn-tail cycle
              zeroed (chaos/torn.py): under async flush an acknowledgement promises nothing
              durable before the flush, so the message may be gone; it is not LOST

Bodies are not kept: message(salt, producer, n) regenerates them, and the oracle keeps an
8-byte hash of each sent body to compare stored bytes with. Per producer the records are
columns (array.array) indexed by n, since n counts up from 0 per producer: a long run's
millions of messages take tens of bytes each, not a Python object each.

A torn cycle tells the oracle `forfeit(cut)` after the kill, and `seal()` once the answers the
dead process had sent have arrived, before the restart: every acknowledgement that arrived
before the seal at an offset at or past the cut is forfeited. Its record was in the log at the
kill unless an earlier cut took it, and the tear zeroed [cut, end). Arrival order tells the
lives apart: the restarted log reuses the offsets, but it answers nothing before it starts, and
an answer it gives from its producer table (a retry of something stored before) is judged like
any other, so a stale answer pointing into the cut range still counts as LOST. The a-th
acknowledgement to arrive is forfeited when some cut sealed after it lies at or below its
offset: one bisect over the seals, with the cuts' minimum over every later one kept as a
suffix minimum.

The replicated run (chaos/group_run.py) also asks which acknowledgements arrived since its
last check (`arrived(k)`: the oracle keeps the order of arrival, 10 bytes an acknowledgement)
and when each arrived around a fault (`watch()` ... `watched()`: (monotonic time, offset) of
every acknowledgement from the watch on), for the failover time and the longest pause.

At the end the log is read record by record into an Audit, and each sent message gets one
verdict, Kafka's produce-consume-validate classification made exact by the idempotence keys:

    verdict            acknowledged   stored                   meaning
    OK                 yes            once, at its offset,     the promise kept
                                      with its bytes
    LOST               yes            not at its offset with   a broken promise (the run fails)
                                      its bytes
    DUPLICATED         any            twice or more            the producer's retries stored it
                                                               again: the SDK's idempotence
                                                               failed (the run fails)
    UNACKED_STORED     no             once                     allowed: the answer was lost
    UNACKED_ABSENT     no             not at all               allowed: it never got in
    FORFEITED          yes, then cut  not required             allowed: acknowledged in the
                       by a torn                               unflushed tail a torn cycle
                       cycle                                   zeroed (async flush)

A stored record of the run's topics that is not a message this run sent ("foreign"), or whose
bytes differ from what its header says was sent ("corrupt"), fails the run too.
"""

from __future__ import annotations

import bisect
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum, IntEnum

from chaos.plan import TOPICS, body_hash, message, parse_header
from mqstore.client.producer import SendResult

# Every Nth message per producer keeps its msg id, to be looked up with GetMessage at the end
# (the others are checked when acknowledged: the id must name the acknowledged offset).
MSG_ID_SAMPLE_EVERY = 97
# Examples kept per kind of problem, for the report.
EXAMPLES_MAX = 10
# Acknowledgement times kept by one watch (a fault's cycle): a minute of a burst's 10,000/s.
WATCHED_MAX = 600_000
_UNSEALED = 1 << 62  # a torn cycle's seal until the commit log is about to start again
_OFFSET_HEX_CHARS = 16  # an offset msg id ends with the commit-log offset as 8 bytes of hex


class Outcome(IntEnum):
    PENDING = 0
    ACKED = 1
    FAILED = 2
    FORFEITED = 3  # never stored in the columns: an ACKED one a torn cycle's cut covers


class Verdict(Enum):
    OK = "acknowledged, stored once at its offset with its bytes"
    LOST = "acknowledged, not at its offset with its bytes"
    DUPLICATED = "stored more than once"
    UNACKED_STORED = "not acknowledged, stored once"
    UNACKED_ABSENT = "not acknowledged, not stored"
    FORFEITED = "acknowledged in an unflushed tail that a torn cycle zeroed"


@dataclass(frozen=True, slots=True)
class Ack:
    producer: int
    n: int
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    body_hash: int


class _Columns:
    """One producer's messages, indexed by n."""

    def __init__(self) -> None:
        self.outcome = array("b")
        self.body_hash = array("Q")
        self.topic = array("b")
        self.queue_id = array("h")
        self.queue_offset = array("q")
        self.commit_log_offset = array("q")
        self.size = array("i")
        self.arrival = array("q")  # its place in the order acknowledgements arrived


class Oracle:
    """Thread-safe: producer threads record sends, the SDK's threads record outcomes."""

    def __init__(self, producers: int, salt: int) -> None:
        self.salt = salt  # to know where each message was sent (plan.message)
        self._columns = [_Columns() for _ in range(producers)]
        self._lock = threading.Lock()
        self.acked_count = 0
        self.failed_count = 0
        self.dedup_answers = 0  # acks the store gave from a retry it had already stored
        self.msg_ids: dict[tuple[int, int], str] = {}  # the GetMessage sample
        self.failures: Counter[str] = Counter()  # error type -> count
        self.failure_examples: dict[str, str] = {}  # error type -> the first one's text
        # Answers that contradict what was sent (wrong topic or queue, a msg id that does not
        # name the acknowledged offset): each one is a bug.
        self.anomalies: list[str] = []
        self._marked = False
        self._first_ack_after_mark: float | None = None
        # Per torn cycle, in order: how many acknowledgements had arrived at its seal
        # (_UNSEALED until then), and the lowest cut of it and of every later
        # one: the a-th acknowledgement is forfeited at offsets >= _cut_min[i] for the first
        # i whose seal came after it.
        self._seals: tuple[int, ...] = ()
        self._cut_min: tuple[int, ...] = ()
        # (producer, n) of every acknowledgement in the order they arrived.
        self._order_producer = array("h")
        self._order_n = array("q")
        # While watching: (monotonic time, commit-log offset) of every acknowledgement.
        self._watched: list[tuple[float, int]] | None = None

    @property
    def producers(self) -> int:
        return len(self._columns)

    def sent_count(self, producer: int) -> int:
        return len(self._columns[producer].outcome)

    def sent(self, producer: int, n: int, hash_of_body: int) -> None:
        c = self._columns[producer]
        if n != len(c.outcome):
            raise ValueError(f"producer {producer} sent message {n}, expected {len(c.outcome)}")
        c.outcome.append(Outcome.PENDING)
        c.body_hash.append(hash_of_body)
        c.topic.append(-1)
        c.queue_id.append(-1)
        c.queue_offset.append(-1)
        c.commit_log_offset.append(-1)
        c.size.append(0)
        c.arrival.append(-1)

    def acked(self, producer: int, n: int, result: SendResult) -> None:
        c = self._columns[producer]
        spec = message(self.salt, producer, n)
        with self._lock:
            c.outcome[n] = Outcome.ACKED
            c.topic[n] = TOPICS.index(result.topic) if result.topic in TOPICS else -1
            c.queue_id[n] = result.queue_id
            c.queue_offset[n] = result.queue_offset
            c.commit_log_offset[n] = result.commit_log_offset
            c.size[n] = result.size
            c.arrival[n] = self.acked_count
            self.acked_count += 1
            self._order_producer.append(producer)
            self._order_n.append(n)
            if self._watched is not None and len(self._watched) < WATCHED_MAX:
                self._watched.append((time.monotonic(), result.commit_log_offset))
            if self._marked and self._first_ack_after_mark is None:
                self._first_ack_after_mark = time.monotonic()
            if result.duplicate:
                self.dedup_answers += 1
            if n % MSG_ID_SAMPLE_EVERY == 0:
                self.msg_ids[(producer, n)] = result.msg_id
            where = f"producer {producer} message {n}"
            if (result.topic, result.queue_id) != (spec.topic, spec.queue_id):
                self._anomaly(
                    f"{where}: acked in {result.topic}/{result.queue_id}, "
                    f"sent to {spec.topic}/{spec.queue_id}"
                )
            if not result.msg_id.endswith(f"{result.commit_log_offset:016X}"):
                self._anomaly(
                    f"{where}: msg id {result.msg_id} does not name offset "
                    f"{result.commit_log_offset}"
                )
            if result.commit_log_offset < 0 or result.queue_offset < 0:
                self._anomaly(f"{where}: acked with offsets {result}")

    def mark(self) -> None:
        """Start watching for the next acknowledgement (see first_ack_after_mark)."""
        with self._lock:
            self._marked = True
            self._first_ack_after_mark = None

    def watch(self) -> None:
        """Record when each acknowledgement arrives from now on (see `watched`)."""
        with self._lock:
            self._watched = []

    def watched(self, *, stop: bool = False) -> list[tuple[float, int]]:
        """(monotonic time, commit-log offset) of every acknowledgement since `watch()`, in
        arrival order; `stop` ends the watch."""
        with self._lock:
            out = list(self._watched or ())
            if stop:
                self._watched = None
            return out

    def arrived(self, start: int, end: int | None = None) -> list[tuple[int, int]]:
        """(producer, n) of the acknowledgements that arrived start-th to end-th (default: to
        the latest)."""
        with self._lock:
            stop = len(self._order_n) if end is None else min(end, len(self._order_n))
            return list(
                zip(self._order_producer[start:stop], self._order_n[start:stop], strict=True)
            )

    def forfeit(self, cut: int) -> None:
        """A torn cycle zeroed the log from `cut` on after the commit log's kill: every
        acknowledgement at or past it that arrives before `seal()` is forfeited."""
        with self._lock:
            if self._seals and self._seals[-1] == _UNSEALED:
                raise ValueError("forfeit() again before seal()")
            seals = [*self._seals, _UNSEALED]
            cuts = [*self._cut_min, cut]
            for i in range(len(cuts) - 2, -1, -1):
                cuts[i] = min(cuts[i], cuts[i + 1])
            self._seals, self._cut_min = tuple(seals), tuple(cuts)

    def seal(self) -> None:
        """The dead commit log's answers are in, and it is about to be started again:
        acknowledgements from now on are the next life's."""
        with self._lock:
            if self._seals and self._seals[-1] == _UNSEALED:
                self._seals = (*self._seals[:-1], self.acked_count)

    def _forfeited(self, offset: int, arrival: int) -> bool:
        seals, cuts = self._seals, self._cut_min
        i = bisect.bisect_right(seals, arrival)
        return i < len(seals) and offset >= cuts[i]

    @property
    def torn_cuts(self) -> int:
        return len(self._seals)

    @property
    def first_ack_after_mark(self) -> float | None:
        """Monotonic time of the first acknowledgement since mark(); None: none yet."""
        return self._first_ack_after_mark

    def failed(self, producer: int, n: int, error: BaseException) -> None:
        with self._lock:
            self._columns[producer].outcome[n] = Outcome.FAILED
            self.failed_count += 1
            kind = type(error).__name__
            self.failures[kind] += 1
            self.failure_examples.setdefault(kind, f"producer {producer} message {n}: {error}")

    def _anomaly(self, text: str) -> None:
        if len(self.anomalies) < EXAMPLES_MAX:
            self.anomalies.append(text)
        else:
            self.anomalies[-1] = f"... and more ({text})"

    # -- reading --------------------------------------------------------------------------------

    def outcome(self, producer: int, n: int) -> Outcome:
        c = self._columns[producer]
        outcome = Outcome(c.outcome[n])
        if outcome == Outcome.ACKED and self._forfeited(c.commit_log_offset[n], c.arrival[n]):
            return Outcome.FORFEITED
        return outcome

    def ack(self, producer: int, n: int) -> Ack | None:
        """The acknowledgement of message n (None: not acknowledged, or forfeited)."""
        c = self._columns[producer]
        if n >= len(c.outcome) or self.outcome(producer, n) != Outcome.ACKED:
            return None
        t = c.topic[n]
        return Ack(
            producer,
            n,
            TOPICS[t] if t >= 0 else "?",
            c.queue_id[n],
            c.queue_offset[n],
            c.commit_log_offset[n],
            c.size[n],
            c.body_hash[n],
        )

    def acks(self) -> Iterator[Ack]:
        """Every acknowledgement that still stands (forfeited ones left out)."""
        for p, c in enumerate(self._columns):
            for n in range(len(c.outcome)):
                if c.outcome[n] == Outcome.ACKED:
                    ack = self.ack(p, n)
                    if ack is not None:
                        yield ack

    def counts(self) -> Counter[Outcome]:
        out: Counter[Outcome] = Counter()
        for p, c in enumerate(self._columns):
            for n, o in enumerate(c.outcome):
                out[self.outcome(p, n) if o == Outcome.ACKED else Outcome(o)] += 1
        return out

    def sent_hash(self, producer: int, n: int) -> int:
        return self._columns[producer].body_hash[n]


# -- the audit of the log ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record of the log, as the audit needs it (body decompressed)."""

    commit_log_offset: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    keys: tuple[str, ...] = ()
    uniq_key: str = ""
    store_timestamp_ms: int = 0


@dataclass
class AuditResult:
    verdicts: Counter[Verdict]
    corrupt: int  # stored records whose bytes are not what was sent
    foreign: int  # stored records that are no message this run sent
    records: int
    lost: set[tuple[int, int]]  # (producer, n) of every acknowledged message not found
    # Examples (at most EXAMPLES_MAX of each), for the report.
    lost_examples: list[str]
    duplicated_examples: list[str]
    corrupt_examples: list[str]
    foreign_examples: list[str]


class Audit:
    """Compares the log, fed record by record in any order, with the oracle."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle
        self.salt = oracle.salt
        self._copies = [array("b", bytes(oracle.sent_count(p))) for p in range(oracle.producers)]
        self._at_offset = [array("b", bytes(oracle.sent_count(p))) for p in range(oracle.producers)]
        self._where: dict[tuple[int, int], list[int]] = {}  # only for messages stored twice
        self._corrupt: list[str] = []
        self._foreign: list[str] = []
        self._corrupt_total = 0
        self._foreign_total = 0
        self.records = 0

    def add(self, rec: StoredRecord) -> None:
        self.records += 1
        at = f"record at {rec.commit_log_offset} ({rec.topic}/{rec.queue_id}@{rec.queue_offset})"
        ids = parse_header(rec.body)
        if ids is None or not 0 <= ids[0] < self.oracle.producers:
            self._foreign_total += 1
            _keep(self._foreign, f"{at}: not a message of this run ({rec.body[:32]!r})")
            return
        p, n = ids
        if n >= self.oracle.sent_count(p):
            self._foreign_total += 1
            _keep(self._foreign, f"{at}: producer {p} message {n} was never sent")
            return
        spec = message(self.salt, p, n)
        wrong = []
        if rec.body != spec.body:
            wrong.append(f"body ({len(rec.body)} bytes, sent {len(spec.body)})")
        if (rec.topic, rec.queue_id) != (spec.topic, spec.queue_id):
            wrong.append(f"place (sent to {spec.topic}/{spec.queue_id})")
        if rec.uniq_key != spec.uniq_key:
            wrong.append(f"uniq key {rec.uniq_key!r}")
        if tuple(rec.keys) != ((spec.key,) if spec.key else ()):
            wrong.append(f"keys {rec.keys}")
        if wrong:
            self._corrupt_total += 1
            _keep(self._corrupt, f"{at}: producer {p} message {n}: wrong {', '.join(wrong)}")
            return
        copies = self._copies[p]
        if copies[n] >= 1:
            self._where.setdefault((p, n), []).append(rec.commit_log_offset)
        copies[n] = min(copies[n] + 1, 127)
        ack = self.oracle.ack(p, n)
        if (
            ack is not None
            and ack.commit_log_offset == rec.commit_log_offset
            and (ack.topic, ack.queue_id, ack.queue_offset)
            == (rec.topic, rec.queue_id, rec.queue_offset)
            and ack.body_hash == body_hash(rec.body)
        ):
            self._at_offset[p][n] = 1

    def finish(self) -> AuditResult:
        verdicts: Counter[Verdict] = Counter()
        lost: list[str] = []
        lost_ids: set[tuple[int, int]] = set()
        duplicated: list[str] = []
        for p in range(self.oracle.producers):
            copies, at_offset = self._copies[p], self._at_offset[p]
            for n in range(len(copies)):
                outcome = self.oracle.outcome(p, n)
                if copies[n] > 1:
                    verdicts[Verdict.DUPLICATED] += 1
                    others = self._where.get((p, n), [])
                    _keep(
                        duplicated,
                        f"producer {p} message {n} ({outcome.name}) stored {copies[n]} times "
                        f"(also at {others})",
                    )
                elif outcome == Outcome.FORFEITED:
                    verdicts[Verdict.FORFEITED] += 1
                elif outcome == Outcome.ACKED:
                    if at_offset[n]:
                        verdicts[Verdict.OK] += 1
                    else:
                        verdicts[Verdict.LOST] += 1
                        lost_ids.add((p, n))
                        ack = self.oracle.ack(p, n)
                        stored = "stored elsewhere" if copies[n] else "not stored"
                        _keep(lost, f"producer {p} message {n}: acked as {ack}; {stored}")
                elif copies[n]:
                    verdicts[Verdict.UNACKED_STORED] += 1
                else:
                    verdicts[Verdict.UNACKED_ABSENT] += 1
        return AuditResult(
            verdicts=verdicts,
            corrupt=self._corrupt_total,
            foreign=self._foreign_total,
            records=self.records,
            lost=lost_ids,
            lost_examples=lost,
            duplicated_examples=duplicated,
            corrupt_examples=self._corrupt,
            foreign_examples=self._foreign,
        )


def _keep(examples: list[str], text: str) -> None:
    if len(examples) < EXAMPLES_MAX:
        examples.append(text)
