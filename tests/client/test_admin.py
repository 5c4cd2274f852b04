"""The Admin against real services: status (healthy and with a replica down), topics, queues,
time lookups, group offsets, key and unique-id queries, paging past the index's 1,024 cap,
index shard routing and failover between replicas of a shard."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import grpc
import pytest

from mqstore import errors as domain
from mqstore.client.admin import (
    INDEX_RESULTS_MAX,
    Admin,
    ClusterStatus,
    KeyPageOverflow,
    QueueInfo,
)
from mqstore.client.connection import Connection
from mqstore.client.consumer import Timestamp
from mqstore.client.errors import (
    Cancelled,
    ClientError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.sharding import shard_of
from mqstore.testing.cluster import Cluster
from tests.e2e.support import Sent, append, eventually

from .conftest import INDEX_ARGS, settings_for

pytestmark = pytest.mark.timeout(180)


def settle(admin: Admin) -> ClusterStatus:
    """Wait until every configured replica answers, has caught up and has applied everything
    the commit log held when called; returns that status."""
    target = admin.status().commitlog.max_offset
    seen: list[ClusterStatus] = []

    def applied() -> bool:
        s = admin.status()
        seen.append(s)
        replicas = [*s.cq, *s.index]
        return all(r.reachable and r.caught_up and r.applied_offset >= target for r in replicas)

    eventually(applied)
    return seen[-1]


def now_ms() -> int:
    return int(time.time() * 1000)


def after(ts_ms: int) -> None:
    """Wait until the wall clock (the commit log's, on this machine) is past ts_ms, so the next
    append gets a later store time."""
    eventually(lambda: now_ms() > ts_ms, step_s=0.001)


def newest(admin: Admin, topic: str, key: str) -> Message:
    found = admin.query_by_key(topic, key, max_messages=1)
    assert found, key
    return found[0]


def offsets(messages: list[Message]) -> list[int]:
    return [m.commit_log_offset for m in messages]


def sent_offsets_newest_first(sent: list[Sent]) -> list[int]:
    return sorted((s.commit_log_offset for s in sent), reverse=True)


# -- status ---------------------------------------------------------------------------------------


def test_status_shows_the_commit_log_its_subscribers_and_every_replica(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    sent = append(cluster.commitlog_stub(), topic, [0], [b"a"], keys=["k"])
    with Admin(settings) as admin:
        settle(admin)
        s = admin.status()
        lag = admin.lag()

    log = s.commitlog
    assert log.address == settings.commitlog
    assert len(log.store_id) == 32 and int(log.store_id, 16)
    assert log.store_host.startswith("127.0.0.1:")
    assert log.min_offset <= sent[0].commit_log_offset < log.max_offset
    assert log.flushed_offset == log.max_offset  # --flush sync
    assert log.confirm_offset == log.max_offset
    assert (log.flush, log.writable) == ("sync", True)
    subscribers = {sub.subscriber_id: sub for sub in log.subscribers}
    assert set(subscribers) == {"cq", "index"}
    assert all(sub.connected for sub in subscribers.values())
    assert {x.subscriber_id for x in lag} == {"cq", "index"}

    (cq,) = s.cq
    assert (cq.address, cq.reachable, cq.error, cq.caught_up) == (settings.cq[0], True, "", True)
    assert cq.store_id == log.store_id
    assert cq.applied_offset >= sent[0].commit_log_offset
    assert cq.store in ("file", "rocksdb")
    assert cq.queue_count >= 1
    (index,) = s.index
    assert (index.address, index.reachable, index.caught_up) == (settings.index[0], True, True)
    assert index.store_id == log.store_id
    assert (index.shard_count, index.shard_index) == (1, 0)
    assert s.unreachable == []

    # What the CLI prints with --json: plain data that survives a JSON round trip.
    document = json.loads(json.dumps(s.to_json()))
    assert document["commitlog"]["max_offset"] == log.max_offset
    assert document["commitlog"]["subscribers"][0]["subscriber_id"] in ("cq", "index")
    assert document["cq"][0]["reachable"] is True
    assert document["index"][0]["shard_count"] == 1


# -- queues and time ------------------------------------------------------------------------------


def test_topics_and_queues_show_what_the_consume_queues_hold(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    append(cluster.commitlog_stub(), topic, [0, 0, 0, 2, 2, 1], [b"m"] * 6)
    with Admin(settings) as admin:
        settle(admin)
        topics = admin.topics()
        assert topic in topics
        assert topics == sorted(topics)
        assert admin.queues(topic) == [
            QueueInfo(topic, 0, 0, 3),
            QueueInfo(topic, 1, 0, 1),
            QueueInfo(topic, 2, 0, 2),
        ]
        assert admin.queue(topic, 2) == QueueInfo(topic, 2, 0, 2)
        assert admin.queue(topic, 2).messages == 2
        # RocketMQ creates queues on demand: an unknown queue or topic is an empty one.
        assert admin.queue(topic, 7) == QueueInfo(topic, 7, 0, 0)
        assert admin.queues(topic + "_never") == []
        assert admin.queue(topic, 0).to_json() == {
            "topic": topic,
            "queue_id": 0,
            "min_offset": 0,
            "max_offset": 3,
        }


def test_offset_for_time_lands_on_the_first_at_or_after_or_the_last_at_or_before(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    stub = cluster.commitlog_stub()
    with Admin(settings) as admin:
        append(stub, topic, [0, 0], [b"a0", b"a1"], keys=["a", "a"])
        settle(admin)
        ts_a = newest(admin, topic, "a").store_timestamp_ms
        after(ts_a)
        append(stub, topic, [0, 0], [b"b0", b"b1"], keys=["b", "b"])
        settle(admin)
        ts_b = newest(admin, topic, "b").store_timestamp_ms
        assert ts_b > ts_a

        def at(ts_ms: int, boundary: str = "lower") -> int:
            return admin.offset_for_time(topic, 0, ts_ms, boundary)  # type: ignore[arg-type]

        assert at(0) == 0
        assert at(ts_a) == 0
        assert at(ts_a + 1) == 2
        assert at(ts_b) == 2
        assert at(ts_b + 1) == 4  # nothing stored after it: the queue's end
        assert at(ts_a, "upper") == 1
        assert at(ts_b - 1, "upper") == 1
        assert at(ts_b, "upper") == 3


# -- group offsets --------------------------------------------------------------------------------


def test_group_offsets_are_shown_committed_and_reset_to_each_kind_of_target(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    stub = cluster.commitlog_stub()
    group = f"g_{topic}"[:200]
    with Admin(settings) as admin:
        append(stub, topic, [0, 0, 0, 1, 1], [b"a"] * 5, keys=["a"] * 5)
        settle(admin)
        ts_a = newest(admin, topic, "a").store_timestamp_ms
        after(ts_a)
        append(stub, topic, [0, 0, 1], [b"b"] * 3, keys=["b"] * 3)
        settle(admin)
        ts_b = newest(admin, topic, "b").store_timestamp_ms

        assert admin.group_offsets(group, topic) == {0: None, 1: None}
        admin.commit_offset(group, topic, 0, 2)
        assert admin.group_offsets(group, topic) == {0: 2, 1: None}

        def reset(to: object, queues: list[int] | None = None) -> dict[int, int]:
            done = admin.reset_group_offsets(group, topic, to, queues)  # type: ignore[arg-type]
            shown = admin.group_offsets(group, topic)
            assert all(shown[q] == offset for q, offset in done.items())
            return done

        assert reset("earliest") == {0: 0, 1: 0}
        assert reset("latest") == {0: 5, 1: 3}
        assert reset(4) == {0: 4, 1: 3}  # brought into [min, max] per queue
        assert reset(1, queues=[1]) == {1: 1}
        assert admin.group_offsets(group, topic) == {0: 4, 1: 1}
        assert reset(Timestamp(ts_b)) == {0: 3, 1: 2}  # the first message of the second batch
        assert reset(Timestamp(ts_a, "upper")) == {0: 2, 1: 1}  # the last of the first
        assert reset(Timestamp(ts_b + 1)) == {0: 5, 1: 3}

        with pytest.raises(NotFound) as caught:
            admin.reset_group_offsets(group, topic + "_never", "earliest")
        assert caught.value.field == "topic"
        assert admin.group_offsets(group, topic + "_never") == {}
        with pytest.raises(NotFound, match="has no queue 7; its queues: 0, 1") as caught:
            admin.reset_group_offsets(group, topic, "earliest", queues=[0, 7])
        assert caught.value.field == "queues"
        assert admin.group_offsets(group, topic) == {0: 5, 1: 3}  # queue 0 untouched too


# -- queries --------------------------------------------------------------------------------------


def test_queries_by_key_and_unique_id_and_get_message_return_the_stored_messages(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    sent = append(
        cluster.commitlog_stub(),
        topic,
        [0, 1, 2],
        [b"one", b"two", b"three"],
        keys=["k1", "k1 k2", "other"],
        uniq_keys=["u1", "u2", "u3"],
        tags="created",
    )
    with Admin(settings) as admin:
        settle(admin)
        found = admin.query_by_key(topic, "k1")
        assert [m.body for m in found] == [b"two", b"one"]  # newest first
        assert offsets(found) == [sent[1].commit_log_offset, sent[0].commit_log_offset]
        two = found[0]
        assert (two.topic, two.queue_id, two.keys, two.uniq_key, two.tags) == (
            topic,
            1,
            ["k1", "k2"],
            "u2",
            "created",
        )
        assert admin.query_by_key(topic, "k2") == [two]
        assert admin.query_by_key(topic, "k1", max_messages=1) == [two]
        assert admin.query_by_key(topic, "never") == []
        # A range ending a second before the messages were stored holds none of them.
        assert admin.query_by_key(topic, "k1", end_ms=two.store_timestamp_ms - 2_000) == []
        assert admin.query_by_uniq_key(topic, "u2") == [two]
        assert admin.query_by_uniq_key(topic, "u9") == []
        assert admin.get_message(two.msg_id) == two
        assert admin.get_message(found[1].msg_id).body == b"one"


def test_get_message_of_an_id_the_store_never_held_is_not_found(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    append(cluster.commitlog_stub(), topic, [0], [b"a"], keys=["k"])
    with Admin(settings) as admin:
        settle(admin)
        msg_id = newest(admin, topic, "k").msg_id
        host = msg_id[:-16]
        beyond = f"{host}{10**12:016X}"
        with pytest.raises(NotFound) as caught:
            admin.get_message(beyond)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        assert isinstance(caught.value, domain.NotFound)
        assert caught.value.method == "CommitLog/GetMessage"
        other_host = "7F000002" + msg_id[8:]  # same offset, stored by another host
        with pytest.raises(NotFound):
            admin.get_message(other_host)


def test_iter_key_pages_through_more_matches_in_one_second_than_a_page(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    stub = cluster.commitlog_stub()
    with Admin(settings) as admin:
        first = append(stub, topic, [0] * 10, [b"x%d" % i for i in range(10)], keys=["hot"] * 10)
        settle(admin)
        after(newest(admin, topic, "hot").store_timestamp_ms)
        second = append(stub, topic, [1] * 3, [b"y%d" % i for i in range(3)], keys=["hot"] * 3)
        settle(admin)
        everything = sent_offsets_newest_first(first + second)
        for page_size in (1, 3, 4, 13, 64):
            got = list(admin.iter_key(topic, "hot", page_size=page_size))
            assert offsets(got) == everything, page_size
        assert offsets(admin.query_by_key(topic, "hot", max_messages=100)) == everything
        # With a time range, iter_key answers what one unbounded query of that range would.
        ts = newest(admin, topic, "hot").store_timestamp_ms
        ranged = admin.query_by_key(topic, "hot", begin_ms=ts - 1, end_ms=ts, max_messages=1024)
        got = list(admin.iter_key(topic, "hot", begin_ms=ts - 1, end_ms=ts, page_size=2))
        assert offsets(got) == offsets(ranged)
        assert list(admin.iter_key(topic, "cold", page_size=2)) == []


def test_iter_key_returns_every_match_past_the_server_cap_and_stops_clearly_when_it_cannot(
    settings: ClientSettings, cluster: Cluster, topic: str
) -> None:
    stub = cluster.commitlog_stub()
    half = 600
    with Admin(settings) as admin:
        older = append(stub, topic, [0] * half, [b"o"] * half, keys=["many"] * half)
        settle(admin)
        # A second apart at least: the index's time resolution can tell the two batches apart.
        after(newest(admin, topic, "many").store_timestamp_ms + 1_000)
        newer = append(stub, topic, [1] * half, [b"n"] * half, keys=["many"] * half)
        dense = append(
            stub, topic, [2] * 1_100, [b"d"] * 1_100, keys=["dense"] * 1_100
        )  # one Append: one store time for all
        settle(admin)

        capped = admin.query_by_key(topic, "many", max_messages=5_000)
        assert len(capped) == INDEX_RESULTS_MAX
        got = list(admin.iter_key(topic, "many", page_size=500))
        assert offsets(got) == sent_offsets_newest_first(older + newer)

        # 1,100 matches within one second: no time range separates them, so no query reaches
        # the oldest 76. iter_key yields what one answer holds, then says so.
        yielded: list[Message] = []
        with pytest.raises(KeyPageOverflow) as caught:
            for m in admin.iter_key(topic, "dense", page_size=100):
                yielded.append(m)
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert offsets(yielded) == sent_offsets_newest_first(dense)[:INDEX_RESULTS_MAX]


# -- bad input ------------------------------------------------------------------------------------

BAD_CALLS: list[tuple[str, str, Callable[[Admin, str], object]]] = [
    ("boundary", "boundary", lambda a, t: a.offset_for_time(t, 0, 0, "middle")),  # type: ignore[arg-type]
    ("negative time", "timestamp_ms", lambda a, t: a.offset_for_time(t, 0, -1)),
    ("topic", "topic", lambda a, t: a.queues("no spaces allowed")),
    ("queue id", "queue_id", lambda a, t: a.queue(t, -1)),
    ("key with a space", "key", lambda a, t: a.query_by_key(t, "a b")),
    ("empty key", "key", lambda a, t: a.query_by_key(t, "")),
    ("range", "begin_timestamp_ms", lambda a, t: a.query_by_key(t, "k", begin_ms=9, end_ms=5)),
    ("max messages", "max_messages", lambda a, t: a.query_by_key(t, "k", max_messages=-1)),
    ("empty uniq key", "uniq_key", lambda a, t: a.query_by_uniq_key(t, "")),
    ("page size 0", "page_size", lambda a, t: list(a.iter_key(t, "k", page_size=0))),
    ("page size over the cap", "page_size", lambda a, t: list(a.iter_key(t, "k", page_size=1025))),
    ("negative offset", "offset", lambda a, t: a.commit_offset("g", t, 0, -1)),
    ("group", "group", lambda a, t: a.commit_offset("bad group", t, 0, 1)),
    ("reset target", "to", lambda a, t: a.reset_group_offsets("g", t, "middle")),  # type: ignore[arg-type]
    ("negative reset", "to", lambda a, t: a.reset_group_offsets("g", t, -1)),
    ("boolean reset", "to", lambda a, t: a.reset_group_offsets("g", t, True)),
    ("timestamp side", "boundary", lambda a, t: a.reset_group_offsets("g", t, Timestamp(0, "x"))),
    ("msg id", "msg_id", lambda a, t: a.get_message("zz")),
]


@pytest.mark.parametrize(
    ("field", "call"), [(f, c) for _, f, c in BAD_CALLS], ids=[n for n, _, _ in BAD_CALLS]
)
def test_bad_arguments_raise_invalid_argument_naming_the_field(
    settings: ClientSettings, cluster: Cluster, topic: str, field: str, call: Callable[..., object]
) -> None:
    append(cluster.commitlog_stub(), topic, [0], [b"a"])
    with Admin(settings) as admin:
        settle(admin)
        with pytest.raises(InvalidArgument) as caught:
            call(admin, topic)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.field == field
    assert isinstance(caught.value, domain.InvalidArgument)


# -- connections ----------------------------------------------------------------------------------


def test_admin_closes_its_own_connection_and_leaves_a_shared_one_open(
    settings: ClientSettings,
) -> None:
    with Connection(settings) as conn:
        with Admin(conn) as shared:
            assert shared.connection is conn
            shared.topics()
        assert isinstance(Admin(conn).topics(), list)  # still open

    own = Admin(settings)
    own.topics()
    own.close()
    with pytest.raises(ClientError) as caught:
        own.topics()
    assert caught.value.code == grpc.StatusCode.CANCELLED


def test_a_call_on_a_closed_connection_raises_cancelled(settings: ClientSettings) -> None:
    own = Admin(settings)
    own.close()
    with pytest.raises(Cancelled):
        own.topics()


def test_no_consume_queue_address_raises_failed_precondition(settings: ClientSettings) -> None:
    admin = Admin(ClientSettings(commitlog=settings.commitlog, cq=()))
    with admin, pytest.raises(FailedPrecondition):
        admin.topics()


# -- shards and replicas --------------------------------------------------------------------------


def index_settings(c: Cluster, *names: str) -> ClientSettings:
    return ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=tuple(c.followers[n].target for n in names),
    )


def test_queries_go_to_the_shard_of_the_key_and_the_wrong_shard_refuses(
    fresh_cluster: Cluster,
) -> None:
    c = fresh_cluster
    topic = "sharded"
    for i in range(2):
        c.add("index_svc", f"s{i}", "--shard-count", "2", "--shard-index", str(i), *INDEX_ARGS)
        c.start(f"s{i}")
    n = 40
    sent = append(
        c.commitlog_stub(),
        topic,
        [i % 4 for i in range(n)],
        [b"m%d" % i for i in range(n)],
        keys=[f"k{i}" for i in range(n)],
        uniq_keys=[f"u{i}" for i in range(n)],
    )
    shards = {i: shard_of(topic, f"k{i}", 2) for i in range(n)}
    assert set(shards.values()) == {0, 1}

    with Admin(index_settings(c, "s0", "s1")) as admin:
        status = settle(admin)
        assert sorted((r.shard_count, r.shard_index) for r in status.index) == [(2, 0), (2, 1)]
        for i, s in enumerate(sent):
            assert offsets(admin.query_by_key(topic, f"k{i}")) == [s.commit_log_offset]
            assert [m.body for m in admin.query_by_uniq_key(topic, f"u{i}")] == [b"m%d" % i]
        assert len(list(admin.iter_key(topic, "k7", page_size=1))) == 1

        # Asked directly, a replica refuses another shard's key and names the right shard.
        wrong = next(i for i in range(n) if shards[i] == 0)
        conn = admin.connection
        with pytest.raises(FailedPrecondition) as caught:
            conn.call(
                conn.index(c.followers["s1"].target).QueryByKey,
                ix.QueryByKeyRequest(topic=topic, key=f"k{wrong}"),
                name="Index/QueryByKey",
            )
        assert "key belongs to shard 0 of 2, this is shard 1" in caught.value.details
        wrong_uniq = next(f"u{i}" for i in range(n) if shard_of(topic, f"u{i}", 2) == 0)
        with pytest.raises(FailedPrecondition) as caught:
            conn.call(
                conn.index(c.followers["s1"].target).QueryByUniqKey,
                ix.QueryByUniqKeyRequest(topic=topic, uniq_key=wrong_uniq),
                name="Index/QueryByUniqKey",
            )
        assert "key belongs to shard 0 of 2" in caught.value.details

        # A shard with no replica left fails naming the shard; the other shard still answers.
        c.followers["s1"].stop()
        on_1 = next(i for i in range(n) if shards[i] == 1)
        with pytest.raises(Unavailable) as down:
            admin.query_by_key(topic, f"k{on_1}")
        assert "index shard 1 of 2" in str(down.value)
        assert offsets(admin.query_by_key(topic, f"k{wrong}")) == [sent[wrong].commit_log_offset]
        status = admin.status()
        (gone,) = [r for r in status.index if not r.reachable]
        assert gone.address == c.followers["s1"].target
        assert "UNAVAILABLE" in gone.error

    # Replicas that disagree on shard_count are a deployment error, named as such.
    with Admin(index_settings(c, "s0", "index")) as admin:
        with pytest.raises(FailedPrecondition) as caught:
            admin.query_by_key(topic, "k0")
        assert "disagree on shard_count" in caught.value.details


def test_a_query_moves_to_another_replica_of_the_shard_when_one_is_down(
    fresh_cluster: Cluster,
) -> None:
    c = fresh_cluster
    topic = "replicated"
    c.add("index_svc", "index-b", *INDEX_ARGS)
    c.start("index-b")
    sent = append(c.commitlog_stub(), topic, [0, 1], [b"a", b"b"], keys=["k", "k"])
    expected = sent_offsets_newest_first(sent)
    with Admin(index_settings(c, "index", "index-b")) as admin:
        settle(admin)
        assert offsets(admin.query_by_key(topic, "k")) == expected  # shards discovered
        c.followers["index"].stop()  # the replica listed first
        assert offsets(admin.query_by_key(topic, "k")) == expected
        assert offsets(list(admin.iter_key(topic, "k", page_size=1))) == expected

        # status() still answers, showing the stopped replica as unreachable.
        s = admin.status()
        assert s.unreachable == [c.followers["index"].target]
        down, up = s.index
        assert (down.reachable, up.reachable) == (False, True)
        assert down.error and up.error == ""
        assert json.loads(json.dumps(s.to_json()))["index"][0]["reachable"] is False

    # A new Admin that cannot reach the first replica at discovery finds the shard anyway.
    with Admin(index_settings(c, "index", "index-b")) as admin:
        assert offsets(admin.query_by_key(topic, "k")) == expected
        c.followers["index-b"].stop()
        with pytest.raises(Unavailable) as caught:
            admin.query_by_key(topic, "k")
        assert "index shard 0 of 1" in str(caught.value)

    # The default cluster view (one cq, one index) with its index stopped.
    with Admin(settings_for(c)) as admin:
        s = admin.status()
        assert [r.reachable for r in s.cq] == [True]
        assert [r.reachable for r in s.index] == [False]
        assert isinstance(s.index[0].error, str) and s.index[0].error
        with pytest.raises(ClientError) as caught:
            admin.query_by_key(topic, "k")
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE
