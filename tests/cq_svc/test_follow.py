"""Follow: Pulls of several queues on one server stream. Each answer must be, byte for byte, what
a unary Pull of its queue (pull_index) from that queue's previous answer's next_begin_offset
gives; queues are served in turn; the stream waits while nothing is new, wakes on a dispatch
to one of its queues, and ends after max_batches answers, after long_poll_ms idle, on the
caller's deadline, on cancel and on shutdown; at most follow_streams_max run at once (the
unary long polls' bound is their own), and a round answers at most stream_answer_bytes_max of
records.

Real commit log process; the consume queue is fed directly (real sink and engine) with the
dispatch entries of real appends, as in test_pull_stream.py. Each test writes its own topic.
Times are asserted loosely: a lower bound where the stream must have waited, and a bound far
below the wait where it must not have."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from mqstore.formats.properties import TAGS
from mqstore.formats.record_columns import split_records
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb
from tests.answers import records_of
from tests.cq_svc.logs import Stored, append, decode, start_commitlog
from tests.cq_svc.support import ApiHarness, rpc_error, wait_for

LONG_MS = 20_000  # a wait that no passing test sits through
LONG_POLLS_MAX = 3
FOLLOWS_MAX = 3  # the server's cap on follow streams
BATCHES_MAX = 20  # the server's cap on a follow's answers
QUEUES_MAX = 4  # the server's cap on a follow's queues


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    process = start_commitlog(tmp_path_factory.mktemp("follow") / "log")
    yield process
    process.stop(timeout_s=15)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, log: ServiceProcess) -> Iterator[ApiHarness]:
    harness = ApiHarness(
        tmp_path_factory.mktemp("follow") / "cq",
        commitlog_target=log.target,
        long_polls_max=LONG_POLLS_MAX,
        follow_streams_max=FOLLOWS_MAX,
        follow_batches_max=BATCHES_MAX,
        follow_queues_max=QUEUES_MAX,
    )
    harness.handshake()
    yield harness
    harness.stop()


@pytest.fixture(autouse=True)
def nobody_waits(api: ApiHarness) -> Iterator[None]:
    """Every test starts and leaves with no waiter: the bound is shared by the module."""
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
    yield
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)


def feed(
    api: ApiHarness, topic: str, queue_ids: Sequence[int], tags: Sequence[str] | None = None
) -> list[Stored]:
    """Append one message per queue id to the real log, and dispatch them to the queues."""
    stub = cl_grpc.CommitLogStub(api.log_channel)
    bodies = [b"%s-%d-%d" % (topic.encode(), q, i) for i, q in enumerate(queue_ids)]
    stored = append(stub, topic, bodies, queue_ids=queue_ids, tags=tags)
    api.dispatch([s.entry(topic) for s in stored])
    return stored


def pull(topic: str, queue_id: int, offset: int, **fields: object) -> pb.PullRequest:
    return pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, **fields)  # type: ignore[arg-type]


class Answers:
    """A Follow call's answers one at a time: each stream message holds the answers of one
    round (at least one), in turn."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self._answers = (answer for message in call for answer in message.answers)

    def __iter__(self) -> Iterator[pb.PullResponse]:
        return self._answers

    def __next__(self) -> pb.PullResponse:
        return next(self._answers)

    def cancel(self) -> bool:
        return bool(self.call.cancel())


def follow_call(api: ApiHarness, request: pb.FollowRequest, **kwargs: Any) -> Answers:
    return Answers(api.stub.Follow(request, **kwargs))


def follow(*pulls: pb.PullRequest, long_poll_ms: int = 0, max_batches: int = 0) -> pb.FollowRequest:
    return pb.FollowRequest(pulls=pulls, long_poll_ms=long_poll_ms, max_batches=max_batches)


