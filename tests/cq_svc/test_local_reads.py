"""Local reads (cq_svc/local_reads.py, mqstore/storage/segment_reads.py): a cq_svc given the
commit log's data dir (`commitlog_dir`) answers pulls from the segment files instead of a
commit-log Read, each record checked, while the directory holds the log it follows.

Two whole cq_svc (CqService) follow one real commitlog_svc process: `local` with
commitlog_dir=<the log's data dir> (and the default tail, which local reads leave unused),
`reads` without it and with tail_records_mib=0 (every pull reads the log). The tests check that
Pull, PullStream, Follow and Receive from `local` answer byte for byte what `reads` answers (and
what the log's Read holds), that mqstore_cq_local_reads_total counts a hit a record served and
the commit log served no Read for them (grpc_server_handled_total on its metrics port), for
queues interleaved in the log and spread over many segment files, asked for in any order; that
a directory that is not the followed log (empty, missing, another log's) turns the reads off;
and what `local` answers once a record's bytes are damaged after the append, once retention
deleted segments it had mapped, after the log restarted on a wiped data dir (with and before a
handshake), and while the log is down, always compared with `reads`. Tests that stop, damage,
expire or replace a log start one of their own."""

from __future__ import annotations

import os
import shutil
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from prometheus_client import REGISTRY

from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.logs import (
    EXPIRING_LOG_ARGS,
    EXPIRING_LOG_BYTES,
    EXPIRING_LOG_ENV,
    Stored,
    append,
    append_topics,
    applied,
    decode,
    log_read,
    segment_path,
    start_commitlog,
    wire,
)
from tests.cq_svc.support import WholeCq, rpc_error, wait_for

RPC_TIMEOUT_S = 30.0
LOG_FILE_BYTES = 1 << 20  # start_commitlog's segments
SMALL_SEGMENT_BYTES = 4096  # a log whose queues spread over many segment files
# RocketMQ writes a record whose topic is over 127 bytes in its V2 form (a 2-byte topic
# length); a retry topic's name is "%RETRY%" and its group's (up to 255 bytes in all).
LONG_TOPIC = "%RETRY%" + "g" * 130


class Cq(WholeCq):
    """A whole cq_svc; `local=True` gives it the data dir of the log it follows."""

    def __init__(
        self, data_dir: Path, log: ServiceProcess, *, local: bool = False, **overrides: Any
    ) -> None:
        if local:
            overrides.setdefault("commitlog_dir", log.data_dir)
        super().__init__(data_dir, log.target, **overrides)

    @property
    def active(self) -> bool:
        """Its local reads are on (the directory holds the log it follows)."""
        local = self.service.local
        return local is not None and local.active

    def receive(self, topic: str, **fields: Any) -> pb.ReceiveResponse:
        request = pb.ReceiveRequest(group="g", topic=topic, invisible_duration_ms=60_000, **fields)
        response: pb.ReceiveResponse = self.stub.Receive(request, timeout=RPC_TIMEOUT_S)
        return response

    def store_id(self) -> bytes:
        status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        return bytes(status.store_id)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path_factory.mktemp("local") / "log")
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def log_stub(log: ServiceProcess) -> Iterator[cl_grpc.CommitLogStub]:
    with make_channel(log.target) as channel:
        yield cl_grpc.CommitLogStub(channel)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[Cq]:
    # The default tail: local reads must leave it unused (tail_wanted() is False).
    cq = Cq(tmp_path_factory.mktemp("local") / "cq", log, local=True)
    yield cq
    cq.stop()


