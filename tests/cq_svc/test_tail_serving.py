"""Tail records (cq_svc/tail_records.py): a cq_svc that subscribes with include_records holds
the records the dispatch frames bring and answers a pull of them without a commit-log Read.

Two whole cq_svc (CqService) follow one real commitlog_svc process: `tail` with the default
tail_records_mib, `reads` with 0 (every pull reads the log, as before). Each test writes its own
topic and checks that Pull, PullStream and Follow answer byte for byte what `reads` answers (and
what the log's Read holds), that mqstore_cq_tail_records_total counts hits when the tail served
and misses when it could not (records older than the tail, a tail smaller than the records, a
tail dropped at a handshake), that records below a moved log minimum are dropped, and what each
serves once a record's segment bytes are damaged after the append (the tail: the bytes as
written; the Read: a refusal) or while the log is down (the tail: what it holds; the Read:
UNAVAILABLE). Tests that restart or damage a log start one of their own.

A test waits for each append to be applied before the next, so that every append reaches the
cq as a frame of its own, from the log's held runs (one crossing an end-of-file blank is
scanned: it carries no records)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
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


class Cq(WholeCq):
    """A whole cq_svc whose frames bring records when it holds a tail (a consumer is made to
    wait at the tail first), and what its tail holds."""

    def __init__(self, data_dir: Path, log_target: str, **overrides: Any) -> None:
        super().__init__(data_dir, log_target, **overrides)
        if self.service.tail.enabled:
            self.want_records()

    def want_records(self) -> None:
        """A long poll at a queue's end (a consumer reading at the tail), then until the commit
        log was told to send the frames with their records (the next confirm round)."""
        self.pull("warm-up", 0, long_poll_ms=50)
        assert wait_for(lambda: self.service.subscriber.records_included, 10), "no records asked"

    @property
    def tail_bytes(self) -> int:
        return self.service.tail.nbytes

    def holds(self, stored: Sequence[Stored]) -> bool:
        """Every one of these records is in the tail (a lookup, as a pull does it)."""
        offsets = np.array([s.commit_log_offset for s in stored], dtype=np.int64)
        sizes = np.array([s.size for s in stored], dtype=np.int64)
        return self.service.tail.lookup(offsets, sizes) is not None


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path_factory.mktemp("tail") / "log")
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def log_stub(log: ServiceProcess) -> Iterator[cl_grpc.CommitLogStub]:
    with make_channel(log.target) as channel:
        yield cl_grpc.CommitLogStub(channel)


@pytest.fixture(scope="module")
def tail(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[Cq]:
    cq = Cq(tmp_path_factory.mktemp("tail") / "cq", log.target)
    yield cq
    cq.stop()


@pytest.fixture(scope="module")
def reads(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[Cq]:
    cq = Cq(tmp_path_factory.mktemp("reads") / "cq", log.target, tail_records_mib=0)
    yield cq
    cq.stop()


@pytest.fixture(autouse=True)
def reading(request: pytest.FixtureRequest) -> None:
    """Consumers are reading `tail` (its frames bring records) when a test starts."""
    if "tail" in request.fixturenames:
        request.getfixturevalue("tail").want_records()


@pytest.fixture
def topic() -> str:
    return f"T{uuid.uuid4().hex[:12]}"


def counted() -> dict[str, float]:
    return {
        result: REGISTRY.get_sample_value("mqstore_cq_tail_records_total", {"result": result})
        or 0.0
        for result in ("hit", "miss")
    }


class Counted:
    """The hits and misses counted since it was made."""

    def __init__(self) -> None:
        self.before = counted()

    def __call__(self) -> dict[str, float]:
        after = counted()
        return {k: after[k] - self.before[k] for k in after}


# -- served from the tail, byte for byte what a Read serves ----------------------------------


def test_fresh_pulls_are_served_from_the_tail_as_the_log_reads_them(
    tail: Cq, reads: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    assert tail.service.subscriber.records_included and tail.service.tail.enabled
    assert not reads.service.subscriber.records_included and not reads.service.tail.enabled
    other = topic + "b"
    stored: dict[str, list[Stored]] = {topic: [], other: []}
    for _ in range(3):  # three appends of two topics each, applied one by one
        got = append_topics(log_stub, [topic, other], per_topic=8, queues=3)
        for t, rows in got.items():
            stored[t] += rows
        applied([tail, reads], *got.values())
        assert tail.holds(got[topic] + got[other])
    assert reads.tail_bytes == 0
    pulls = [
        (t, q, fields)
        for t in (topic, other)
        for q in range(3)
        for fields in ({}, {"max_messages": 3})
    ]
    counts = Counted()
    from_tail = [tail.pull(t, 0, queue_id=q, **f) for t, q, f in pulls]
    served = sum(len(r.queue_offsets) for r in from_tail)
    assert counts() == {"hit": served, "miss": 0}
    counts = Counted()
    from_reads = [reads.pull(t, 0, queue_id=q, **f) for t, q, f in pulls]
    assert counts() == {"hit": 0, "miss": 0}, "a cq with tail_records_mib=0 never looks"
    assert wire(from_tail) == wire(from_reads)
    for (t, q, _), response in zip(pulls, from_tail, strict=True):
        assert response.status == pb.FOUND
        mine = [s for s in stored[t] if s.queue_id == q][: len(response.queue_offsets)]
        assert list(response.queue_offsets) == [s.queue_offset for s in mine]
        assert records_of(response) == log_read(log_stub, mine)
        assert [decode(raw).body for raw in records_of(response)] == [s.body for s in mine]


def test_tag_filtered_pulls_from_the_tail_keep_only_exact_tags(
    tail: Cq, reads: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    # "Aa" and "BB" share a Java hash code: the unit filter lets "BB" through, the record's
    # TAGS property (here from the tail's bytes) then refuses it.
    tags = ["Aa", "BB", "", "C", "Aa", "BB", "C", "Aa"]
    stored = append(log_stub, topic, [b"m-%d" % i for i in range(len(tags))], tags=tags)
    applied([tail, reads], stored)
    assert tail.holds(stored)
    asks: list[dict[str, Any]] = [
        {"offset": 0, "tags": ["Aa"]},
        {"offset": 0, "tags": ["C", "Aa"], "max_messages": 3},
        {"offset": 1, "tags": ["Aa"], "max_messages": 1},  # collisions only
        {"offset": 5, "tags": ["BB"], "max_messages": 1},
    ]
    counts = Counted()
    from_tail = [tail.pull(topic, **ask) for ask in asks]
    assert counts()["hit"] > 0 and counts()["miss"] == 0
    assert wire(from_tail) == wire([reads.pull(topic, **ask) for ask in asks])
    assert [list(r.queue_offsets) for r in from_tail] == [[0, 4, 7], [0, 3], [], [5]]
    assert from_tail[2].status == pb.NO_MATCHED_MESSAGE
    assert [decode(raw).body for raw in records_of(from_tail[0])] == [b"m-0", b"m-4", b"m-7"]


def test_pull_stream_and_follow_from_the_tail_answer_what_reads_answer(
    tail: Cq, reads: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    stored = append(log_stub, topic, [b"s-%d" % i for i in range(20)], queue_ids=[0, 1] * 10)
    applied([tail, reads], stored)
    assert tail.holds(stored)
    stream = pb.PullStreamRequest(
        pull=pb.PullRequest(topic=topic, queue_id=1, max_messages=3),
        max_batches=10,
    )
    counts = Counted()
    streamed = list(tail.stub.PullStream(stream, timeout=RPC_TIMEOUT_S))
    assert counts() == {"hit": 10, "miss": 0}
    assert [len(r.queue_offsets) for r in streamed] == [3, 3, 3, 1]
    assert wire(streamed) == wire(list(reads.stub.PullStream(stream, timeout=RPC_TIMEOUT_S)))

    # A Follow of two queues nobody wrote to yet: it waits, a dispatch wakes it, and its
    # answers come from the tail.
    fresh = topic + "f"
    follow = pb.FollowRequest(
        pulls=[pb.PullRequest(topic=fresh, queue_id=q) for q in range(2)],
        long_poll_ms=20_000,
        max_batches=2,
    )
    counts = Counted()
    call = tail.stub.Follow(follow, timeout=RPC_TIMEOUT_S)
    assert wait_for(lambda: tail.service.watch.waiting >= 1), "the follow never waited"
    later = append(log_stub, fresh, [b"f-%d" % i for i in range(6)], queue_ids=[0, 1] * 3)
    answers = [a for message in call for a in message.answers]
    assert counts() == {"hit": 6, "miss": 0}
    applied([reads], later)
    assert sorted(a.pull_index for a in answers) == [0, 1]
    for answer in answers:
        unary = pb.PullResponse()
        unary.CopyFrom(answer)
        unary.ClearField("pull_index")
        q = answer.pull_index
        expected = reads.pull(fresh, 0, queue_id=q)
        assert unary.SerializeToString() == expected.SerializeToString()
        assert [decode(raw).body for raw in records_of(answer)] == [
            s.body for s in later if s.queue_id == q
        ]


# -- misses: the Read as before --------------------------------------------------------------


def test_a_restarted_cq_has_an_empty_tail_and_reads_what_it_applied_before(
    tmp_path: Path, log: ServiceProcess, reads: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    first = Cq(tmp_path / "cq", log.target)
    try:
        before = append(log_stub, topic, [b"b-%d" % i for i in range(5)])
        applied([first, reads], before)
        assert first.holds(before)
    finally:
        first.stop()
    again = Cq(tmp_path / "cq", log.target, **first.overrides)  # the same subscriber
    try:
        assert again.tail_bytes == 0, "it resumed past what it had applied: nothing came back"
        counts = Counted()
        old = again.pull(topic, 0)
        assert counts() == {"hit": 0, "miss": 0}  # nothing held: not a lookup, no miss
        assert wire([old]) == wire([reads.pull(topic, 0)])
        assert records_of(old) == log_read(log_stub, before)
        after = append(log_stub, topic, [b"a-%d" % i for i in range(3)])
        applied([again, reads], after)
        counts = Counted()
        new = again.pull(topic, 5)
        assert counts() == {"hit": 3, "miss": 0}
        assert wire([new]) == wire([reads.pull(topic, 5)])
        # A pull of old and new records together is one look: all or nothing, so a miss.
        counts = Counted()
        both = again.pull(topic, 0)
        assert counts() == {"hit": 0, "miss": 8}
        assert wire([both]) == wire([reads.pull(topic, 0)])
    finally:
        again.stop()


def test_a_tail_smaller_than_the_records_serves_the_newest_and_reads_the_rest(
    tmp_path: Path, log: ServiceProcess, reads: Cq, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    small = Cq(tmp_path / "cq", log.target, tail_records_mib=1)
    try:
        batches = []
        # ~410 KB each: the tail of 1 MiB holds two at most, a segment two (the append that
        # opens the next segment comes in a scanned frame, without records: never held).
        for k in range(5):
            stored = append(log_stub, topic, [bytes([65 + k]) * 4_000] * 100)
            applied([small, reads], stored)
            batches.append(stored)
        assert 0 < small.tail_bytes <= 1 << 20
        held = [b for b in batches if small.holds(b)]
        assert 1 <= len(held) <= 2
        assert not small.holds(batches[0]), "the oldest were dropped to bound the tail"
        newest = held[-1]
        counts = Counted()
        old = small.pull(topic, 0, max_messages=10)
        assert counts() == {"hit": 0, "miss": 10}
        first = newest[0].queue_offset
        new = small.pull(topic, first, max_messages=10)
        assert counts() == {"hit": 10, "miss": 10}
        assert wire([old, new]) == wire(
            [reads.pull(topic, 0, max_messages=10), reads.pull(topic, first, max_messages=10)]
        )
        assert records_of(new) == log_read(log_stub, newest[:10])
    finally:
        small.stop()


def test_frames_bring_records_only_while_consumers_read_at_the_tail(
    tmp_path: Path, log: ServiceProcess, log_stub: cl_grpc.CommitLogStub, topic: str
) -> None:
    """Nobody at the tail for tail_wanted_ms, the commit log is told to send no records
    (carrying them costs it at peak produce), and a consumer reading old messages does not
    change that; one waiting at the tail asks for them again, and being served from the tail
    keeps them coming."""
    cq = Cq(tmp_path / "cq", log.target, tail_wanted_ms=1_000)
    try:
        assert wait_for(lambda: not cq.service.subscriber.records_included, 10)
        held = cq.tail_bytes
        idle = append(log_stub, topic, [b"idle-%d" % i for i in range(8)])
        applied([cq], idle)
        assert cq.tail_bytes == held and not cq.holds(idle)
        counts = Counted()
        assert list(cq.pull(topic, 0).queue_offsets) == list(range(8))  # read from the log
        assert counts()["hit"] == 0
        assert not wait_for(lambda: cq.service.subscriber.records_included, 0.6)
        waiting = cq.pull(topic, 8, long_poll_ms=50)  # caught up: waits at the end
        assert waiting.status == pb.OFFSET_OVERFLOW_ONE
        assert wait_for(lambda: cq.service.subscriber.records_included, 10)
        # Another consumer waits at another queue's end all along: the wish holds however
        # slow this machine is between here and the append's frame.
        other = threading.Thread(target=lambda: cq.pull(topic + "-other", 0, long_poll_ms=5_000))
        other.start()
        try:
            reading = append(log_stub, topic, [b"read-%d" % i for i in range(8)])
            applied([cq], reading)
            assert cq.holds(reading) and cq.tail_bytes > held
            assert records_of(cq.pull(topic, 8)) == log_read(log_stub, reading)
            assert counts()["hit"] == 8
        finally:
            other.join()
        # A Receive waits at a queue's end too, but it reads the log: it asks for no records.
        receive = threading.Thread(
            target=lambda: cq.stub.Receive(
                pb.ReceiveRequest(
                    group="g", topic=topic + "-r", queue_id=0, invisible_duration_ms=1_000,
                    long_poll_ms=1_500,
                ),
                timeout=RPC_TIMEOUT_S,
            )
        )  # fmt: skip
        receive.start()
        try:
            assert wait_for(lambda: cq.service.servicer.watch.waiting == 1, 10)
            assert _waiting_at_tail(cq) == 0
        finally:
            receive.join()
    finally:
        cq.stop()


def test_the_tail_is_dropped_at_a_handshake_and_pulls_after_it_read(tmp_path: Path) -> None:
    own = start_commitlog(tmp_path / "log")
    cqs: list[Cq] = []
    try:
        cqs.append(Cq(tmp_path / "tail", own.target))
        cqs.append(Cq(tmp_path / "reads", own.target, tail_records_mib=0))
        cq, plain = cqs
        with make_channel(own.target) as channel:
            stub = cl_grpc.CommitLogStub(channel)
            before = append(stub, "H", [b"h-%d" % i for i in range(6)])
            applied(cqs, before)
            assert cq.holds(before) and cq.tail_bytes > 0
            as_written = log_read(stub, before)
        own.pin_ports()  # the cqs name its target
        assert own.stop(timeout_s=15) == 0
        # While the log is down the tail still answers what it holds (until the next
        # handshake); a cq that reads cannot.
        assert cq.holds(before), "held until the next handshake"
        counts = Counted()
        down = cq.pull("H", 0)
        assert counts() == {"hit": 6, "miss": 0}
        assert records_of(down) == as_written
        code, _, _ = rpc_error(lambda: plain.pull("H", 0))
        assert code == grpc.StatusCode.UNAVAILABLE
        own.start()
        own.wait_listening()
        # The subscriber comes back: the handshake drops whatever the tail held.
        assert wait_for(lambda: cq.tail_bytes == 0, 30), "the handshake kept the tail"
        assert cq.service.subscriber.caught_up and not cq.holds(before)
        with make_channel(own.target) as channel:
            stub = cl_grpc.CommitLogStub(channel)
            counts = Counted()
            old = cq.pull("H", 0)
            assert counts() == {"hit": 0, "miss": 0}  # nothing held: read, no lookup
            assert wire([old]) == wire([down])
            assert records_of(old) == log_read(stub, before)
            cq.want_records()  # however long the restart took, a consumer is at the tail
            after = append(stub, "H", [b"n-%d" % i for i in range(2)])
            applied(cqs, after)
            counts = Counted()
            new = cq.pull("H", 6)
            assert counts() == {"hit": 2, "miss": 0}
            assert wire([new]) == wire([plain.pull("H", 6)])
            assert records_of(new) == log_read(stub, after)
    finally:
        for one in reversed(cqs):
            one.stop()
        own.stop(timeout_s=15)


def test_records_below_a_moved_log_minimum_are_no_longer_served_from_the_tail(
    tmp_path: Path,
) -> None:
    own = start_commitlog(
        tmp_path / "log", *EXPIRING_LOG_ARGS, env=EXPIRING_LOG_ENV, file_bytes=EXPIRING_LOG_BYTES
    )
    cq: Cq | None = None
    try:
        cq = Cq(tmp_path / "cq", own.target, log_probe_interval_ms=100)
        with make_channel(own.target) as channel:
            stub = cl_grpc.CommitLogStub(channel)
            stored: list[Stored] = []
            appends: list[list[Stored]] = []

            def segment(rows: list[Stored]) -> int:
                return rows[0].commit_log_offset // EXPIRING_LOG_BYTES

            # Small appends, applied one by one, until the last two share the last segment
            # (the first append of a segment comes in a scanned frame: never held).
            while len(appends) < 24 or segment(appends[-1]) != segment(appends[-2]):
                first = len(stored)
                appends.append(append(stub, "X", [b"x-%d" % i for i in range(first, first + 5)]))
                stored += appends[-1]
                applied([cq], stored)
            last_start = segment(appends[-1]) * EXPIRING_LOG_BYTES

            def log_min() -> int:
                return int(stub.GetStatus(cl_pb.GetStatusRequest(), timeout=5).min_offset)

            # Retention deletes every segment but the last, and nothing moves after that.
            assert wait_for(lambda: log_min() == last_start), "retention did not run"
            gone = [s for s in stored if s.commit_log_offset < last_start]
            assert len(gone) > len(stored) // 2
            # The probe sees the new minimum: the tail forgets what lies below it.
            assert wait_for(lambda: not any(cq.holds([s]) for s in gone), 30)
            kept = appends[-1]
            assert cq.holds(kept), "the newest append is still held"
            counts = Counted()
            r = cq.pull("X", kept[0].queue_offset)
            assert counts() == {"hit": len(kept), "miss": 0}
            assert (r.status, list(r.queue_offsets)) == (pb.FOUND, [s.queue_offset for s in kept])
            assert records_of(r) == log_read(stub, kept)
    finally:
        if cq is not None:
            cq.stop()
        own.stop(timeout_s=15)


# -- bytes damaged after the append ----------------------------------------------------------


def test_a_record_damaged_after_the_append_is_served_as_written_from_the_tail_only(
    tmp_path: Path,
) -> None:
    """The design: the tail holds the bytes the append wrote, so damage done to the segment
    afterwards is not seen by a pull the tail answers (the consumer SDK checks each record's
    CRC end to end); a cq without the tail reads the log, which refuses the record."""
    own = start_commitlog(tmp_path / "log")  # its own: the damage stays in it
    cqs: list[Cq] = []
    try:
        cqs.append(Cq(tmp_path / "tail", own.target))
        cqs.append(Cq(tmp_path / "reads", own.target, tail_records_mib=0))
        with_tail, without = cqs
        with make_channel(own.target) as channel:
            stub = cl_grpc.CommitLogStub(channel)
            stored = append(stub, "D", [b"body-0", b"body-1", b"body-2", b"body-3"])
            applied(cqs, stored)
            assert with_tail.holds(stored)
            as_written = log_read(stub, stored)
            victim = stored[2]
            path = segment_path(own, victim.commit_log_offset)
            with open(path, "r+b") as f:
                at = victim.commit_log_offset % LOG_FILE_BYTES
                raw = os.pread(f.fileno(), victim.size, at)
                os.pwrite(f.fileno(), b"X", at + raw.index(b"body-2") + 5)
            read = stub.Read(
                cl_pb.ReadRequest(offsets=[victim.commit_log_offset], sizes=[victim.size]),
                timeout=RPC_TIMEOUT_S,
            )
            assert list(read.statuses) == [cl_pb.READ_CORRUPT]

            counts = Counted()
            served = with_tail.pull("D", 0)
            assert counts() == {"hit": 4, "miss": 0}
            assert (served.status, list(served.queue_offsets)) == (pb.FOUND, [0, 1, 2, 3])
            assert records_of(served) == as_written
            assert decode(records_of(served)[2]).body == b"body-2"

            r = without.pull("D", 0)
            assert (r.status, list(r.queue_offsets), r.next_begin_offset) == (pb.FOUND, [0, 1], 2)
            code, message, _ = rpc_error(lambda: without.pull("D", 2))
            assert code == grpc.StatusCode.DATA_LOSS
            assert str(victim.commit_log_offset) in message
    finally:
        for cq in reversed(cqs):
            cq.stop()
        own.stop(timeout_s=15)


def _waiting_at_tail(cq: Cq) -> int:
    """Pulls and Follows waiting at a queue's end of `cq` now (a Receive is not counted)."""
    tail = cq.service.sources.tail
    return 0 if tail is None else tail.waiting
