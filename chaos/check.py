"""The checks after the last cycle, once the load has stopped and the followers caught up.

    log       every record of the commit-log files (mqstore.storage.logreader, read-only
              beside the running store, which is idle by then), CRC checked, fed to the
              oracle's Audit: each sent message gets its verdict; a bad range in the files
              is a problem of its own
    read      every acknowledged append read back by its offset through the running commit
              log (Read, with its size): queue id, queue offset, topic and body hash must be
              the acknowledged ones
    msg ids   a sample of acknowledged msg ids through GetMessage
    queues    every queue of every topic pulled from cq_svc from offset 0 to its end:
              exactly the log's records of that queue, in order, same offsets, same bodies
    consumer  what each following consumer was handed during the run, position by position:
              exactly the log's records (a message handed out and later missing from the log
              was served before it was durable, or lost after)
    index     every sampled key (iter_key) finds exactly the log's records with that key;
              a sample of unique ids (query_by_uniq_key) finds exactly one record each

And after each torn-tail cycle, while the load goes on (`check_tail`): the region of the log
from the start of the segment that holds the cut to the log's end E, read from the files, is
what a from-scratch rebuild of cq_svc and index_svc holds there; once both have applied past
E, their answers for it must equal it:

    queues    every queue with records in the region, pulled from cq_svc from the queue
              offset before the region's first: that one lies below the region, then exactly
              the region's records (queue offsets, commit-log offsets, body hashes), nothing
              else below E; every other queue's newest units hold nothing in the region
    keys      every key of the run (QueryByKey over the region's store times, a second wider
              each way): its offsets in the region are exactly the region's records with it

Reads that return bytes other than what was sent are corrupt reads; acknowledged appends that
cannot be read at their offset are lost. Both are counted once per message however many
checks see them.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field

from chaos.load import Follower
from chaos.oracle import EXAMPLES_MAX, Ack, Audit, Oracle, StoredRecord
from chaos.plan import QUEUES, TOPICS, all_keys, body_hash, message, parse_header
from mqstore.client.admin import (
    INDEX_RESULTS_MAX,
    Admin,
    ClusterStatus,
    CqReplicaStatus,
    IndexReplicaStatus,
)
from mqstore.client.compression import decompress
from mqstore.client.connection import Connection
from mqstore.client.consumer import Consumer, Offset
from mqstore.client.errors import ClientError, DataLoss
from mqstore.client.message import Message
from mqstore.formats.properties import KEYS, UNIQ_KEY, split_keys
from mqstore.formats.record_columns import split_records
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1.commitlog_pb2_grpc import CommitLogStub
from mqstore.storage.logreader import BadEntry, LogDir, RecordEntry

CATCH_UP_TIMEOUT_S = 120.0
CATCH_UP_POLL_S = 0.2
READ_BATCH = 512  # offsets per commit-log Read (1 KiB average records: ~0.5 MiB answers)
PULL_MESSAGES = 1_024  # cq_svc's pull_messages_max
# Every Nth message of a producer (by n) that the log holds is looked up by its unique id.
UNIQ_SAMPLE_EVERY = 53
UNIQ_SAMPLE_MAX = 400
# The tail check looks back through a queue outside the region this many units a pull, and at
# most TAIL_BACK_PAGES_MAX pulls (the units appended since E come first: a few seconds' worth).
TAIL_BACK_UNITS = 64
TAIL_BACK_PAGES_MAX = 64
INDEX_TIME_RESOLUTION_MS = 1_000  # the index keeps whole seconds: ask a second earlier


@dataclass
class Problems:
    """What failed, with examples; corrupt reads and lost messages counted once each."""

    items: list[str] = field(default_factory=list)
    corrupt_reads: int = 0
    lost: set[tuple[int, int]] = field(default_factory=set)  # (producer, n) not readable

    def add(self, text: str) -> None:
        if text not in self.items:
            self.items.append(text)

    def corrupt(self, text: str) -> None:
        self.corrupt_reads += 1
        if self.corrupt_reads <= EXAMPLES_MAX:
            self.items.append(f"corrupt read: {text}")

    def lose(self, producer: int, n: int, text: str) -> None:
        if (producer, n) not in self.lost and len(self.lost) < EXAMPLES_MAX:
            self.items.append(f"lost: {text}")
        self.lost.add((producer, n))


# -- waiting for the followers -------------------------------------------------------------------


def wait_caught_up(admin: Admin, timeout_s: float = CATCH_UP_TIMEOUT_S) -> ClusterStatus:
    """Every cq and index replica has applied the whole log."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            status = admin.status()
        except ClientError as err:
            last = str(err)
        else:
            end = status.commitlog.max_offset
            replicas: list[CqReplicaStatus | IndexReplicaStatus] = [*status.cq, *status.index]
            if all(r.reachable and r.applied_offset >= end for r in replicas):
                return status
            last = ", ".join(
                f"{r.address} applied {r.applied_offset}/{end}"
                if r.reachable
                else f"{r.address} unreachable"
                for r in replicas
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"followers did not catch up within {timeout_s:.0f} s: {last}")
        time.sleep(CATCH_UP_POLL_S)


