"""format("mqstore") as a streaming source against real services: offsets per queue as JSON,
maxOffsetsPerTrigger under Trigger.AvailableNow, and exactly once into a parquet file sink
across a failed batch and restarts from the checkpoint."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mqstore.client import Producer
from mqstore.testing.cluster import Cluster
from tests.spark.conftest import connection_options
from tests.spark.test_service_read import _settings, _wait_dispatched
from tests.spark.test_service_write import all_bodies

pytest.importorskip("pyspark")

QUEUES = 3
QUERY_TIMEOUT_S = 60


def produce(c: Cluster, topic: str, per_queue: int, tag: str) -> None:
    ends: dict[int, int] = {}
    with Producer(_settings(c)) as p:
        futures = [
            p.send(topic, f"{tag}-{q}-{i}".encode(), queue_id=q)
            for i in range(per_queue)
            for q in range(QUEUES)
        ]
        for f in futures:
            r = f.result(timeout=30)
            ends[r.queue_id] = max(ends.get(r.queue_id, 0), r.queue_offset + 1)
    _wait_dispatched(c, topic, ends)


def stream(spark: Any, c: Cluster, topic: str, **options: str) -> Any:
    r = spark.readStream.format("mqstore").option("topic", topic)
    for k, v in {**connection_options(c), **options}.items():
        r = r.option(k, v)
    return r.load()


def logged(directory: Path) -> list[str]:
    """Batch ids in a checkpoint's offsets/ or commits/ (without Hadoop's .crc files)."""
    return sorted((n for n in os.listdir(directory) if not n.startswith(".")), key=int)


def to_parquet(df: Any, tmp_path: Path) -> Any:
    return (
        df.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )


def run_available_now(writer: Any) -> Any:
    q = writer.trigger(availableNow=True).start()
    assert q.awaitTermination(QUERY_TIMEOUT_S), "the availableNow query did not finish"
    return q


def test_available_now_in_batches_of_max_offsets_per_trigger(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-stream-limit"
    produce(mqstore_cluster, topic, 10, "a")
    df = stream(spark, mqstore_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger="7")
    q = run_available_now(
        df.writeStream.format("memory")
        .queryName("mqstore_limit")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
    )
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [7, 7, 7, 7, 2]
    rows = spark.sql("SELECT queueId, queueOffset FROM mqstore_limit").collect()
    assert sorted((r[0], r[1]) for r in rows) == [(q, o) for q in range(QUEUES) for o in range(10)]
    # The checkpoint's offsets are Kafka's JSON form, one entry per queue of each topic.
    last = logged(tmp_path / "ckpt" / "offsets")[-1]
    text = (tmp_path / "ckpt" / "offsets" / last).read_text().splitlines()[-1]
    assert json.loads(text) == {topic: {"0": 10, "1": 10, "2": 10}}


def test_latest_start_sees_only_new_messages(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-stream-latest"
    produce(mqstore_cluster, topic, 4, "old")
    # A new query starts at "latest" by default.
    writer = to_parquet(stream(spark, mqstore_cluster, topic), tmp_path)
    run_available_now(writer)
    assert spark.read.parquet(str(tmp_path / "out")).count() == 0
    produce(mqstore_cluster, topic, 2, "new")
    run_available_now(writer)
    got = spark.read.parquet(str(tmp_path / "out")).select("body").collect()
    bodies = {bytes(r[0]).decode() for r in got}
    assert bodies == {f"new-{q}-{i}" for q in range(QUEUES) for i in range(2)}


def test_exactly_once_into_parquet_across_a_failed_batch_and_restarts(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, udf  # noqa: PLC0415 (pyspark may be missing: skip)
    from pyspark.sql.types import BinaryType  # noqa: PLC0415 - pyspark may be missing: skip

    topic = "spark-stream-once"
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    marker = tmp_path / "fail"
    marker.write_text("on")
    marker_path = str(marker)
    poison = b"a-2-9"  # the last message of queue 2: in the third batch of 4+4+2 per queue

    def check(body):  # type: ignore[no-untyped-def]  # no hints: PySpark would read them
        if body == poison and os.path.exists(marker_path):
            raise RuntimeError("injected failure while the batch is written")
        return body

    produce(mqstore_cluster, topic, 10, "a")

    def start() -> Any:
        df = stream(
            spark, mqstore_cluster, topic, startingOffsets="earliest", maxOffsetsPerTrigger="12"
        )
        return (
            df.withColumn("body", udf(check, BinaryType())(col("body")))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )

    # Run 1: batches 0 and 1 commit, batch 2 fails after its offsets were logged.
    q = start()
    with pytest.raises(Exception, match="injected failure"):
        q.awaitTermination(QUERY_TIMEOUT_S)
    assert logged(ckpt / "commits") == ["0", "1"]
    assert logged(ckpt / "offsets") == ["0", "1", "2"]
    assert spark.read.parquet(str(out)).count() == 24

    # Run 2: the failed batch is replayed from the logged offsets, then the new messages.
    marker.unlink()
    produce(mqstore_cluster, topic, 5, "b")
    q = start()
    assert q.awaitTermination(QUERY_TIMEOUT_S)

    # Run 3: nothing new, nothing written.
    q = start()
    assert q.awaitTermination(QUERY_TIMEOUT_S)

    rows = spark.read.parquet(str(out)).select("queueId", "queueOffset", "body").collect()
    keys = [(r[0], r[1]) for r in rows]
    assert len(keys) == len(set(keys)) == QUEUES * 15
    assert sorted(keys) == [(q, o) for q in range(QUEUES) for o in range(15)]
    bodies = {bytes(r[2]).decode() for r in rows}
    assert bodies == {
        f"{t}-{q}-{i}" for t, n in (("a", 10), ("b", 5)) for q in range(3) for i in range(n)
    }


def test_a_queue_appearing_mid_stream_is_read_from_its_start(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-stream-newq"
    with Producer(_settings(mqstore_cluster)) as p:
        p.send(topic, b"q0", queue_id=0).result(timeout=30)
    _wait_dispatched(mqstore_cluster, topic, {0: 1})
    writer = to_parquet(stream(spark, mqstore_cluster, topic, startingOffsets="earliest"), tmp_path)
    run_available_now(writer)
    with Producer(_settings(mqstore_cluster)) as p:
        for f in [p.send(topic, f"q5-{i}".encode(), queue_id=5) for i in range(3)]:
            f.result(timeout=30)
    _wait_dispatched(mqstore_cluster, topic, {0: 1, 5: 3})
    run_available_now(writer)
    rows = spark.read.parquet(str(tmp_path / "out")).select("queueId", "queueOffset").collect()
    assert sorted((r[0], r[1]) for r in rows) == [(0, 0), (5, 0), (5, 1), (5, 2)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"endingOffsets": "latest"}, "batch reads only"),
        ({"startingOffsets": '{"0": -3}'}, "startingOffsets"),
    ],
)
def test_bad_stream_options_are_refused_clearly(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    df = stream(spark, mqstore_cluster, "spark-stream-bad", **options)
    with pytest.raises(Exception, match=message):
        q = (
            df.writeStream.format("memory")
            .queryName("mqstore_bad")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(QUERY_TIMEOUT_S)


def test_stream_write_exactly_once_into_a_topic_across_a_failed_batch(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col, udf  # noqa: PLC0415 (pyspark may be missing: skip)
    from pyspark.sql.types import BinaryType  # noqa: PLC0415 - pyspark may be missing: skip

    source, target = "spark-sw-from", "spark-sw-to"
    marker = tmp_path / "fail"
    marker.write_text("on")
    marker_path = str(marker)
    poison = b"a-0-8"  # late in queue 0's first batch: earlier rows are appended before it

    def blank(body):  # type: ignore[no-untyped-def]  # no hints: PySpark would read them
        # A null body makes the writer fail after the appends of the rows before it.
        return None if body == poison and os.path.exists(marker_path) else body

    produce(mqstore_cluster, source, 10, "a")

    def start() -> Any:
        df = stream(spark, mqstore_cluster, source, startingOffsets="earliest")
        w = (
            df.select(udf(blank, BinaryType())(col("body")).alias("body"), "queueId")
            .writeStream.format("mqstore")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
        )
        for k, v in {**connection_options(mqstore_cluster), "topic": target}.items():
            w = w.option(k, v)
        return w.option("writeBatchMessages", "2").start()

    q = start()
    with pytest.raises(Exception, match="null body"):
        q.awaitTermination(QUERY_TIMEOUT_S)
    partial = all_bodies(mqstore_cluster, target)
    assert {f"a-0-{i}".encode() for i in range(8)} <= set(partial)  # appended before the failure
    marker.unlink()
    produce(mqstore_cluster, source, 3, "b")
    q = start()  # replays the failed batch, then the new messages
    assert q.awaitTermination(QUERY_TIMEOUT_S)
    bodies = all_bodies(mqstore_cluster, target)
    want = [
        f"{t}-{q}-{i}".encode()
        for t, n in (("a", 10), ("b", 3))
        for q in range(3)
        for i in range(n)
    ]
    assert sorted(bodies) == sorted(want)