@pytest.fixture(scope="module")
def reads(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[Cq]:
    cq = Cq(tmp_path_factory.mktemp("reads") / "cq", log, tail_records_mib=0)
    yield cq
    cq.stop()


@pytest.fixture
def topic() -> str:
    return f"L{uuid.uuid4().hex[:12]}"


# -- what was counted --------------------------------------------------------------------------

RESULTS = ("hit", "miss", "failed_check")


def local_counts() -> dict[str, float]:
    return {
        result: REGISTRY.get_sample_value("mqstore_cq_local_reads_total", {"result": result}) or 0.0
        for result in RESULTS
    }


def tail_hits() -> float:
    return REGISTRY.get_sample_value("mqstore_cq_tail_records_total", {"result": "hit"}) or 0.0


def log_reads(process: ServiceProcess) -> float:
    """Reads the commit log completed (grpc_server_handled_total, every code), from its
    metrics port."""
    url = f"http://127.0.0.1:{process.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("grpc_server_handled_total{") and 'grpc_method="Read"' in line
    )


class Counted:
    """Local reads counted, and Reads the log served, since it was made (the log's count is
    taken only when `log` is given)."""

    def __init__(self, log: ServiceProcess | None = None) -> None:
        self.log = log
        self.before = local_counts()
        self.reads_before = log_reads(log) if log is not None else 0.0

    def __call__(self) -> dict[str, float]:
        after = local_counts()
        return {k: after[k] - self.before[k] for k in after}

    def log_reads(self) -> float:
        assert self.log is not None
        return log_reads(self.log) - self.reads_before


# -- helpers -----------------------------------------------------------------------------------


def follow_answers(cq: Cq, request: pb.FollowRequest) -> dict[int, bytes]:
    """Every answer of a Follow, by pull_index (the wire bytes of the last one of each)."""
    out = {}
    for message in cq.stub.Follow(request, timeout=RPC_TIMEOUT_S):
        for answer in message.answers:
            out[answer.pull_index] = answer.SerializeToString()
    return out


def flip_body_byte(log: ServiceProcess, victim: Stored, body: bytes) -> bytes:
    """Damage one byte of `victim`'s body in its segment file (the running log's mapping and
    every reader's see it); returns the record's bytes as they are now."""
    path = segment_path(log, victim.commit_log_offset)
    with open(path, "r+b") as f:
        at = victim.commit_log_offset % LOG_FILE_BYTES
        raw = os.pread(f.fileno(), victim.size, at)
        where = at + raw.index(body) + len(body) - 1
        os.pwrite(f.fileno(), bytes([raw[where - at] ^ 0x20]), where)
        return os.pread(f.fileno(), victim.size, at)


def has_store(cq: Cq, store_id: bytes) -> bool:
    return cq.store_id() == store_id


def at_tail(cq: Cq) -> bool:
    """A consumer waits at a queue's end of `cq` (a pull or Follow long-polling there)."""
    tail = cq.service.sources.tail
    return tail is not None and tail.waiting >= 1


Started = TypeVar("Started", Cq, ServiceProcess)


@pytest.fixture
def cleanup() -> Iterator[ExitStack]:
    """Stops what a test started, the last started first (the cqs before their log)."""
    with ExitStack() as stack:
        yield stack


def kept(stack: ExitStack, item: Started) -> Started:
    if isinstance(item, ServiceProcess):
        stack.callback(item.stop, timeout_s=15)
    else:
        stack.callback(item.stop)
    return item


# -- 1. served from the segment files, byte for byte what a Read serves -------------------------


def test_pulls_streams_follows_and_receives_are_read_from_the_segment_files(
    local: Cq, reads: Cq, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    assert local.active and reads.service.local is None
    stored = append(
        log_stub,
        topic,
        [b"m-%d" % i * (1 + i % 7) for i in range(24)],
        queue_ids=[i % 2 for i in range(24)],
        tags=["Aa", "BB", "", "C"] * 6,  # "Aa" and "BB" share a Java hash code
    )
    applied([local, reads], stored)
    tail_before = tail_hits()

    pulls: list[dict[str, Any]] = [
        {"queue_id": q, **fields}
        for q in (0, 1)
        for fields in (
            {},
            {"max_messages": 3},
            {"offset": 4, "max_messages": 5},
            {"tags": ["Aa"]},
        )
    ]
    counts = Counted(log)
    from_local = [local.pull(topic, f.pop("offset", 0), **f) for f in map(dict, pulls)]
    served = sum(len(r.queue_offsets) for r in from_local)
    # A tag-filtered pull looks at its candidates' records ("BB" rides with "Aa"): those are
    # read too, then refused by their TAGS property.
    looked = served + sum(
        1 for p in pulls if p.get("tags") for s in stored if s.queue_id == p["queue_id"]
        if s.tags == "BB"
    )  # fmt: skip
    assert counts() == {"hit": looked, "miss": 0, "failed_check": 0}
    assert counts.log_reads() == 0, "the commit log served a Read for records read locally"
    assert wire(from_local) == wire(
        [reads.pull(topic, f.pop("offset", 0), **f) for f in map(dict, pulls)]
    )
    assert [r.status for r in from_local].count(pb.FOUND) == len(pulls) - 1
    assert from_local[-1].status == pb.NO_MATCHED_MESSAGE  # queue 1 holds "BB", never "Aa"
    for p, response in zip(pulls, from_local, strict=True):
        mine = [s for s in stored if s.queue_id == p["queue_id"]]
        mine = [s for s in mine if s.queue_offset in set(response.queue_offsets)]
        assert records_of(response) == log_read(log_stub, mine)
        if p.get("tags"):
            assert {decode(raw).body for raw in records_of(response)} <= {
                s.body for s in stored if s.tags == "Aa"
            }

    stream = pb.PullStreamRequest(
        pull=pb.PullRequest(topic=topic, queue_id=1, max_messages=5),
        max_batches=10,
    )
    counts = Counted(log)
    streamed = list(local.stub.PullStream(stream, timeout=RPC_TIMEOUT_S))
    assert counts() == {"hit": 12, "miss": 0, "failed_check": 0}
    assert counts.log_reads() == 0
    assert [len(r.queue_offsets) for r in streamed] == [5, 5, 2]
    assert wire(streamed) == wire(list(reads.stub.PullStream(stream, timeout=RPC_TIMEOUT_S)))

    counts = Counted(log)
    received = [local.receive(topic, queue_id=0, max_messages=5), local.receive(topic, queue_id=0)]
    assert [list(r.queue_offsets) for r in received] == [[0, 1, 2, 3, 4], list(range(5, 12))]
    assert counts() == {"hit": 12, "miss": 0, "failed_check": 0}
    assert counts.log_reads() == 0
    assert wire(received) == wire(
        [reads.receive(topic, queue_id=0, max_messages=5), reads.receive(topic, queue_id=0)]
    )
    other = local.receive(topic, queue_id=1)
    assert wire([other]) == wire([reads.receive(topic, queue_id=1)])
    assert records_of(other) == log_read(log_stub, [s for s in stored if s.queue_id == 1])

    # A Follow of a queue nobody wrote to yet: it waits, a dispatch wakes it, and the records
    # it answers are read from the segment files the moment they are dispatched.
    fresh = topic + "f"
    follow = pb.FollowRequest(
        pulls=[pb.PullRequest(topic=fresh, queue_id=q) for q in range(2)],
        long_poll_ms=20_000,
        max_batches=2,
    )
    counts = Counted(log)
    call = local.stub.Follow(follow, timeout=RPC_TIMEOUT_S)
    assert wait_for(lambda: local.service.watch.waiting >= 1), "the follow never waited"
    later = append(log_stub, fresh, [b"f-%d" % i for i in range(6)], queue_ids=[0, 1] * 3)
    answers = [a for message in call for a in message.answers]
    assert counts() == {"hit": 6, "miss": 0, "failed_check": 0}
    assert counts.log_reads() == 0
    applied([reads], later)
    assert sorted(a.pull_index for a in answers) == [0, 1]
    for answer in answers:
        unary = pb.PullResponse()
        unary.CopyFrom(answer)
        unary.ClearField("pull_index")
        q = answer.pull_index
        expected = reads.pull(fresh, 0, queue_id=q)
        assert unary.SerializeToString() == expected.SerializeToString()
        assert records_of(answer) == log_read(log_stub, [s for s in later if s.queue_id == q])
    # The tail stayed out of it: frames brought no records.
    assert tail_hits() == tail_before and local.service.tail.nbytes == 0


# -- 2. several queues in one look, in any order ------------------------------------------------


def test_a_follow_round_of_interleaved_queues_reads_them_all_at_once(
    local: Cq, reads: Cq, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    other = topic + "b"
    stored: dict[str, list[Stored]] = {topic: [], other: []}
    for _ in range(3):  # the queues and topics interleave in the log, append after append
        for t, rows in append_topics(log_stub, [topic, other], per_topic=9, queues=3).items():
            stored[t] += rows
    applied([local, reads], *stored.values())
    # Pulls whose ranges are asked in no order of the log: the later topic first, queues
    # backwards, some from the middle of their queue.
    asks = [
        (other, 2, 0, 4),
        (topic, 1, 3, 32),
        (other, 0, 0, 32),
        (topic, 2, 0, 2),
        (topic, 0, 5, 32),
        (other, 1, 7, 32),
    ]
    follow = pb.FollowRequest(
        pulls=[
            pb.PullRequest(topic=t, queue_id=q, offset=o, max_messages=m) for t, q, o, m in asks
        ],
        long_poll_ms=0,
        max_batches=len(asks),  # one round: one look at all six queues, one answer each
    )
    counts = Counted(log)
    from_local = follow_answers(local, follow)
    looked = counts(), counts.log_reads()
    served = 0
    for i, (t, q, o, m) in enumerate(asks):
        answer = pb.PullResponse.FromString(from_local[i])
        mine = [s for s in stored[t] if s.queue_id == q][o : o + m]
        assert list(answer.queue_offsets) == [s.queue_offset for s in mine]
        assert records_of(answer) == log_read(log_stub, mine)
        served += len(mine)
    assert looked == ({"hit": served, "miss": 0, "failed_check": 0}, 0)
    reads_before = log_reads(log)
    assert from_local == follow_answers(reads, follow)
    assert log_reads(log) - reads_before == 1, "the round is one look (one Read for `reads`)"


def test_queues_spread_over_many_segments_are_read_in_one_look(
    tmp_path: Path, cleanup: ExitStack
) -> None:
    """4 KiB segments (each ends in a blank): every queue's records lie in several segment
    files, and one Follow round (and a PullStream) reads them across the files at once."""
    own = kept(cleanup, start_commitlog(tmp_path / "log", file_bytes=SMALL_SEGMENT_BYTES))
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, tail_records_mib=0)),
        kept(cleanup, Cq(tmp_path / "reads", own, tail_records_mib=0)),
    ]
    with_local, without = cqs
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        stored: dict[str, list[Stored]] = {"A": [], "B": []}
        for _ in range(16):
            for t, rows in append_topics(stub, ["A", "B"], per_topic=6, queues=3).items():
                stored[t] += rows
        applied(cqs, *stored.values())
        everything = stored["A"] + stored["B"]
        segments = {s.commit_log_offset // SMALL_SEGMENT_BYTES for s in everything}
        assert len(segments) >= 4
        assert len(os.listdir(Path(own.data_dir) / "commitlog")) == len(segments)
        keys = [(t, q) for t in ("B", "A") for q in (2, 0, 1)]
        follow = pb.FollowRequest(
            pulls=[pb.PullRequest(topic=t, queue_id=q, max_messages=64) for t, q in keys],
            long_poll_ms=0,
            max_batches=len(keys),
        )
        stream = pb.PullStreamRequest(
            pull=pb.PullRequest(topic="B", queue_id=1, max_messages=7), max_batches=10
        )
        counts = Counted(own)
        from_local = follow_answers(with_local, follow)
        streamed = list(with_local.stub.PullStream(stream, timeout=RPC_TIMEOUT_S))
        looked = counts(), counts.log_reads()
        streamed_count = sum(1 for s in stored["B"] if s.queue_id == 1)
        assert sum(len(r.queue_offsets) for r in streamed) == streamed_count
        hits = len(everything) + streamed_count
        assert looked == ({"hit": hits, "miss": 0, "failed_check": 0}, 0)
        assert from_local == follow_answers(without, follow)
        assert wire(streamed) == wire(list(without.stub.PullStream(stream, timeout=RPC_TIMEOUT_S)))
        for i, (t, q) in enumerate(keys):
            mine = [s for s in stored[t] if s.queue_id == q]
            assert len({s.commit_log_offset // SMALL_SEGMENT_BYTES for s in mine}) >= 4
            answer = pb.PullResponse.FromString(from_local[i])
            assert records_of(answer) == log_read(stub, mine)


def test_records_of_a_long_topic_are_read_locally_as_the_read_serves_them(
    local: Cq, reads: Cq, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub
) -> None:
    """A V2 record (topic over 127 bytes), which the column checks leave to read_record."""
    topic = f"{LONG_TOPIC}{uuid.uuid4().hex[:8]}"
    stored = append(log_stub, topic, [b"v2-%d" % i for i in range(3)])
    applied([local, reads], stored)
    counts = Counted(log)
    got = local.pull(topic, 0)
    assert (counts(), counts.log_reads()) == ({"hit": 3, "miss": 0, "failed_check": 0}, 0)
    assert wire([got]) == wire([reads.pull(topic, 0)])
    assert records_of(got) == log_read(log_stub, stored)


# -- 3. a directory that is not the log followed ------------------------------------------------


def test_a_directory_that_is_not_the_followed_log_is_never_read(
    tmp_path: Path, cleanup: ExitStack
) -> None:
    """An empty directory, a missing one, and the data dir of another commit log holding
    records of the same topic, queue, offsets and sizes (they would pass every record check)
    but other bodies: the store id at the handshake turns local reads off, and everything comes
    through the Read."""
    ours = kept(cleanup, start_commitlog(tmp_path / "ours"))
    theirs = kept(cleanup, start_commitlog(tmp_path / "theirs"))
    (tmp_path / "empty").mkdir()
    cqs = [
        kept(cleanup, Cq(tmp_path / "cq-empty", ours, commitlog_dir=str(tmp_path / "empty"))),
        kept(
            cleanup, Cq(tmp_path / "cq-missing", ours, commitlog_dir=str(tmp_path / "no-such-dir"))
        ),
        kept(cleanup, Cq(tmp_path / "cq-theirs", ours, commitlog_dir=theirs.data_dir)),
        kept(cleanup, Cq(tmp_path / "cq-reads", ours)),
    ]
    *others, plain = cqs
    for cq in others:
        assert cq.service.local is not None and not cq.active
    with make_channel(ours.target) as a, make_channel(theirs.target) as b:
        stub, their_stub = cl_grpc.CommitLogStub(a), cl_grpc.CommitLogStub(b)
        stored = append(stub, "W", [b"ours-%d" % i for i in range(6)], queue_ids=[0, 1] * 3)
        decoy = append(their_stub, "W", [b"them-%d" % i for i in range(6)], queue_ids=[0, 1] * 3)
        assert [(s.commit_log_offset, s.size) for s in decoy] == [
            (s.commit_log_offset, s.size) for s in stored
        ], "the decoy lies where our records lie"
        applied(cqs, stored)
        expected = [plain.pull("W", 0, queue_id=q) for q in (0, 1)]
        for cq in others:
            counts = Counted(ours)
            got = [cq.pull("W", 0, queue_id=q) for q in (0, 1)]
            received = cq.receive("W", queue_id=1)
            assert counts() == {"hit": 0, "miss": 0, "failed_check": 0}
            assert counts.log_reads() == 3
            assert wire(got) == wire(expected)
            assert [decode(r).body for g in got for r in records_of(g)] == [
                b"ours-0", b"ours-2", b"ours-4", b"ours-1", b"ours-3", b"ours-5"
            ]  # fmt: skip
            assert records_of(received) == log_read(stub, stored[1::2])


# -- 4. bytes damaged after the append ---------------------------------------------------------


def test_a_record_damaged_in_the_segment_fails_the_check_and_the_read_decides(
    tmp_path: Path,
    cleanup: ExitStack,
) -> None:
    own = kept(cleanup, start_commitlog(tmp_path / "log"))  # its own: the damage stays in it
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, tail_records_mib=0)),
        kept(cleanup, Cq(tmp_path / "reads", own, tail_records_mib=0)),
    ]
    with_local, without = cqs
    assert with_local.active
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        bodies = [b"body-%d" % i for i in range(5)]
        stored = append(stub, "D", bodies)
        applied(cqs, stored)
        counts = Counted(own)
        assert list(with_local.pull("D", 0).queue_offsets) == [0, 1, 2, 3, 4]  # mapped
        assert counts() == {"hit": 5, "miss": 0, "failed_check": 0}
        victim = stored[2]
        damaged = flip_body_byte(own, victim, bodies[2])
        read = stub.Read(
            cl_pb.ReadRequest(offsets=[victim.commit_log_offset], sizes=[victim.size]),
            timeout=RPC_TIMEOUT_S,
        )
        assert list(read.statuses) == [cl_pb.READ_CORRUPT]

        # All or nothing: the damaged record fails the check, the whole pull goes to the
        # Read, which serves what lies before it.
        counts = Counted(own)
        r = with_local.pull("D", 0)
        assert counts() == {"hit": 0, "miss": 0, "failed_check": 5}
        assert counts.log_reads() == 1
        assert (r.status, list(r.queue_offsets), r.next_begin_offset) == (pb.FOUND, [0, 1], 2)
        assert wire([r]) == wire([without.pull("D", 0)])
        assert records_of(r) == log_read(stub, stored[:2])

        # A pull whose first record is the damaged one: refused, as the Read refuses it.
        asks: list[dict[str, Any]] = [{}, {"max_messages": 1}]
        for fields in asks:
            counts = Counted(own)
            code, message, _ = rpc_error(partial(with_local.pull, "D", 2, **fields))
            assert counts() == {
                "hit": 0,
                "miss": 0,
                "failed_check": fields.get("max_messages", 3),
            }
            assert code == grpc.StatusCode.DATA_LOSS
            assert str(victim.commit_log_offset) in message
            assert rpc_error(partial(without.pull, "D", 2, **fields))[:2] == (code, message)
        # Receive: the same refusal, the record never handed out.
        counts = Counted(own)
        first = with_local.receive("D", max_messages=2)
        assert list(first.queue_offsets) == [0, 1]
        assert wire([first]) == wire([without.receive("D", max_messages=2)])
        code, message, _ = rpc_error(lambda: with_local.receive("D", max_messages=1))
        assert code == grpc.StatusCode.DATA_LOSS
        assert (code, message) == rpc_error(lambda: without.receive("D", max_messages=1))[:2]
        assert counts() == {"hit": 2, "miss": 0, "failed_check": 1}
        # Past it, the records are read locally again.
        counts = Counted(own)
        past = with_local.pull("D", 3)
        assert counts() == {"hit": 2, "miss": 0, "failed_check": 0}
        assert wire([past]) == wire([without.pull("D", 3)])
        for served in (r, first, past):
            assert damaged not in records_of(served), "the damaged bytes were served"


