"""format("mqstore") batch writes against real services: write then read back, and retries
that store nothing twice (the commit log's producer idempotence, per writeId and partition)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import mqstore.spark as mqstore_spark
from mqstore.client import Admin, Consumer, Producer
from mqstore.spark.options import write_options
from mqstore.testing.cluster import Cluster
from tests.spark.conftest import connection_options
from tests.spark.test_service_read import _settings, reader

pytest.importorskip("pyspark")


def writer(df: Any, c: Cluster, **options: str) -> Any:
    w = df.write.format("mqstore").mode("append")
    for k, v in {**connection_options(c), **options}.items():
        w = w.option(k, v)
    return w


def caught_up(c: Cluster, timeout_s: float = 20) -> None:
    """Wait until the consume queues hold everything the commit log has stored."""
    deadline = time.monotonic() + timeout_s
    with Admin(_settings(c)) as a:
        while True:
            st = a.status()
            if all(r.applied_offset >= st.commitlog.max_offset for r in st.cq):
                return
            assert time.monotonic() < deadline, f"cq behind the log: {st.to_json()}"
            time.sleep(0.02)


def all_bodies(c: Cluster, topic: str) -> list[bytes]:
    caught_up(c)
    with Consumer(_settings(c), topic, start="earliest", long_poll_ms=0) as consumer:
        return [m.body for m in consumer.messages(follow=False)]


def test_write_then_read_back_every_column(
    spark: Any, mqstore_cluster: Cluster, tmp_path: Path
) -> None:
    topic = "spark-write-cols"
    rows = [
        (f"body-{i}".encode(), i % 3 if i % 5 else None, f"t{i % 2}", [f"key-{i}"], {"n": str(i)})
        for i in range(50)
    ]
    df = spark.createDataFrame(
        rows,
        "body binary, queueId int, tags string, keys array<string>, properties map<string,string>",
    ).repartition(2)
    writer(df, mqstore_cluster, topic=topic, queuesPerTopic="3").save()
    caught_up(mqstore_cluster)
    got = reader(spark, mqstore_cluster, topic).collect()
    assert len(got) == 50
    for row in got:
        i = int(bytes(row["body"]).decode().split("-")[1])
        assert row["tags"] == f"t{i % 2}"
        assert row["keys"] == [f"key-{i}"]
        assert row["properties"]["n"] == str(i)
        if i % 5:
            assert row["queueId"] == i % 3
        assert 0 <= row["queueId"] < 3


def test_topic_column_and_string_body(spark: Any, mqstore_cluster: Cluster) -> None:
    df = spark.createDataFrame(
        [("spark-write-a", "one"), ("spark-write-b", "two"), ("spark-write-a", "three")],
        "topic string, body string",
    )
    writer(df, mqstore_cluster).save()
    # The option overrides the column (as Kafka's sink).
    writer(df, mqstore_cluster, topic="spark-write-c").save()
    assert sorted(all_bodies(mqstore_cluster, "spark-write-a")) == [b"one", b"three"]
    assert all_bodies(mqstore_cluster, "spark-write-b") == [b"two"]
    assert sorted(all_bodies(mqstore_cluster, "spark-write-c")) == [b"one", b"three", b"two"]


def test_the_same_write_twice_with_one_write_id_stores_once(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    topic = "spark-write-twice"
    df = spark.range(0, 300, numPartitions=2).selectExpr(
        "CAST(CAST(id AS STRING) AS BINARY) AS body"
    )
    options = {"topic": topic, "writeId": "job-7", "writeBatchMessages": "20"}
    writer(df, mqstore_cluster, **options).save()
    writer(df, mqstore_cluster, **options).save()  # a re-run, as a retried job would do
    bodies = all_bodies(mqstore_cluster, topic)
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(300)]

    # A different write id is a different write: stored again (the test would see it).
    writer(df, mqstore_cluster, **{**options, "writeId": "job-8"}).save()
    assert len(all_bodies(mqstore_cluster, topic)) == 600


def test_a_task_that_failed_mid_way_and_ran_again_stores_each_row_once(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    topic = "spark-write-retry"
    # Run 1: row 450 has no body, so partition 1 (rows 250..499, batches of 20) fails in the
    # writer after appending its first 10 batches. Run 2, the same rows with that body fixed,
    # is what a retried task sends: the store remembers only the last 5 requests of the
    # producer, so batches 0-4 come back as FAILED_PRECONDITION and 5-9 as duplicates.
    broken = spark.range(0, 500, numPartitions=2).selectExpr(
        "CASE WHEN id = 450 THEN NULL ELSE CAST(CAST(id AS STRING) AS BINARY) END AS body"
    )
    fixed = spark.range(0, 500, numPartitions=2).selectExpr(
        "CAST(CAST(id AS STRING) AS BINARY) AS body"
    )
    options = {"topic": topic, "writeId": "retry-1", "writeBatchMessages": "20"}
    with pytest.raises(Exception, match="null body"):
        writer(broken, mqstore_cluster, **options).save()
    partial = all_bodies(mqstore_cluster, topic)
    # Partition 0 may have finished or been cancelled with the job.
    assert {str(i).encode() for i in range(250, 450)} <= set(partial)
    assert len(partial) < 500
    writer(fixed, mqstore_cluster, **options).save()
    bodies = all_bodies(mqstore_cluster, topic)
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(500)]


@pytest.mark.parametrize(
    ("mode", "options", "schema", "message"),
    [
        ("overwrite", {"topic": "t"}, "body binary", "append-only"),
        ("append", {"topic": "t"}, "value binary", "'body' column"),
        ("append", {}, "body binary", "'topic'"),
        ("append", {"topic": "t"}, "body binary, queueId string", "queueId"),
    ],
)
def test_bad_write_options_are_refused_clearly(
    spark: Any,
    mqstore_cluster: Cluster,
    mode: str,
    options: dict[str, str],
    schema: str,
    message: str,
) -> None:
    row = (b"y", "x") if "," in schema else (b"y",)
    df = spark.createDataFrame([row], schema)
    w = df.write.format("mqstore").mode(mode)
    for k, v in {**connection_options(mqstore_cluster), **options}.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match=message):
        w.save()


def test_write_summary_counts(mqstore_cluster: Cluster) -> None:
    """write_partition without Spark: stored, then duplicates on the same producer id."""
    import pyarrow as pa  # noqa: PLC0415 (pyspark[sql] brings it; skipped without)

    from mqstore.spark.service_source import write_partition  # noqa: PLC0415 - needs pyspark (the module skips without it)

    opts_map = {**connection_options(mqstore_cluster), "topic": "spark-write-unit"}
    opts = write_options({**opts_map, "writeBatchMessages": "3"})
    batch = pa.RecordBatch.from_pydict({"body": [json.dumps(i).encode() for i in range(10)]})
    first = write_partition(opts, "spark:unit:0", 0, iter([batch]))
    assert (first.stored, first.duplicates, first.requests) == (10, 0, 4)
    again = write_partition(opts, "spark:unit:0", 0, iter([batch]))
    assert (again.stored, again.duplicates, again.requests) == (0, 10, 4)

    # Ten requests: the store remembers the last five of a producer; the first five of the
    # re-run are refused as older than its last sequence, which counts as already stored.
    ones = write_options({**opts_map, "writeBatchMessages": "1"})
    first = write_partition(ones, "spark:unit:1", 1, iter([batch]))
    assert (first.stored, first.duplicates, first.requests) == (10, 0, 10)
    again = write_partition(ones, "spark:unit:1", 1, iter([batch]))
    assert (again.stored, again.duplicates, again.requests) == (0, 10, 10)
    caught_up(mqstore_cluster)
    bodies = all_bodies(mqstore_cluster, "spark-write-unit")
    assert sorted(bodies) == sorted([json.dumps(i).encode() for i in range(10)] * 2)


def test_a_read_topic_written_to_another_keeps_messages_and_properties(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    source, target = "spark-copy-from", "spark-copy-to"
    with Producer(_settings(mqstore_cluster)) as p:
        for f in [
            p.send(
                source,
                f"m{i}".encode(),
                queue_id=i % 2,
                key=f"k{i}",
                tags="t",
                properties={"p": str(i)},
            )
            for i in range(20)
        ]:
            f.result(timeout=30)
    caught_up(mqstore_cluster)
    writer(reader(spark, mqstore_cluster, source), mqstore_cluster, topic=target).save()
    caught_up(mqstore_cluster)
    a = {r["properties"]["UNIQ_KEY"]: r for r in reader(spark, mqstore_cluster, source).collect()}
    b = {r["properties"]["UNIQ_KEY"]: r for r in reader(spark, mqstore_cluster, target).collect()}
    assert set(a) == set(b) and len(b) == 20
    for uniq, row in b.items():
        assert row["topic"] == target  # the option overrides the rows' topic column
        for column in ("queueId", "tags", "keys", "body"):
            assert row[column] == a[uniq][column]
        assert row["properties"]["p"] == a[uniq]["properties"]["p"]


def _rows(spark: Any, n: int, partitions: int, *, changed: dict[int, str] | None = None) -> Any:
    changed = changed or {}
    rows = [(changed.get(i, f"row-{i}").encode(), [f"k-{i % 7}"]) for i in range(n)]
    return spark.createDataFrame(rows, "body binary, keys array<string>").repartition(partitions)


def test_a_rerun_in_another_partitioning_stores_nothing_more_and_says_so(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    """The same rows under the same writeId, split 2 ways, then 5, then 1: stored once (before:
    a rerun in another partitioning stored every row again). Each run reports what it did."""
    topic = "spark-write-repartitioned"
    options = {**connection_options(mqstore_cluster), "topic": topic, "writeId": "parts-1"}
    first = mqstore_spark.write(_rows(spark, 300, 2), **options, writeBatchMessages="40")
    assert (first.rows, first.stored, first.already_stored, first.rerun) == (300, 300, 0, False)
    assert first.topics == {topic: 300} and first.write_id == "parts-1"
    for partitions in (5, 1):
        again = mqstore_spark.write(_rows(spark, 300, partitions), **options)
        assert (again.rows, again.stored, again.already_stored, again.rerun) == (300, 0, 300, True)
    bodies = all_bodies(mqstore_cluster, topic)
    assert sorted(bodies) == sorted(f"row-{i}".encode() for i in range(300))


@pytest.mark.parametrize(
    ("n", "changed", "named"),
    [
        (300, {17: "another body"}, "the bodies differ"),
        (301, {}, "300 rows then, 301 now"),
    ],
)
def test_a_write_id_reused_for_other_rows_fails_naming_the_difference(
    spark: Any, mqstore_cluster: Cluster, n: int, changed: dict[int, str], named: str
) -> None:
    """Before: the store answered the reused id's requests as duplicates, stored none of the
    new rows and said nothing. Now the write fails, naming what differs, and sends nothing."""
    topic = f"spark-write-reused-{n}"
    options = {**connection_options(mqstore_cluster), "topic": topic, "writeId": f"reuse-{n}"}
    mqstore_spark.write(_rows(spark, 300, 2), **options)
    with pytest.raises(Exception, match=f"writeId 'reuse-{n}' was used by an earlier write") as e:
        mqstore_spark.write(_rows(spark, n, 3, changed=changed), **options)
    assert named in str(e.value) and "nothing of this run was stored" in str(e.value)
    bodies = all_bodies(mqstore_cluster, topic)
    assert sorted(bodies) == sorted(f"row-{i}".encode() for i in range(300))


def test_without_a_write_id_each_run_is_a_write_of_its_own(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    """No writeId: nothing tells a rerun from a second write of equal rows, so each run
    stores its rows (README: give a writeId to make a job re-runnable)."""
    topic = "spark-write-no-id"
    options = {**connection_options(mqstore_cluster), "topic": topic}
    for _ in range(2):
        report = mqstore_spark.write(_rows(spark, 20, 2), **options)
        assert (report.rows, report.stored, report.already_stored) == (20, 20, 0)
        assert report.write_id == ""
    assert len(all_bodies(mqstore_cluster, topic)) == 40


def test_a_manifest_appended_again_reads_back_the_one_stored(mqstore_cluster: Cluster) -> None:
    """append_manifest of a write id already in the ledger: the store answers the append as a
    duplicate, and the manifest stored first is read back from the commit log."""
    from mqstore.client.connection import Connection  # noqa: PLC0415
    from mqstore.spark.write_ledger import Manifest, WriteDigest, append_manifest  # noqa: PLC0415

    first = Manifest("ledger-unit-1", WriteDigest(), 3, 0, 1_000)
    later = Manifest("ledger-unit-1", WriteDigest(), 0, 3, 2_000)
    with Connection(_settings(mqstore_cluster)) as conn:
        assert append_manifest(conn, "ledger-unit", first) is first
        kept = append_manifest(conn, "ledger-unit", later)
    assert kept == first and kept is not first
