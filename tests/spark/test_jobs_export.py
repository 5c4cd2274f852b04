"""The export job: a raw log to Parquet partitioned by topic and date, read back equal."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mqstore.spark.jobs import export
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