# -- the log ---------------------------------------------------------------------------------------


class _Queue:
    """One queue as the log holds it, in log order."""

    def __init__(self) -> None:
        self.queue_offsets = array("q")
        self.commit_log_offsets = array("q")
        self.body_hashes = array("Q")


@dataclass
class LogView:
    queues: dict[tuple[str, int], _Queue] = field(default_factory=dict)
    keys: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    uniq_sample: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    records: int = 0
    bad_ranges: list[str] = field(default_factory=list)


def stored_records(
    commitlog_dir: str, view: LogView, *, start: int | None = None, end: int | None = None
) -> Iterator[StoredRecord]:
    """Every record of the log's files in [start, end) (default: all), decompressed; bad
    ranges go to view.bad_ranges."""
    log = LogDir(commitlog_dir)
    entries = log.scan(start, check_crc=True)
    try:
        for entry in entries:
            if end is not None and entry.offset >= end:
                return
            if isinstance(entry, BadEntry):
                view.bad_ranges.append(
                    f"bad bytes at {entry.offset} (next record at {entry.next_offset}): "
                    f"{entry.reason}"
                )
            elif isinstance(entry, RecordEntry):
                r = entry.record
                props = r.properties_dict()
                try:
                    body = decompress(r.body, r.sys_flag)
                except DataLoss:
                    body = r.body  # the audit reports it as bytes other than those sent
                yield StoredRecord(
                    commit_log_offset=entry.offset,
                    topic=r.topic,
                    queue_id=r.queue_id,
                    queue_offset=r.queue_offset,
                    body=body,
                    keys=tuple(split_keys(props.get(KEYS))),
                    uniq_key=props.get(UNIQ_KEY, ""),
                    store_timestamp_ms=r.store_timestamp_ms,
                )
    finally:
        entries.close()


def read_log(commitlog_dir: str, audit: Audit) -> LogView:
    view = LogView()
    for rec in stored_records(commitlog_dir, view):
        view.records += 1
        audit.add(rec)
        q = view.queues.setdefault((rec.topic, rec.queue_id), _Queue())
        q.queue_offsets.append(rec.queue_offset)
        q.commit_log_offsets.append(rec.commit_log_offset)
        q.body_hashes.append(body_hash(rec.body))
        for key in rec.keys:
            view.keys.setdefault((rec.topic, key), set()).add(rec.commit_log_offset)
        ids = parse_header(rec.body)
        if (
            ids is not None
            and ids[1] % UNIQ_SAMPLE_EVERY == 0
            and len(view.uniq_sample) < UNIQ_SAMPLE_MAX
        ):
            view.uniq_sample.setdefault((rec.topic, rec.uniq_key), []).append(rec.commit_log_offset)
    return view


def check_queue_offsets_dense(view: LogView, problems: Problems) -> None:
    """Each queue's offsets in the log are 0, 1, 2, ... in log order: no gap, none reused."""
    for (topic, q), queue in sorted(view.queues.items()):
        offsets = queue.queue_offsets
        if list(offsets) != list(range(len(offsets))):
            first = next(i for i, o in enumerate(offsets) if o != i)
            problems.add(
                f"log: queue offsets of {topic}/{q} are not dense: position {first} holds "
                f"{offsets[first]}"
            )