# -- 5. retention under a mapping ---------------------------------------------------------------


def test_segments_retention_deleted_are_not_served_from_a_stale_mapping(
    tmp_path: Path, cleanup: ExitStack
) -> None:
    """Both cqs probe the log's bounds rarely, so their queues still name the expired records
    when they are asked for: the local cq mapped those segments before they were deleted, and
    must not serve them from its mapping (the file is gone), as the Read no longer does."""
    own = kept(
        cleanup,
        start_commitlog(
            tmp_path / "log",
            *EXPIRING_LOG_ARGS,
            env=EXPIRING_LOG_ENV,
            file_bytes=EXPIRING_LOG_BYTES,
        ),
    )
    slow: dict[str, Any] = {"tail_records_mib": 0, "log_probe_interval_ms": 600_000}
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, **slow)),
        kept(cleanup, Cq(tmp_path / "reads", own, **slow)),
    ]
    with_local, without = cqs
    assert with_local.active
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)

        def log_min() -> int:
            return int(stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).min_offset)

        stored: list[Stored] = []
        mapped_hits = 0.0
        # Appends into the newest segment, each pulled locally at once (the newest segment
        # is never deleted, so this maps it), until six segments were mapped so.
        while len({s.commit_log_offset // EXPIRING_LOG_BYTES for s in stored}) < 6:
            first = len(stored)
            batch = append(stub, "X", [b"x-%03d" % i for i in range(first, first + 8)])
            stored += batch
            applied(cqs, batch)
            counts = Counted()
            got = with_local.pull("X", batch[0].queue_offset)
            if counts()["hit"]:
                mapped_hits += counts()["hit"]
                # (a pull stops at the end of a consume-queue file: 50 units here)
                mine = [s for s in batch if s.queue_offset in got.queue_offsets]
                assert records_of(got) == log_read(stub, mine)
        assert mapped_hits >= len(stored) // 2, "the segments were never read locally"
        last_start = stored[-1].commit_log_offset // EXPIRING_LOG_BYTES * EXPIRING_LOG_BYTES
        assert wait_for(lambda: log_min() == last_start), "retention did not run"
        assert not os.path.exists(segment_path(own, 0, EXPIRING_LOG_BYTES))
        gone = [s for s in stored if s.commit_log_offset < last_start]
        left = [s for s in stored if s.commit_log_offset >= last_start]
        assert left and len(gone) > len(stored) // 2

        counts = Counted(own)
        # From each gone record's queue offset (whatever lies past it), from the start, and
        # from the first record left.
        asks = [(s.queue_offset, 8) for s in gone[::5]] + [(0, 200), (left[0].queue_offset, 8)]
        from_local = [with_local.pull("X", o, max_messages=m) for o, m in asks]
        served = from_local[-1].queue_offsets
        assert counts()["hit"] == len(served) > 0, "only the records still in the log"
        assert counts()["failed_check"] == 0
        assert wire(from_local) == wire([without.pull("X", o, max_messages=m) for o, m in asks])
        last_gone = gone[-1].queue_offset
        for (o, m), r in zip(asks, from_local, strict=True):
            if o + m <= last_gone + 1:  # nothing but gone records
                assert (r.status, list(r.queue_offsets)) == (pb.MESSAGE_WAS_REMOVING, [])
            assert min(r.queue_offsets, default=last_gone + 1) > last_gone
        assert from_local[-1].status == pb.FOUND
        assert records_of(from_local[-1]) == log_read(stub, left[: len(served)])
        # Receive steps over the removed records the same way.
        assert wire([with_local.receive("X", max_messages=200)]) == wire(
            [without.receive("X", max_messages=200)]
        )

        # Once they see the new minimum, the queues drop what lies below it: both answer
        # OFFSET_TOO_SMALL and the corrected offsets alike.
        for cq in cqs:
            assert cq.service.probe.probe_once()
        assert with_local.service.local is not None
        assert with_local.service.local.log.mapped <= 1
        asks = [(0, 8), (gone[-1].queue_offset, 8), (left[0].queue_offset, 8)]
        from_local = [with_local.pull("X", o, max_messages=m) for o, m in asks]
        assert from_local[0].status == pb.OFFSET_TOO_SMALL
        assert from_local[0].min_offset == left[0].queue_offset
        assert wire(from_local) == wire([without.pull("X", o, max_messages=m) for o, m in asks])


# -- 6. a log replaced under the same directory ------------------------------------------------


def test_after_the_log_restarts_on_a_wiped_dir_only_the_new_records_are_served(
    tmp_path: Path,
    cleanup: ExitStack,
) -> None:
    own = kept(cleanup, start_commitlog(tmp_path / "log"))
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, tail_records_mib=0)),
        kept(cleanup, Cq(tmp_path / "reads", own, tail_records_mib=0)),
    ]
    with_local, without = cqs
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        first_id = bytes(stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).store_id)
        old = append(stub, "R", [b"old-%d" % i for i in range(6)])
        applied(cqs, old)
        counts = Counted()
        assert records_of(with_local.pull("R", 0)) == log_read(stub, old)  # mapped
        assert counts()["hit"] == 6
    own.pin_ports()  # the cqs name its target
    assert own.stop(timeout_s=15) == 0
    for name in os.listdir(own.data_dir):  # wiped: a new store at the same place
        path = os.path.join(own.data_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    own.start()
    own.wait_listening()
    with make_channel(own.target) as channel:
        # The cqs in this process kept reconnecting to the stopped port, and gRPC shares their
        # connection (in its reconnect backoff) with this channel: wait until it connects.
        grpc.channel_ready_future(channel).result(timeout=30)
        stub = cl_grpc.CommitLogStub(channel)
        new_id = bytes(stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).store_id)
        assert new_id != first_id
        for cq in cqs:
            assert wait_for(partial(has_store, cq, new_id), 30), "no new handshake"
        assert with_local.active, "the new log's store.meta matched the new handshake"
        # The same topic, queue, offsets and sizes as the old records: only the bodies tell.
        new = append(stub, "R", [b"new-%d" % i for i in range(6)])
        assert [(s.commit_log_offset, s.size) for s in new] == [
            (s.commit_log_offset, s.size) for s in old
        ]
        applied(cqs, new)
        counts = Counted(own)
        got = [with_local.pull("R", 0), with_local.pull("R", 2)]
        assert counts() == {"hit": 10, "miss": 0, "failed_check": 0}
        assert counts.log_reads() == 0
        assert wire(got) == wire([without.pull("R", 0), without.pull("R", 2)])
        assert [decode(r).body for r in records_of(got[0])] == [s.body for s in new]
        assert records_of(got[0]) == log_read(stub, new)


