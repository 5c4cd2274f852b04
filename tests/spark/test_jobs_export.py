"""The export job: a raw log, or a topic through the services, to Parquet partitioned by
topic and date, read back equal."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from mqstore.client import Admin, ClientSettings, Producer
from mqstore.spark.jobs import export
from tests.spark.conftest import connection_options
from tests.spark.test_log_source import MESSAGES, TOPICS, LogStore, log_store

__all__ = ["log_store"]  # the fixture, shared with test_log_source.py

KEPT = ("commitLogOffset", "topic", "queueId", "queueOffset", "storeTimestampMs", "body", "msgId")


def test_export_of_a_raw_log_reads_back_equal_partitioned_by_topic_and_date(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    out = tmp_path / "lake"
    report = export.export(spark, str(out), log_dir=str(log_store.log_dir), split_bytes=8192)
    assert report.rows == MESSAGES
    partitions = [n for n in os.listdir(out) if not n.startswith((".", "_"))]
    assert sorted(partitions) == sorted(f"topic={t}" for t in TOPICS)
    for topic in TOPICS:
        dates = os.listdir(out / f"topic={topic}")
        assert dates and all(d.startswith("date=") for d in dates)
    back = spark.read.parquet(str(out))
    source = spark.read.format("mqstore-log").load(str(log_store.log_dir))
    got = sorted(tuple(r) for r in back.select(*KEPT).collect())
    want = sorted(tuple(r) for r in source.select(*KEPT).collect())
    assert got == want
    wrong_date = back.filter("date != to_date(timestamp_millis(storeTimestampMs))").count()
    assert wrong_date == 0
    # Each file holds each of its queues' rows in queue order (docs/spark.md, "Jobs").
    files = sorted(out.glob("topic=*/date=*/*.parquet"))
    assert files
    for path in files:
        rows = pq.read_table(path, columns=["queueId", "queueOffset"]).to_pylist()
        for qid in {r["queueId"] for r in rows}:
            offsets = [r["queueOffset"] for r in rows if r["queueId"] == qid]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), path


def test_export_of_a_topic_through_the_services_reads_back_every_message(
    spark: Any, mqstore_cluster: Any, tmp_path: Path
) -> None:
    """`export OUT --topic T --option k=v`, as a user runs the job against live services."""
    topic = "export-through-services"
    options = connection_options(mqstore_cluster)
    settings = ClientSettings(
        commitlog=options["commitlog"], cq=(options["cq"],), index=(options["index"],)
    )
    bodies = [b"exported %d" % i for i in range(300)]
    with Producer(settings) as producer:
        producer.send_batch(topic, bodies).result(timeout=30)
    with Admin(settings) as admin:
        deadline = time.monotonic() + 30
        while sum(q.max_offset for q in admin.queues(topic)) < len(bodies):
            assert time.monotonic() < deadline, "cq_svc did not see the messages"
            time.sleep(0.05)
    out = tmp_path / "lake"
    argv = [str(out), "--topic", topic]
    for name, value in options.items():
        argv += ["--option", f"{name}={value}"]
    assert export.main(argv) == 0
    assert os.listdir(out / f"topic={topic}")[0].startswith("date=")
    back = spark.read.parquet(str(out))
    assert sorted(bytes(r.body) for r in back.select("body").collect()) == sorted(bodies)
    assert back.filter("date != to_date(storeTimestamp)").count() == 0