# -- reads through the services --------------------------------------------------------------------


def check_reads_by_offset(conn: Connection, oracle: Oracle, problems: Problems) -> int:
    """Every acknowledged append read back at its offset; returns how many were read."""
    stub = conn.commitlog()
    batch: list[Ack] = []
    read = 0
    for ack in oracle.acks():
        batch.append(ack)
        if len(batch) == READ_BATCH:
            read += read_batch(conn, stub, batch, oracle.salt, problems)
            batch = []
    if batch:
        read += read_batch(conn, stub, batch, oracle.salt, problems)
    return read


def _compare(ack: Ack, m: Message, salt: int, problems: Problems, what: str) -> None:
    """A record read back for `ack`: the acknowledged message; another message, intact (the
    ack named an offset that holds someone else's: lost); or bytes nobody sent (corrupt)."""
    got = (m.topic, m.queue_id, m.queue_offset, m.commit_log_offset, body_hash(m.body))
    want = (ack.topic, ack.queue_id, ack.queue_offset, ack.commit_log_offset, ack.body_hash)
    if got == want:
        return
    ids = parse_header(m.body)
    if ids is not None and ids != (ack.producer, ack.n) and _is_as_sent(m, salt):
        problems.lose(
            ack.producer, ack.n, f"{what} holds producer {ids[0]} message {ids[1]} instead"
        )
    else:
        problems.corrupt(f"{what}: read {got[:4]}, acknowledged as {want[:4]}")


def _is_as_sent(m: Message, salt: int) -> bool:
    ids = parse_header(m.body)
    if ids is None:
        return False
    spec = message(salt, *ids)
    return (m.body, m.topic, m.queue_id) == (spec.body, spec.topic, spec.queue_id)


def read_batch(
    conn: Connection, stub: CommitLogStub, batch: list[Ack], salt: int, problems: Problems
) -> int:
    request = cl_pb.ReadRequest(
        offsets=[a.commit_log_offset for a in batch], sizes=[a.size for a in batch]
    )
    response = conn.call(stub.Read, request, name="CommitLog/Read")
    raws = split_records(response.records_blob, response.record_sizes)
    for ack, raw, status in zip(batch, raws, response.statuses, strict=True):
        what = f"producer {ack.producer} message {ack.n} at {ack.commit_log_offset}"
        if status != cl_pb.READ_OK:
            problems.lose(ack.producer, ack.n, f"{what}: Read says {cl_pb.ReadStatus.Name(status)}")
            continue
        try:
            m = Message.from_record(raw)
        except DataLoss as err:
            problems.corrupt(f"{what}: Read served a record failing its checks: {err}")
            continue
        _compare(ack, m, salt, problems, f"Read of {what}")
    return len(batch)


def check_msg_ids(admin: Admin, oracle: Oracle, problems: Problems) -> int:
    checked = 0
    for (p, n), msg_id in sorted(oracle.msg_ids.items()):
        ack = oracle.ack(p, n)
        if ack is None:
            continue  # forfeited by a torn cycle
        checked += 1
        what = f"producer {p} message {n} (msg id {msg_id})"
        try:
            m = admin.get_message(msg_id)
        except DataLoss as err:
            problems.lose(p, n, f"{what}: GetMessage says {err}")
            continue
        except ClientError as err:
            problems.lose(p, n, f"{what}: GetMessage failed: {err}")
            continue
        _compare(ack, m, oracle.salt, problems, f"GetMessage of {what}")
    return checked


def check_queues(conn: Connection, view: LogView, problems: Problems) -> int:
    """Every queue of cq_svc against the log; returns the messages pulled."""
    admin = Admin(conn)
    pulled = 0
    for topic in TOPICS:
        infos = {i.queue_id: i for i in admin.queues(topic)}
        logged = {q for (t, q) in view.queues if t == topic}
        consumer = Consumer(conn, topic, queues=range(QUEUES), start=Offset(0))
        for q in sorted(set(infos) | logged):
            want = view.queues.get((topic, q), _Queue())
            info = infos.get(q)
            if info is None or info.min_offset != 0 or info.max_offset != len(want.queue_offsets):
                problems.add(
                    f"queues: {topic}/{q} spans {info and (info.min_offset, info.max_offset)} "
                    f"in cq_svc, [0, {len(want.queue_offsets)}) in the log"
                )
            got = _pull_all(consumer, q, problems)
            pulled += len(got)
            expected = list(
                zip(want.queue_offsets, want.commit_log_offsets, want.body_hashes, strict=True)
            )
            if got != expected:
                diff = next(
                    (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                    min(len(got), len(expected)),
                )
                problems.add(
                    f"queues: {topic}/{q} pulled {len(got)} messages, the log holds "
                    f"{len(expected)}; first difference at position {diff}: "
                    f"{got[diff] if diff < len(got) else None} vs "
                    f"{expected[diff] if diff < len(expected) else None}"
                )
        consumer.close()
    return pulled


def _pull_all(consumer: Consumer, q: int, problems: Problems) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    offset = 0
    while True:
        try:
            res = consumer.pull(q, offset, max_messages=PULL_MESSAGES, long_poll_ms=0)
        except DataLoss as err:
            problems.corrupt(f"pull of {consumer.topic}/{q} at {offset}: {err}")
            return out
        for bad in res.bad_records:  # a record the store refuses: the pull steps over it
            problems.corrupt(f"pull of {consumer.topic}/{q} at {offset}: {bad}")
        if res.status != "FOUND" or not (res.messages or res.bad_records):
            return out
        out.extend((m.queue_offset, m.commit_log_offset, body_hash(m.body)) for m in res.messages)
        offset = res.next_offset


def check_followers(followers: list[Follower], view: LogView, problems: Problems) -> None:
    """What each consumer was handed during the run, against the final log."""
    for f in followers:
        for q, seen in sorted(f.seen.items()):
            logged = view.queues.get((f.topic, q), _Queue()).commit_log_offsets
            if list(seen) != list(logged):
                diff = next(
                    (i for i, (a, b) in enumerate(zip(seen, logged, strict=False)) if a != b),
                    min(len(seen), len(logged)),
                )
                problems.add(
                    f"consumer: {f.topic}/{q} handed out {len(seen)} messages, the log holds "
                    f"{len(logged)}; first difference at queue offset {diff}"
                )


def check_index(
    admin: Admin, key_sample: tuple[str, ...], salt: int, view: LogView, problems: Problems
) -> tuple[int, int]:
    """Sampled keys and unique ids against the log; returns (keys, uniq ids) checked."""
    keys = 0
    for topic in TOPICS:
        for key in key_sample:
            keys += 1
            want = view.keys.get((topic, key), set())
            try:
                found = list(admin.iter_key(topic, key))
            except ClientError as err:
                problems.add(f"index: key {topic}/{key}: {err}")
                continue
            for m in found:
                _check_body(m, salt, problems, f"index key {topic}/{key}")
            got = [m.commit_log_offset for m in found]
            if len(got) != len(set(got)) or set(got) != want:
                problems.add(
                    f"index: key {topic}/{key} finds {len(got)} records, the log holds "
                    f"{len(want)} ({len(set(got) - want)} not in the log, "
                    f"{len(want - set(got))} missing)"
                )
    for (topic, uniq), offsets in sorted(view.uniq_sample.items()):
        try:
            found = admin.query_by_uniq_key(topic, uniq)
        except ClientError as err:
            problems.add(f"index: uniq key {topic}/{uniq}: {err}")
            continue
        for m in found:
            _check_body(m, salt, problems, f"index uniq key {topic}/{uniq}")
        got = sorted(m.commit_log_offset for m in found)
        if got != sorted(offsets):
            problems.add(f"index: uniq key {topic}/{uniq} finds {got}, the log holds {offsets}")
    return keys, len(view.uniq_sample)


def _check_body(m: Message, salt: int, problems: Problems, where: str) -> None:
    if not _is_as_sent(m, salt):
        problems.corrupt(f"{where}: offset {m.commit_log_offset} has a body that was not sent")


# -- after a torn-tail cycle: the region since the cut against the followers -------------------


@dataclass
class TailCheck:
    """What one tail check compared: the log's records in [start, end)."""

    start: int
    end: int
    records: int = 0
    queues: int = 0
    keys: int = 0
    failures: int = 0  # problems it found (0: passed)
    seconds: float = 0.0  # reading the region and asking the followers


def wait_applied(admin: Admin, offset: int, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
    """Every cq and index replica has applied the log up to `offset` at least."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while True:
        try:
            status = admin.status()
        except ClientError as err:
            last = str(err)
        else:
            replicas: list[CqReplicaStatus | IndexReplicaStatus] = [*status.cq, *status.index]
            if all(r.reachable and r.applied_offset >= offset for r in replicas):
                return
            last = ", ".join(
                f"{r.address} applied {r.applied_offset}" if r.reachable else f"{r.address} down"
                for r in replicas
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"followers did not apply past {offset} in {timeout_s:.0f} s: {last}"
            )
        time.sleep(CATCH_UP_POLL_S)


def check_tail(
    conn: Connection,
    commitlog_dir: str,
    cut: int,
    end: int,
    salt: int,
    problems: Problems,
    where: str,
    *,
    from_segment_start: bool = True,
    keys: Sequence[str] | None = None,
    queues: Collection[tuple[str, int]] | None = None,
) -> TailCheck:
    """The log's records from the start of the segment holding `cut` to `end` (or from `cut`
    itself, a record boundary, unless `from_segment_start`), against cq_svc and index_svc (both
    must have applied past `end`: see wait_applied). The index is asked for `keys` (default:
    every key of the run), cq_svc for `queues` (topic, queue id; default: every queue)."""
    start = cut
    if from_segment_start:
        log = LogDir(commitlog_dir)
        start = max((s.start_offset for s in log.segments if s.start_offset <= cut), default=cut)
    started = time.monotonic()
    result = TailCheck(start, end)
    corrupt_before = problems.corrupt_reads

    def fail(text: str) -> None:
        result.failures += 1
        problems.add(f"{where}: {text}")

    view = LogView()
    region: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    keyed: dict[tuple[str, str], set[int]] = {}
    oldest_ms, newest_ms = 1 << 62, 0
    for rec in stored_records(commitlog_dir, view, start=start, end=end):
        result.records += 1
        region.setdefault((rec.topic, rec.queue_id), []).append(
            (rec.queue_offset, rec.commit_log_offset, body_hash(rec.body))
        )
        for key in rec.keys:
            keyed.setdefault((rec.topic, key), set()).add(rec.commit_log_offset)
        oldest_ms = min(oldest_ms, rec.store_timestamp_ms)
        newest_ms = max(newest_ms, rec.store_timestamp_ms)
    for text in view.bad_ranges:
        fail(f"log: {text}")

    admin = Admin(conn)
    for topic in TOPICS:
        consumer = Consumer(conn, topic, queues=range(QUEUES), start=Offset(0))
        try:
            for q in range(QUEUES):
                if queues is not None and (topic, q) not in queues:
                    continue
                want = region.get((topic, q))
                if want is None:
                    _check_no_units_in(admin, consumer, q, start, end, fail)
                    continue
                result.queues += 1
                _check_queue_region(consumer, q, want, start, end, fail)
        finally:
            consumer.close()

    # The region's store times, a second wider each way (the index keeps whole seconds): the
    # load goes on meanwhile, and what it adds after E is not asked for.
    begin_ms = max(0, oldest_ms - INDEX_TIME_RESOLUTION_MS)
    end_ms = newest_ms + INDEX_TIME_RESOLUTION_MS
    for topic in TOPICS:
        for key in all_keys() if keys is None else keys:
            want_offsets = keyed.get((topic, key), set())
            try:
                found = admin.query_by_key(
                    topic, key, begin_ms=begin_ms, end_ms=end_ms, max_messages=INDEX_RESULTS_MAX
                )
                if len(found) >= INDEX_RESULTS_MAX:  # more than one answer holds: page
                    found = list(admin.iter_key(topic, key, begin_ms=begin_ms, end_ms=end_ms))
            except ClientError as err:
                fail(f"index: key {topic}/{key}: {err}")
                continue
            result.keys += bool(want_offsets)
            got = [m.commit_log_offset for m in found if start <= m.commit_log_offset < end]
            for m in found:
                if start <= m.commit_log_offset < end and not _is_as_sent(m, salt):
                    problems.corrupt(f"{where}: index key {topic}/{key} at {m.commit_log_offset}")
            if len(got) != len(set(got)) or set(got) != want_offsets:
                fail(
                    f"index: key {topic}/{key} finds {len(got)} records in [{start}, {end}), "
                    f"the log holds {len(want_offsets)} ({len(set(got) - want_offsets)} not in "
                    f"the log, {len(want_offsets - set(got))} missing)"
                )
    result.failures += problems.corrupt_reads - corrupt_before
    result.seconds = time.monotonic() - started
    return result


def _pull_below(
    consumer: Consumer, q: int, offset: int, end: int, fail: Callable[[str], None]
) -> list[tuple[int, int, int]] | None:
    """The queue's units from `offset` on, as (queue offset, log offset, body hash), up to the
    first whose record lies at or past `end`; None when a pull failed."""
    out: list[tuple[int, int, int]] = []
    while True:
        try:
            res = consumer.pull(q, offset, max_messages=PULL_MESSAGES, long_poll_ms=0)
        except ClientError as err:
            fail(f"queues: pull of {consumer.topic}/{q} at {offset}: {err}")
            return None
        if res.status != "FOUND" or not res.messages:
            return out
        for m in res.messages:
            if m.commit_log_offset >= end:
                return out
            out.append((m.queue_offset, m.commit_log_offset, body_hash(m.body)))
        offset = res.next_offset


def _check_queue_region(
    consumer: Consumer,
    q: int,
    want: list[tuple[int, int, int]],
    start: int,
    end: int,
    fail: Callable[[str], None],
) -> None:
    name = f"{consumer.topic}/{q}"
    first = want[0][0]
    got = _pull_below(consumer, q, max(first - 1, 0), end, fail)
    if got is None:
        return
    if first > 0:
        if not got or got[0][0] != first - 1 or got[0][1] >= start:
            fail(
                f"queues: {name}@{first - 1}, before the region's first unit, is "
                f"{got[0] if got else None} in cq_svc: not a record below {start}"
            )
            return
        got = got[1:]
    if got != want:
        diff = next(
            (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
            min(len(got), len(want)),
        )
        fail(
            f"queues: {name} holds {len(got)} units for [{start}, {end}) from queue offset "
            f"{first}, the log {len(want)}; first difference at position {diff}: "
            f"{got[diff] if diff < len(got) else None} vs "
            f"{want[diff] if diff < len(want) else None}"
        )


def _check_no_units_in(
    admin: Admin, consumer: Consumer, q: int, start: int, end: int, fail: Callable[[str], None]
) -> None:
    """A queue without records in [start, end): its newest units, back to the first below
    `start`, hold none there either."""
    name = f"{consumer.topic}/{q}"
    try:
        info = admin.queue(consumer.topic, q)
    except ClientError as err:
        fail(f"queues: {name}: {err}")
        return
    hi = info.max_offset
    for _ in range(TAIL_BACK_PAGES_MAX):
        lo = max(info.min_offset, hi - TAIL_BACK_UNITS)
        if lo >= hi:
            return
        try:
            res = consumer.pull(q, lo, max_messages=hi - lo, long_poll_ms=0)
        except ClientError as err:
            fail(f"queues: pull of {name} at {lo}: {err}")
            return
        inside = [m.queue_offset for m in res.messages if start <= m.commit_log_offset < end]
        if inside:
            fail(f"queues: {name} has units {inside[:5]} in [{start}, {end}), the log none")
            return
        if any(m.commit_log_offset < start for m in res.messages):
            return
        hi = lo
    fail(f"queues: {name}: no unit below {start} within {TAIL_BACK_PAGES_MAX} pulls back")