def test_a_log_replaced_before_the_handshake_is_never_served_as_the_old_one(
    tmp_path: Path,
    cleanup: ExitStack,
) -> None:
    """The log's directory wiped and a new log started in it where the cqs cannot reach it
    (other ports): no handshake comes, so the directory is still trusted, but every pull looks
    at the files as they are now: the old segments are gone (the mappings of them must not
    answer), the new log's first segment holds another record and zeros where the old records
    were, and its files end before the old second segment. Nothing is served locally; the
    pulls go to the Read, which the log's old address refuses, as it does for the cq that
    always reads."""
    own = kept(cleanup, start_commitlog(tmp_path / "log"))
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, tail_records_mib=0)),
        kept(cleanup, Cq(tmp_path / "reads", own, tail_records_mib=0)),
    ]
    with_local, without = cqs
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        stored = []
        for k in range(3):  # ~1.2 MB: the queue lies in the first two 1 MiB segments
            stored += append(stub, "P", [bytes([65 + k]) * 4_000] * 100)
        applied(cqs, stored)
    in_second = [s.queue_offset for s in stored if s.commit_log_offset >= LOG_FILE_BYTES]
    asks = [0, 120, in_second[0], in_second[-4], 0, in_second[0]]  # each segment twice
    counts = Counted()
    before = [with_local.pull("P", offset, max_messages=4) for offset in asks]
    assert counts() == {"hit": 4 * len(asks), "miss": 0, "failed_check": 0}  # both mapped
    assert wire(before) == wire([without.pull("P", o, max_messages=4) for o in asks])
    old_target = own.target
    assert own.stop(timeout_s=15) == 0
    shutil.rmtree(Path(own.data_dir) / "commitlog")
    os.unlink(Path(own.data_dir) / "store.meta")
    own.start()  # new ports: the cqs never reach it
    own.wait_listening()
    while own.target == old_target:  # the kernel gave the old port again (rare): not that one
        own.stop(timeout_s=15)
        own.start()
        own.wait_listening()
    with make_channel(own.target) as channel:  # its first segment, at the old one's place
        append(cl_grpc.CommitLogStub(channel), "Q", [b"new"])
    assert segment_path(own, 0).exists()
    assert with_local.active, "no handshake came: the directory is still trusted"
    # Each segment once, the second one twice: once through the listing made before, once
    # through the new one (the files end before it).
    counts = Counted()
    for offset in (0, in_second[0], in_second[0]):
        code, _, _ = rpc_error(partial(with_local.pull, "P", offset, max_messages=4))
        assert code == grpc.StatusCode.UNAVAILABLE
    assert rpc_error(partial(without.pull, "P", 0, max_messages=4))[0] == code
    looked = counts()
    assert looked["hit"] == 0, "records served from a log that is gone"
    assert looked["miss"] + looked["failed_check"] == 12