def unary_walk(api: ApiHarness, first: pb.PullRequest) -> list[pb.PullResponse]:
    """Unary Pulls, each from the last answer's next_begin_offset, to the queue's end."""
    out = []
    request = pb.PullRequest()
    request.CopyFrom(first)
    for _ in range(1_000):
        response: pb.PullResponse = api.stub.Pull(request, timeout=30)
        out.append(response)
        if (
            response.status not in (pb.FOUND, pb.NO_MATCHED_MESSAGE)
            or response.next_begin_offset >= response.max_offset
        ):
            return out
        request.offset = response.next_begin_offset
    raise AssertionError("the walk never reached the queue's end")


def unindexed(answer: pb.PullResponse) -> pb.PullResponse:
    """The answer as a unary Pull gives it."""
    plain = pb.PullResponse()
    plain.CopyFrom(answer)
    plain.ClearField("pull_index")
    return plain


def same(answers: Sequence[pb.PullResponse], pulls: Sequence[pb.PullResponse]) -> bool:
    return [unindexed(a).SerializeToString() for a in answers] == [
        p.SerializeToString() for p in pulls
    ]


def tags_of(answer: pb.PullResponse) -> list[str]:
    return [
        decode(raw).properties_dict().get(TAGS, "")
        for raw in split_records(answer.records_blob, list(answer.record_sizes))
    ]


def looks() -> float:
    """Looks at a queue so far in this process (every look observes the pull histogram)."""
    value = REGISTRY.get_sample_value("mqstore_cq_pull_seconds_count")
    assert value is not None
    return value


# -- answers --------------------------------------------------------------------------------------


def test_answers_are_the_unary_pulls_of_each_queue_served_in_turn(api: ApiHarness) -> None:
    counts = {0: 20, 1: 13, 2: 5}
    feed(api, "F", [q for i in range(20) for q in counts if i < counts[q]])
    pulls = [
        pull("F", 0, 0, max_messages=3),
        pull("F", 1, 1, max_messages=3),
        pull("F", 2, 0, max_messages=2),
    ]
    answers = list(follow_call(api, follow(*pulls), timeout=30))

    walks = [unary_walk(api, p) for p in pulls]
    assert [len(w) for w in walks] == [7, 4, 3]
    assert sorted({a.pull_index for a in answers}) == [0, 1, 2]
    for i, walk in enumerate(walks):
        mine = [a for a in answers if a.pull_index == i]
        assert same(mine, walk), i
        assert mine[-1].next_begin_offset == mine[-1].max_offset == counts[i]
    assert answers[-1].pull_index == 0  # the longest queue ends the stream
    assert [records_of(a) for a in answers if a.pull_index == 2] != [[], [], []]
    # In turn: while every queue has more, no queue is more than one answer ahead.
    served: Counter[int] = Counter()
    for answer in answers[: len(pulls) * min(len(w) for w in walks)]:
        served[answer.pull_index] += 1
        assert max(served.values()) - min(served[i] for i in range(len(pulls))) <= 1, served


def test_a_round_answers_every_queue_that_has_something_in_one_message(api: ApiHarness) -> None:
    feed(api, "Round", [0, 1, 2, 0, 1, 2])
    pulls = [pull("Round", q, 0, max_messages=1) for q in range(3)]
    messages = list(api.stub.Follow(follow(*pulls), timeout=30))
    # Two rounds of three (a message each per queue), then nothing new: no third message.
    assert [[a.pull_index for a in m.answers] for m in messages] == [[0, 1, 2], [1, 2, 0]]
    for m in messages:
        for a in m.answers:
            i = a.pull_index
            one = pb.PullRequest()
            one.CopyFrom(pulls[i])
            one.offset = a.queue_offsets[0]
            unary = api.stub.Pull(one, timeout=30)
            assert a.records_blob == unary.records_blob


def test_a_follow_ends_after_max_batches_answers_capped_by_the_server(api: ApiHarness) -> None:
    feed(api, "Cap", [0] * (BATCHES_MAX + 5))
    one = pull("Cap", 0, 0, max_messages=1)
    three = list(follow_call(api, follow(one, max_batches=3, long_poll_ms=LONG_MS), timeout=30))
    assert same(three, unary_walk(api, one)[:3])
    assert [list(a.queue_offsets) for a in three] == [[0], [1], [2]]
    for asked in (0, 1_000):
        began = time.monotonic()
        capped = list(
            follow_call(api, follow(one, max_batches=asked, long_poll_ms=LONG_MS), timeout=30)
        )
        assert len(capped) == BATCHES_MAX
        assert time.monotonic() - began < LONG_MS / 1000 / 4  # ended on the count, not idle


# -- waiting --------------------------------------------------------------------------------------


def test_a_follow_at_the_end_waits_for_a_dispatch_and_answers_only_that_queue(
    api: ApiHarness,
) -> None:
    feed(api, "W", [0, 0, 1, 1, 1])
    pulls = [
        pull("W", 0, 2),
        pull("W", 1, 3),
        pull("W", 2, 0),  # never written
    ]
    stream = follow_call(api, follow(*pulls, long_poll_ms=1_500), timeout=30)
    assert wait_for(lambda: api.watch.waiting == 1)  # one long poll for the three queues
    began = time.monotonic()

    def later() -> None:
        time.sleep(0.3)
        feed(api, "W", [1, 1])

    writer = threading.Thread(target=later)
    writer.start()
    try:
        first = next(stream, None)
        woke = time.monotonic() - began
        rest = list(stream)
        ended = time.monotonic() - began
    finally:
        writer.join()
    assert first is not None, "no answer: the dispatch did not wake the follow"
    assert woke >= 0.25  # nothing was answered before the dispatch
    assert (first.pull_index, first.status, list(first.queue_offsets)) == (1, pb.FOUND, [3, 4])
    assert same([first], [api.stub.Pull(pulls[1], timeout=30)])
    assert rest == []  # nothing for the queues nobody wrote to
    assert ended - woke >= 1.4  # the idle time counts from the last answer


def test_a_follow_with_nothing_to_answer_ends_after_its_idle_time(api: ApiHarness) -> None:
    feed(api, "I", [0])
    request = follow(pull("I", 0, 1), pull("I", 1, 0), long_poll_ms=600)
    began = time.monotonic()
    assert list(follow_call(api, request, timeout=30)) == []
    assert 0.55 <= time.monotonic() - began < LONG_MS / 1000 / 4


def test_the_callers_deadline_ends_a_follow_without_an_error(api: ApiHarness) -> None:
    feed(api, "D", [0])
    request = follow(pull("D", 0, 1), long_poll_ms=LONG_MS)
    began = time.monotonic()
    assert list(follow_call(api, request, timeout=1.0)) == []
    assert 0.5 <= time.monotonic() - began < LONG_MS / 1000 / 4


def test_a_cancelled_follow_frees_its_long_poll(api: ApiHarness) -> None:
    feed(api, "X", [0])
    stream = follow_call(api, follow(pull("X", 0, 1), long_poll_ms=LONG_MS), timeout=30)
    assert wait_for(lambda: api.watch.waiting == 1)
    stream.cancel()
    # The server sees the cancel and drops the waiter, long before the idle time.
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
    with pytest.raises(grpc.RpcError) as err:
        list(stream)
    assert err.value.code() == grpc.StatusCode.CANCELLED


def test_shutdown_ends_a_waiting_follow_at_once(tmp_path: Path) -> None:
    api = ApiHarness(tmp_path / "cq")  # an empty queue: no message bytes to fetch
    try:
        api.handshake()
        stream = follow_call(api, follow(pull("S", 0, 0), long_poll_ms=LONG_MS), timeout=30)
        assert wait_for(lambda: api.watch.waiting == 1)
        began = time.monotonic()
        api.watch.close()  # what SIGTERM does first (main.py)
        assert list(stream) == []
        assert time.monotonic() - began < LONG_MS / 1000 / 4
    finally:
        api.stop()


# -- tags -----------------------------------------------------------------------------------------


def test_a_tag_filter_answers_matching_records_and_moves_past_the_rest(api: ApiHarness) -> None:
    tags = ["a", "b", "c"] * 4
    feed(api, "G", [0] * len(tags) + [1], tags=[*tags, "b"])
    pulls = [
        pull("G", 0, 0, max_messages=4, tags=["b"]),
        pull("G", 1, 1, tags=["b"]),  # at its end
    ]
    walk = unary_walk(api, pulls[0])
    stream = follow_call(
        api, follow(*pulls, long_poll_ms=5_000, max_batches=len(walk) + 3), timeout=30
    )
    caught_up = [next(stream) for _ in walk]
    assert same(caught_up, walk)
    assert {a.pull_index for a in caught_up} == {0}
    assert [t for a in caught_up for t in tags_of(a)] == ["b"] * 4
    assert [q for a in caught_up for q in a.queue_offsets] == [1, 4, 7, 10]

    feed(api, "G", [1, 1, 1], tags=["a", "c", "a"])  # nothing the follow wants
    skipped = next(stream)
    assert (skipped.pull_index, skipped.status) == (1, pb.NO_MATCHED_MESSAGE)
    assert skipped.next_begin_offset == skipped.max_offset == 4
    assert not skipped.queue_offsets and not skipped.records_blob

    feed(api, "G", [1, 1], tags=["c", "b"])
    found = next(stream)
    assert (found.pull_index, found.status, list(found.queue_offsets)) == (1, pb.FOUND, [5])
    assert tags_of(found) == ["b"]

    feed(api, "G", [0], tags=["b"])  # the queue the follow read to its end moves again
    again = next(stream)
    assert (again.pull_index, again.status, list(again.queue_offsets)) == (0, pb.FOUND, [12])
    assert list(stream) == []  # max_batches


# -- unknown queues -------------------------------------------------------------------------------


def test_unknown_queues_are_answered_at_most_once_and_do_not_spin(api: ApiHarness) -> None:
    feed(api, "U", [0])
    pulls = [
        pull("nobody", 0, 0),  # nothing new, nothing to move: never answered
        pull("nobody", 1, 5),  # corrected to 0 once
        pull("U", 0, 1),  # at its end
    ]
    before = looks()
    began = time.monotonic()
    answers = list(follow_call(api, follow(*pulls, long_poll_ms=500), timeout=30))
    assert time.monotonic() - began >= 0.45
    assert [(a.pull_index, a.status, a.next_begin_offset) for a in answers] == [
        (1, pb.NO_MESSAGE_IN_QUEUE, 0)
    ]
    # Three first looks and one from the corrected offset; a spinning stream makes thousands.
    assert looks() - before <= 10


# -- errors and limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (follow(), "pulls"),
        (follow(*(pull("E", q, 0) for q in range(QUEUES_MAX + 1))), "pulls"),
        (follow(pull("E", 0, 0), pull("E", 1, 0), pull("E", 0, 3)), "pulls"),
        (follow(pull("E", 0, 0), max_batches=-1), "max_batches"),
        (follow(pull("E", 0, 0), pull("E", 1, -1)), "offset"),
        (follow(pull("E", 0, 0), long_poll_ms=-1), "long_poll_ms"),
        (follow(pull("E", 0, 0), pull("bad/topic", 0, 0)), "topic"),
        (follow(pull("E", 0, 0, max_messages=-5)), "max_messages"),
    ],
    ids=[
        "no pulls",
        "too many pulls",
        "a queue twice",
        "negative max_batches",
        "negative offset",
        "negative long_poll_ms",
        "bad topic",
        "negative max_messages",
    ],
)
def test_bad_input_is_invalid_argument(
    api: ApiHarness, request_: pb.FollowRequest, field: str
) -> None:
    code, _, got = rpc_error(lambda: list(follow_call(api, request_, timeout=30)))
    assert (code, got) == (grpc.StatusCode.INVALID_ARGUMENT, field)


def test_queues_up_to_the_bound_are_accepted(api: ApiHarness) -> None:
    request = follow(*(pull("E", q, 0) for q in range(QUEUES_MAX)))
    assert list(follow_call(api, request, timeout=30)) == []


