"""format("mqstore") reads over a record that can never be handed out, in Spark's parse modes
(issue 23, item 3): FAILFAST (the default) fails naming the record's offsets, DROPMALFORMED
drops it and counts it in the executors' log, PERMISSIVE keeps a row for it with the error in
the corrupt-record column. Real services on a store whose poison the commit-log engine wrote
before they started (tests/e2e/poison.py), real Spark in local mode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.poison import (
    GOOD_BODIES,
    POISON_AT,
    POISON_BODIES,
    POISONED_QUEUES,
    POISONED_TOPIC,
    PoisonedStore,
    start_poisoned,
)
from tests.spark.conftest import connection_options

pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoisonedStore]:
    s = start_poisoned(tmp_path_factory.mktemp("spark-poisoned") / "store")
    try:
        yield s
    finally:
        s.cluster.stop_all()


def read(spark: Any, store: PoisonedStore, **options: str) -> Any:
    return (
        spark.read.format("mqstore")
        .options(**connection_options(store.cluster), topic=POISONED_TOPIC, **options)
        .load()
    )


def test_failfast_is_the_default_and_names_the_record(spark: Any, poisoned: PoisonedStore) -> None:
    for options in ({}, {"mode": "failfast"}):
        with pytest.raises(Exception) as info:  # Spark wraps the executor's error
            read(spark, poisoned, queues="0", **options).collect()
        text = str(info.value)
        assert "MalformedRecord" in text or "can never be read" in text, text[-2000:]
        assert f"queue 0: the record at queue offset {POISON_AT}" in text
        assert f"(commit-log offset {poisoned.poison_offsets[0]})" in text
        assert "Parse mode: FAILFAST" in text


def test_dropmalformed_drops_the_record_and_counts_it(spark: Any, poisoned: PoisonedStore) -> None:
    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "true")
    try:
        rows = read(spark, poisoned, mode="DROPMALFORMED").collect()
        logged = [
            r.msg
            for r in spark.tvf.python_worker_logs().collect()
            if "DROPMALFORMED" in (r.msg or "")
        ]
    finally:
        spark.conf.unset("spark.sql.pyspark.worker.logging.enabled")
    got = sorted((r.queueId, r.queueOffset, bytes(r.body)) for r in rows)
    assert got == sorted(
        (q, i, body)
        for q in POISONED_QUEUES
        for i, body in enumerate(POISON_BODIES)
        if i != POISON_AT
    )
    counts = [m for m in logged if "dropped 1 malformed record(s)" in m]
    assert sorted(counts) == sorted(
        f"mode DROPMALFORMED: topic {POISONED_TOPIC} queue {q} offsets [0, {len(POISON_BODIES)}): "
        "dropped 1 malformed record(s)"
        for q in POISONED_QUEUES
    ), logged


def test_permissive_keeps_a_row_with_the_error_in_the_corrupt_record_column(
    spark: Any, poisoned: PoisonedStore
) -> None:
    df = read(spark, poisoned, mode="PERMISSIVE", columnNameOfCorruptRecord="_bad")
    assert df.columns[-1] == "_bad" and df.schema["body"].nullable
    rows = sorted(df.collect(), key=lambda r: (r.queueId, r.queueOffset))
    assert len(rows) == len(POISONED_QUEUES) * len(POISON_BODIES)
    for r in rows:
        if r.queueOffset != POISON_AT:
            assert r._bad is None and bytes(r.body) in GOOD_BODIES
            continue
        assert (r.topic, r.commitLogOffset) == (POISONED_TOPIC, poisoned.poison_offsets[r.queueId])
        assert (r.body, r.msgId, r.storeTimestamp, r.properties) == (None, None, None, None)
        assert f"offset {POISON_AT}" in r._bad and "does not decompress" in r._bad
    # The default name, and a selection after load() as for any read.
    bad = (
        read(spark, poisoned, mode="permissive")
        .where("_corrupt_record IS NOT NULL")
        .select("queueId", "queueOffset")
        .collect()
    )
    assert sorted((r.queueId, r.queueOffset) for r in bad) == [
        (q, POISON_AT) for q in POISONED_QUEUES
    ]


def test_without_a_bad_record_in_range_every_mode_reads_the_same(
    spark: Any, poisoned: PoisonedStore
) -> None:
    before = json.dumps({"0": POISON_AT})
    for mode in ("FAILFAST", "DROPMALFORMED"):
        rows = read(spark, poisoned, queues="0", mode=mode, endingOffsets=before).collect()
        assert [bytes(r.body) for r in sorted(rows, key=lambda r: r.queueOffset)] == list(
            POISON_BODIES[:POISON_AT]
        )


def test_the_corrupt_record_column_may_not_shadow_a_column() -> None:
    from mqstore.spark.options import BadOption  # noqa: PLC0415 (after the pyspark skip)
    from mqstore.spark.service_source import SCHEMA, read_schema  # noqa: PLC0415 - needs pyspark (the module skips without it)

    assert read_schema("FAILFAST", "body") == SCHEMA  # the name matters under PERMISSIVE only
    with pytest.raises(BadOption) as info:
        read_schema("PERMISSIVE", "body")
    assert info.value.field == "columnNameOfCorruptRecord"