# -- 7. the log down -------------------------------------------------------------------------------


def test_while_the_log_is_down_the_segment_files_are_still_served(
    tmp_path: Path, cleanup: ExitStack
) -> None:
    """The design: a stopped commit log leaves its segment files whole, and the local cq keeps
    answering from them what its queues name (until the next handshake checks the directory
    again), each record checked as always; a cq that reads the log answers UNAVAILABLE."""
    own = kept(cleanup, start_commitlog(tmp_path / "log"))
    cqs = [
        kept(cleanup, Cq(tmp_path / "local", own, local=True, tail_records_mib=0)),
        kept(cleanup, Cq(tmp_path / "reads", own, tail_records_mib=0)),
    ]
    with_local, without = cqs
    with make_channel(own.target) as channel:
        stub = cl_grpc.CommitLogStub(channel)
        stored = append(stub, "S", [b"s-%d" % i for i in range(6)], queue_ids=[0, 1] * 3)
        applied(cqs, stored)
        as_written = log_read(stub, stored)
        up = [with_local.pull("S", 0, queue_id=q) for q in (0, 1)]
    assert own.stop(timeout_s=15) == 0
    counts = Counted()
    down = [with_local.pull("S", 0, queue_id=q) for q in (0, 1)]
    received = with_local.receive("S", queue_id=1)
    assert counts() == {"hit": 9, "miss": 0, "failed_check": 0}
    assert wire(down) == wire(up)
    assert records_of(down[0]) + records_of(down[1]) == as_written[0::2] + as_written[1::2]
    assert records_of(received) == as_written[1::2]
    for call in (lambda: without.pull("S", 0), lambda: without.receive("S", queue_id=1)):
        assert rpc_error(call)[0] == grpc.StatusCode.UNAVAILABLE


# -- 8. the frames bring no records ------------------------------------------------------------


def test_with_local_reads_the_frames_never_bring_records(
    tmp_path: Path,
    cleanup: ExitStack,
    local: Cq,
    log: ServiceProcess,
    log_stub: cl_grpc.CommitLogStub,
    topic: str,
) -> None:
    """A consumer long-polling at the tail would ask the log for records in the frames (the
    tail); with local reads on it does not (a control cq whose directory is not the log's
    does)."""
    control = kept(cleanup, Cq(tmp_path / "control", log, commitlog_dir=str(tmp_path)))
    assert local.active and not control.active
    assert local.service.tail.enabled and control.service.tail.enabled
    waiting = [
        threading.Thread(target=lambda cq=cq: cq.pull(topic, 0, long_poll_ms=3_000))
        for cq in (local, control)
    ]
    for thread in waiting:
        thread.start()
    try:
        for cq in (local, control):
            assert wait_for(partial(at_tail, cq), 10)
        assert control.service.sources.tail_wanted()
        assert wait_for(lambda: control.service.subscriber.records_included, 10)
        assert not local.service.sources.tail_wanted()
        assert not local.service.subscriber.records_included
        stored = append(log_stub, topic, [b"w-%d" % i for i in range(4)])
    finally:
        for thread in waiting:
            thread.join()
    applied([local, control], stored)
    assert control.service.tail.nbytes > 0, "the control's frames brought the records"
    assert local.service.tail.nbytes == 0
    assert not local.service.sources.tail_wanted()
    assert not local.service.subscriber.records_included
    counts = Counted(log)
    assert records_of(local.pull(topic, 0)) == log_read(log_stub, stored)
    assert counts() == {"hit": 4, "miss": 0, "failed_check": 0}
