"""format("mqstore") as a user of Spark's Kafka connector expects it, against real services:
several topics (topics / subscribe / subscribePattern), a missing topic named, Kafka's columns,
startingOffsetsByTimestampStrategy, offsets past a queue's end under failOnDataLoss,
minOffsetsPerTrigger / maxTriggerDelay, and the lag in a streaming query's progress."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.client import Producer
from mqstore.spark.options import BadOption, Subscription, read_options
from mqstore.testing.cluster import Cluster, start_store
from tests.spark.conftest import connection_options
from tests.spark.test_service_read import _settings, _wait_dispatched

pytest.importorskip("pyspark")

QUERY_TIMEOUT_S = 60
WAIT_S = 30  # for a processing-time query to show a batch
# How long a query held back by minOffsetsPerTrigger is watched not to run a batch: many of
# its 100 ms triggers.
HELD_BACK_S = 1.5
POLL_S = 0.25


def produce(c: Cluster, topic: str, queues: int, per_queue: int, tag: str = "m") -> None:
    """`per_queue` messages into each of queues 0..queues-1, with a key, tags and a property."""
    ends: dict[int, int] = {}
    with Producer(_settings(c)) as p:
        futures = [
            p.send(
                topic,
                f"{tag}-{q}-{i}".encode(),
                queue_id=q,
                key=f"k{q}-{i}",
                tags="t1",
                properties={"wave": tag},
            )
            for i in range(per_queue)
            for q in range(queues)
        ]
        for f in futures:
            r = f.result(timeout=30)
            ends[r.queue_id] = max(ends.get(r.queue_id, 0), r.queue_offset + 1)
    _wait_dispatched(c, topic, ends)


def read(spark: Any, c: Cluster, **options: str) -> Any:
    r = spark.read.format("mqstore")
    for k, v in {**connection_options(c), **options}.items():
        r = r.option(k, v)
    return r.load()


def stream(spark: Any, c: Cluster, **options: str) -> Any:
    r = spark.readStream.format("mqstore")
    for k, v in {**connection_options(c), **options}.items():
        r = r.option(k, v)
    return r.load()


def to_memory(df: Any, name: str, tmp_path: Path) -> Any:
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
    )


def finish(writer: Any) -> Any:
    q = writer.trigger(availableNow=True).start()
    assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not finish"
    return q


def to_parquet(df: Any, tmp_path: Path) -> Any:
    """A sink that a query restarted from its checkpoint goes on writing (memory cannot)."""
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )


def rows_of(spark: Any, name: str) -> list[tuple[str, int, int]]:
    got = spark.sql(f"SELECT topic, queueId, queueOffset FROM {name}").collect()
    return sorted((r[0], r[1], r[2]) for r in got)


def parquet_rows(spark: Any, tmp_path: Path) -> list[tuple[str, int, int]]:
    got = spark.read.parquet(str(tmp_path / "out")).select("topic", "queueId", "queueOffset")
    return sorted((r[0], r[1], r[2]) for r in got.collect())


def wait_until(query: Any, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Until `check()` holds while `query` runs; the query's own error if it stopped. Checks
    only once the query made progress: a query polled from its start failed to start its
    source's Python process in time (Spark's connect-back timeout) on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.lastProgress is None:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(POLL_S)
    while not check():
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(POLL_S)


def every(topic: str, queues: int, per_queue: int, first: int = 0) -> list[tuple[str, int, int]]:
    return [(topic, q, o) for q in range(queues) for o in range(first, per_queue)]


@pytest.fixture(scope="module")
def topics(mqstore_cluster: Cluster) -> Iterator[None]:
    """kp-multi-a (2 queues x 3), kp-multi-b (1 x 2), and kp-other (1 x 1) beside them."""
    produce(mqstore_cluster, "kp-multi-a", 2, 3)
    produce(mqstore_cluster, "kp-multi-b", 1, 2)
    produce(mqstore_cluster, "kp-other", 1, 1)
    yield


# -- several topics ------------------------------------------------------------------------------


def test_topics_subscribe_and_pattern_read_every_topic_they_name(
    spark: Any, mqstore_cluster: Cluster, topics: None
) -> None:
    want = every("kp-multi-a", 2, 3) + every("kp-multi-b", 1, 2)
    for options in (
        {"topics": "kp-multi-a, kp-multi-b"},
        {"subscribe": "kp-multi-b,kp-multi-a"},
        {"subscribePattern": "kp-multi-.*"},
    ):
        df = read(spark, mqstore_cluster, **options)
        got = sorted(
            (r[0], r[1], r[2]) for r in df.select("topic", "queueId", "queueOffset").collect()
        )
        assert got == want, options
    # Offsets per topic, in Kafka's JSON; a topic not given starts at its earliest.
    df = read(
        spark,
        mqstore_cluster,
        subscribePattern="kp-multi-.*",
        startingOffsets=json.dumps({"kp-multi-a": {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({"kp-multi-b": {"0": 1}}),
    )
    got = sorted((r[0], r[1], r[2]) for r in df.select("topic", "queueId", "queueOffset").collect())
    assert got == [("kp-multi-a", 0, 2), *every("kp-multi-a", 2, 3)[3:], ("kp-multi-b", 0, 0)]


def test_a_topic_that_does_not_exist_is_an_error_naming_it(
    spark: Any, mqstore_cluster: Cluster, topics: None, tmp_path: Path
) -> None:
    with pytest.raises(Exception, match="topic 'kp-nosuch' has no consume queues"):
        read(spark, mqstore_cluster, topic="kp-nosuch").collect()
    with pytest.raises(Exception, match="topic 'kp-nosuch-2' has no consume queues"):
        read(spark, mqstore_cluster, topics="kp-multi-a,kp-nosuch-2").collect()
    with pytest.raises(Exception, match="has no queue 7"):
        read(spark, mqstore_cluster, topic="kp-multi-a", queues="0,7").collect()
    with pytest.raises(Exception, match="topic 'kp-nosuch' has no consume queues"):
        finish(to_memory(stream(spark, mqstore_cluster, topic="kp-nosuch"), "kp_nosuch", tmp_path))
    # A pattern is what there is, as Kafka's: matching nothing reads nothing.
    assert read(spark, mqstore_cluster, subscribePattern="kp-nosuch.*").count() == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "a", "topics": "b"}, "give one of topic, topics, subscribe, subscribePattern"),
        ({"topic": "a,b"}, "names several topics"),
        ({"subscribePattern": "kp-("}, "not a regular expression"),
        ({"topics": "a,b", "queues": "0"}, "is for a read of one topic"),
        ({"topics": "a,b", "startingOffsets": '{"0": 1}'}, "covers several topics"),
        ({"topics": "a,b", "startingOffsets": '{"c": {"0": 1}}'}, r"names topics \['c'\]"),
        ({"topic": "a", "columns": "avro"}, "not one of mqstore, kafka"),
        ({"topic": "a", "includeHeaders": "true"}, "is for columns=kafka"),
        ({"topic": "a", "startingOffsetsByTimestampStrategy": "x"}, "not one of error, latest"),
    ],
)
def test_bad_subscription_and_column_options_name_the_option(
    spark: Any, mqstore_cluster: Cluster, options: dict[str, str], message: str
) -> None:
    with pytest.raises(Exception, match=message):
        read(spark, mqstore_cluster, **options).collect()


def test_a_pattern_stream_reads_a_topic_created_while_it_runs(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    produce(mqstore_cluster, "kp-grow-a", 1, 2)
    writer = to_parquet(
        stream(spark, mqstore_cluster, subscribePattern="kp-grow-.*", startingOffsets="earliest"),
        tmp_path,
    )
    finish(writer)
    assert parquet_rows(spark, tmp_path) == every("kp-grow-a", 1, 2)
    produce(mqstore_cluster, "kp-grow-b", 2, 2)
    produce(mqstore_cluster, "kp-grow-a", 1, 1, tag="n")
    finish(writer)  # the same checkpoint: the new topic from its start, the old one on
    assert parquet_rows(spark, tmp_path) == every("kp-grow-a", 1, 3) + every("kp-grow-b", 2, 2)


# -- Kafka's columns -----------------------------------------------------------------------------


def kafka_connector_schema(headers: bool) -> Any:
    """The Kafka connector's source schema (Structured Streaming + Kafka Integration Guide)."""
    from pyspark.sql.types import (  # noqa: PLC0415 (pyspark may be missing: skip)
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if headers:
        pair = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(pair)))
    return StructType(fields)


