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

Reads that return bytes other than what was sent are corrupt reads; acknowledged appends that
cannot be read at their offset are lost. Both are counted once per message however many
checks see them.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field

from chaos.load import Follower
from chaos.oracle import EXAMPLES_MAX, Ack, Audit, Oracle, StoredRecord
from chaos.plan import QUEUES, TOPICS, body_hash, message, parse_header
from mqstore.client.admin import Admin, ClusterStatus, CqReplicaStatus, IndexReplicaStatus
from mqstore.client.compression import decompress
from mqstore.client.connection import Connection
from mqstore.client.consumer import Consumer, Offset
from mqstore.client.errors import ClientError, DataLoss
from mqstore.client.message import Message
from mqstore.formats.properties import KEYS, UNIQ_KEY, split_keys
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


def stored_records(commitlog_dir: str, view: LogView) -> Iterator[StoredRecord]:
    """Every record of the log's files, decompressed; bad ranges go to view.bad_ranges."""
    log = LogDir(commitlog_dir)
    entries = log.scan(None, check_crc=True)
    try:
        for entry in entries:
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
            read += _read_batch(conn, stub, batch, oracle.salt, problems)
            batch = []
    if batch:
        read += _read_batch(conn, stub, batch, oracle.salt, problems)
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


def _read_batch(
    conn: Connection, stub: CommitLogStub, batch: list[Ack], salt: int, problems: Problems
) -> int:
    request = cl_pb.ReadRequest(
        offsets=[a.commit_log_offset for a in batch], sizes=[a.size for a in batch]
    )
    response = conn.call(stub.Read, request, name="CommitLog/Read")
    for ack, raw, status in zip(batch, response.records, response.statuses, strict=True):
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
    for (p, n), msg_id in sorted(oracle.msg_ids.items()):
        ack = oracle.ack(p, n)
        assert ack is not None
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
    return len(oracle.msg_ids)


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