def test_a_follow_is_refused_before_the_log_is_caught_up(api: ApiHarness) -> None:
    api.ready = False
    try:
        code, _, _ = rpc_error(lambda: list(follow_call(api, follow(pull("E", 0, 0)), timeout=30)))
    finally:
        api.ready = True
    assert code == grpc.StatusCode.UNAVAILABLE


def test_follows_past_their_bound_are_refused_at_once_and_leave_long_polls_alone(
    api: ApiHarness,
) -> None:
    """Issue 23, item 4: a follow stream holds a server thread for as long as it is open, so
    past follow_streams_max one is refused before it looks at anything (it used to answer its
    first look anyway, and hold a thread while a slow reader took it); the unary long polls
    keep their own bound."""
    feed(api, "R", [0])
    at_end = pull("R", 0, 1)
    long_poll = pb.PullRequest(topic="R", offset=1, long_poll_ms=300)
    waiting = [
        follow_call(api, follow(at_end, pull("R", q, 0), long_poll_ms=LONG_MS), timeout=30)
        for q in range(1, FOLLOWS_MAX + 1)
    ]
    try:
        assert wait_for(lambda: api.watch.waiting == FOLLOWS_MAX)
        for extra in (at_end, pull("R", 0, 0)):  # the second has something new: refused too
            stream = follow_call(api, follow(extra, long_poll_ms=LONG_MS), timeout=30)
            code, message, _ = rpc_error(lambda s=stream: next(s))  # type: ignore[misc]
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "follow streams" in message and "follow_streams_max" in message
        # The follows hold none of the long polls' bound: a unary long poll still waits.
        began = time.monotonic()
        assert api.stub.Pull(long_poll, timeout=30).status == pb.OFFSET_OVERFLOW_ONE
        assert time.monotonic() - began >= 0.25
    finally:
        for stream in waiting:
            stream.cancel()
    assert wait_for(lambda: api.watch.waiting == 0, timeout_s=5)
    # Slots come back as the streams end (a cancelled one once its thread sees the cancel).
    assert wait_for(
        lambda: _follows_again(api, follow(pull("R", 0, 0), long_poll_ms=100)), timeout_s=5
    )


def _follows_again(api: ApiHarness, request: pb.FollowRequest) -> bool:
    try:
        answers = list(follow_call(api, request, timeout=30))
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        return False
    assert [(a.status, list(a.queue_offsets)) for a in answers] == [(pb.FOUND, [0])]
    return True


def test_a_round_answers_at_most_stream_answer_bytes_max_and_the_rest_in_the_next(
    log: ServiceProcess, tmp_path: Path
) -> None:
    """Issue 23, item 4: a follow holds one answer while its reader takes it, so a round over
    many queues stops at stream_answer_bytes_max of records (the first at least one record);
    the queues it left are answered next, every message once and in order."""
    budget = 2_000
    small = ApiHarness(tmp_path / "cq", commitlog_target=log.target, stream_answer_bytes_max=budget)
    try:
        small.handshake()
        queues = [q for _ in range(4) for q in range(4)]  # 4 messages in each of 4 queues
        stub = cl_grpc.CommitLogStub(small.log_channel)
        bodies = [b"%d-%d-" % (q, i) + b"b" * 600 for i, q in enumerate(queues)]
        stored = append(stub, "B", bodies, queue_ids=queues)
        small.dispatch([s.entry("B") for s in stored])
        record_bytes = stored[0].size
        assert 2 * record_bytes <= budget < 3 * record_bytes
        pulls = [pull("B", q, 0, max_messages=4) for q in range(4)]
        messages = list(small.stub.Follow(follow(*pulls), timeout=30))
    finally:
        small.stop()
    got: dict[int, list[int]] = {}
    for message in messages:
        sizes = [size for answer in message.answers for size in answer.record_sizes]
        assert sum(sizes) <= budget or len(sizes) == 1, sizes
        for answer in message.answers:
            got.setdefault(answer.pull_index, []).extend(answer.queue_offsets)
    assert got == {q: [0, 1, 2, 3] for q in range(4)}
    assert len(messages) >= 8  # 16 records, at most 2 a round