def test_kafka_columns_let_kafka_code_run_unchanged(
    spark: Any, mqstore_cluster: Cluster, topics: None
) -> None:
    df = read(spark, mqstore_cluster, topics="kp-multi-a,kp-multi-b", columns="kafka")
    assert df.schema == kafka_connector_schema(headers=False)
    # Kafka code, as written for format("kafka").
    rows = df.selectExpr(
        "CAST(key AS STRING)", "CAST(value AS STRING)", "topic", "partition", "offset"
    ).collect()
    assert sorted(tuple(r) for r in rows) == sorted(
        [
            (f"k{q}-{i}", f"m-{q}-{i}", t, q, i)
            for t, queues, n in (("kp-multi-a", 2, 3), ("kp-multi-b", 1, 2))
            for q in range(queues)
            for i in range(n)
        ]
    )
    native = {
        (r.topic, r.queueId, r.queueOffset): r.storeTimestamp
        for r in read(spark, mqstore_cluster, topic="kp-multi-a").collect()
    }
    for r in df.where("topic = 'kp-multi-a'").collect():
        assert r.timestamp == native[(r.topic, r.partition, r.offset)]
        assert r.timestampType == 1  # LogAppendTime: the store's time

    with_headers = read(
        spark, mqstore_cluster, subscribe="kp-multi-b", columns="kafka", includeHeaders="true"
    )
    assert with_headers.schema == kafka_connector_schema(headers=True)
    first = with_headers.where("offset = 0").collect()[0]
    headers = {h.key: bytes(h.value) for h in first.headers}
    assert headers["wave"] == b"m" and headers["TAGS"] == b"t1" and headers["KEYS"] == b"k0-0"
    assert "UNIQ_KEY" in headers


def test_kafka_columns_stream(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path, topics: None
) -> None:
    df = stream(
        spark, mqstore_cluster, topic="kp-multi-b", columns="kafka", startingOffsets="earliest"
    )
    assert df.schema == kafka_connector_schema(headers=False)
    finish(to_memory(df.selectExpr("CAST(value AS STRING) AS v"), "kp_kafka_stream", tmp_path))
    got = [r.v for r in spark.sql("SELECT v FROM kp_kafka_stream").collect()]
    assert sorted(got) == ["m-0-0", "m-0-1"]


# -- starting times, offsets past the end --------------------------------------------------------


def test_starting_timestamp_strategy_error_or_latest(
    spark: Any, mqstore_cluster: Cluster, topics: None, tmp_path: Path
) -> None:
    future = str(int(time.time() * 1000) + 3_600_000)
    with pytest.raises(Exception, match="no message was stored at or after"):
        read(spark, mqstore_cluster, topic="kp-multi-a", startingTimestamp=future).collect()
    late = read(
        spark,
        mqstore_cluster,
        topic="kp-multi-a",
        startingTimestamp=future,
        startingOffsetsByTimestampStrategy="latest",
    )
    assert late.count() == 0
    by_queue = json.dumps({"kp-multi-a": {"0": 0, "1": int(future)}})
    with pytest.raises(Exception, match="topic 'kp-multi-a' queue 1: no message"):
        read(
            spark, mqstore_cluster, topic="kp-multi-a", startingOffsetsByTimestamp=by_queue
        ).count()
    with pytest.raises(Exception, match="no message was stored at or after"):
        finish(
            to_memory(
                stream(spark, mqstore_cluster, topic="kp-multi-a", startingTimestamp=future),
                "kp_ts_error",
                tmp_path,
            )
        )


def test_a_start_past_a_queues_end_follows_fail_on_data_loss(
    spark: Any, mqstore_cluster: Cluster, topics: None, tmp_path: Path
) -> None:
    past = json.dumps({"kp-multi-a": {"0": 50, "1": 0}})
    with pytest.raises(Exception, match="offset 50 is past the queue's end 3") as err:
        read(spark, mqstore_cluster, topic="kp-multi-a", startingOffsets=past).collect()
    assert "failOnDataLoss=false" in str(err.value)
    lenient = read(
        spark, mqstore_cluster, topic="kp-multi-a", startingOffsets=past, failOnDataLoss="false"
    )
    got = sorted((r.queueId, r.queueOffset) for r in lenient.collect())
    assert got == [(1, 0), (1, 1), (1, 2)]  # queue 0 skipped, queue 1 read


@pytest.mark.slow  # a second store, or a query watched for seconds
def test_a_checkpoint_past_the_queues_end_follows_fail_on_data_loss(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A query resumed against a store whose queue holds fewer messages than its checkpoint
    says (rebuilt: here another store): Kafka's data loss."""
    topic = "kp-rebuilt"
    produce(mqstore_cluster, topic, 1, 5)

    def writer(c: Cluster, **options: str) -> Any:
        df = stream(spark, c, topic=topic, startingOffsets="earliest", **options)
        return to_parquet(df, tmp_path)

    finish(writer(mqstore_cluster))
    assert len(parquet_rows(spark, tmp_path)) == 5
    other = start_store(tmp_path_factory.mktemp("rebuilt"))
    try:
        produce(other, topic, 1, 2, tag="new")
        with pytest.raises(Exception, match="offset 5 is past the queue's end 2"):
            finish(writer(other))
        finish(writer(other, failOnDataLoss="false"))  # goes on from the queue's end, 2
        produce(other, topic, 1, 1, tag="newer")
        finish(writer(other, failOnDataLoss="false"))
        out = spark.read.parquet(str(tmp_path / "out"))
        bodies = [bytes(r[0]) for r in out.select("body").collect()]
    finally:
        other.stop_all()
    assert sorted(bodies) == sorted([f"m-0-{i}".encode() for i in range(5)] + [b"newer-0-0"])


# -- read limits ---------------------------------------------------------------------------------


def count_of(spark: Any, name: str) -> int:
    return int(spark.sql(f"SELECT count(*) FROM {name}").collect()[0][0])


@pytest.mark.slow  # a second store, or a query watched for seconds
def test_min_offsets_per_trigger_holds_small_batches_back(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic, name = "kp-min", "kp_min"
    produce(mqstore_cluster, topic, 1, 2)
    df = stream(
        spark,
        mqstore_cluster,
        topic=topic,
        startingOffsets="earliest",
        minOffsetsPerTrigger="4",
        maxTriggerDelay="10m",
    )
    q = to_memory(df, name, tmp_path).trigger(processingTime="100 milliseconds").start()
    wait_until(q, lambda: count_of(spark, name) == 2)  # the first trigger runs a batch (Kafka's)
    produce(mqstore_cluster, topic, 1, 3, tag="b")  # 3 new: under the minimum
    time.sleep(HELD_BACK_S)
    assert count_of(spark, name) == 2
    produce(mqstore_cluster, topic, 1, 1, tag="c")  # 4 new: a batch
    wait_until(q, lambda: count_of(spark, name) == 6)
    q.stop()


@pytest.mark.slow  # a second store, or a query watched for seconds
def test_max_trigger_delay_lets_a_small_batch_run(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic, name = "kp-delay", "kp_delay"
    produce(mqstore_cluster, topic, 1, 1)
    df = stream(
        spark,
        mqstore_cluster,
        topic=topic,
        startingOffsets="earliest",
        minOffsetsPerTrigger="1000",
        maxTriggerDelay="1s",
    )
    q = to_memory(df, name, tmp_path).trigger(processingTime="100 milliseconds").start()
    wait_until(q, lambda: count_of(spark, name) == 1)
    produce(mqstore_cluster, topic, 1, 1, tag="b")
    wait_until(q, lambda: count_of(spark, name) == 2)  # within the delay of the last batch
    q.stop()


def test_progress_shows_the_latest_offset_and_the_lag(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    from mqstore.spark.service_source import offsets_behind  # noqa: PLC0415 - needs pyspark (the module skips without it)

    topic = "kp-lag"
    produce(mqstore_cluster, topic, 2, 10)
    df = stream(
        spark, mqstore_cluster, topic=topic, startingOffsets="earliest", maxOffsetsPerTrigger="5"
    )
    q = finish(to_memory(df, "kp_lag", tmp_path))
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in progress] == [5, 5, 5, 5]
    first = progress[0]["sources"][0]
    assert json.loads(first["latestOffset"]) == {topic: {"0": 10, "1": 10}}
    assert json.loads(first["endOffset"]) == {topic: {"0": 3, "1": 2}}
    assert offsets_behind(first) == {
        "minOffsetsBehindLatest": 7,
        "maxOffsetsBehindLatest": 8,
        "avgOffsetsBehindLatest": 7.5,
    }
    last = progress[-1]["sources"][0]
    assert offsets_behind(last) == {
        "minOffsetsBehindLatest": 0,
        "maxOffsetsBehindLatest": 0,
        "avgOffsetsBehindLatest": 0.0,
    }
    # Spark's own `metrics` stays empty for a Python source (no ReportsSourceMetrics in
    # PySpark 4.x): should that change, this test says so and the docs need updating.
    assert not first["metrics"]


# -- parsing, without a session ------------------------------------------------------------------


def test_subscription_limits_and_durations_parse_as_kafkas() -> None:
    def parse(streaming: bool = True, **options: str) -> Any:
        return read_options(options, streaming=streaming, env={})

    assert parse(topics="a, b,a").subscription.topics == ("a", "b")
    sub = parse(subscribePattern="orders-.*").subscription
    assert sub.covers("orders-eu") and not sub.covers("x-orders-eu") and sub.single is None
    assert parse(topic="a", maxTriggerDelay="30s").max_trigger_delay_ms == 30_000
    assert parse(topic="a", maxTriggerDelay="2h").max_trigger_delay_ms == 7_200_000
    assert parse(topic="a", maxTriggerDelay="500").max_trigger_delay_ms == 500
    assert parse(topic="a").max_trigger_delay_ms == 15 * 60_000  # Kafka's 15m
    assert parse(topic="a").timestamp_strategy == "error"
    for options, option in (
        ({"topic": "a", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        (
            {"topic": "a", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "8"},
            "minOffsetsPerTrigger",
        ),
        ({"topic": "a", "minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger"),
        ({"topics": " , "}, "topics"),
    ):
        with pytest.raises(BadOption) as err:
            parse(**options)
        assert err.value.field == option
    with pytest.raises(BadOption, match="streaming reads only"):
        parse(streaming=False, topic="a", minOffsetsPerTrigger="5")


def test_a_checkpoint_of_a_one_topic_read_without_topic_names_is_still_read() -> None:
    from mqstore.spark.service_source import _offsets_of  # noqa: PLC0415 - needs pyspark (the module skips without it)

    assert _offsets_of({"0": 4, "1": 2}, Subscription(("t",))) == {("t", 0): 4, ("t", 1): 2}
    assert _offsets_of({"t": {"0": 4}}, Subscription(("t", "u"))) == {("t", 0): 4}
    with pytest.raises(BadOption, match="name no topic"):
        _offsets_of({"0": 4}, Subscription(("t", "u")))


def test_offsets_behind_reads_a_progress_dict_or_json() -> None:
    from mqstore.spark.service_source import offsets_behind  # noqa: PLC0415 - needs pyspark (the module skips without it)

    source = {
        "endOffset": {"t": {"0": 3, "1": 9}},
        "latestOffset": json.dumps({"t": {"0": 10, "1": 10, "2": 4}}),
    }
    assert offsets_behind(source) == {
        "minOffsetsBehindLatest": 1,
        "maxOffsetsBehindLatest": 7,
        "avgOffsetsBehindLatest": 4.0,
    }
    assert offsets_behind({"endOffset": {"t": {"0": 3}}, "latestOffset": None}) is None
