"""format("mqstore") batch reads against real services: offsets, times, splits, data loss.

One topic of 3 queues x 30 messages, stored in three waves (10 per queue each) with a pause
between waves so that store times separate them; every test reads it in its own way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from mqstore.client import Admin, ClientSettings, Producer, SendResult
from mqstore.spark.options import OffsetsRemoved
from mqstore.testing.cluster import Cluster, expiring_args, start_all
from tests.spark.conftest import connection_options

pytest.importorskip("pyspark")

QUEUES = 3
WAVES = 3
PER_WAVE = 10  # per queue
WAVE_GAP_S = 0.05  # store times of consecutive waves differ by at least this


@dataclass(frozen=True)
class Stored:
    topic: str
    results: list[SendResult]  # in send order
    wave_starts_ms: list[int]  # the first store time of each wave

    def by_queue(self) -> dict[int, list[SendResult]]:
        out: dict[int, list[SendResult]] = {}
        for r in self.results:
            out.setdefault(r.queue_id, []).append(r)
        return out


def produce_waves(c: Cluster, topic: str) -> Stored:
    results: list[SendResult] = []
    starts: list[int] = []
    with Producer(_settings(c), producer_id=f"t-{topic}") as p:
        for wave in range(WAVES):
            futures = [
                p.send(
                    topic,
                    f"{wave}-{q}-{i}".encode(),
                    queue_id=q,
                    tags=f"w{wave}",
                    key=f"k{q}-{i}",
                    properties={"wave": str(wave)},
                )
                for i in range(PER_WAVE)
                for q in range(QUEUES)
            ]
            got = [f.result(timeout=30) for f in futures]
            starts.append(min(r.store_timestamp_ms for r in got))
            results.extend(got)
            time.sleep(WAVE_GAP_S)
    _wait_dispatched(c, topic, {q: WAVES * PER_WAVE for q in range(QUEUES)})
    return Stored(topic, results, starts)


def _settings(c: Cluster) -> ClientSettings:
    return ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=(c.followers["index"].target,),
    )


def _wait_dispatched(c: Cluster, topic: str, ends: dict[int, int], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    with Admin(_settings(c)) as a:
        while True:
            got = {q.queue_id: q.max_offset for q in a.queues(topic)}
            if all(got.get(q, 0) >= n for q, n in ends.items()):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"consume queues of {topic} at {got}, want {ends}")
            time.sleep(0.02)


@pytest.fixture(scope="module")
def stored(mqstore_cluster: Cluster) -> Stored:
    return produce_waves(mqstore_cluster, "spark-read")


def reader(spark: Any, c: Cluster, topic: str, **options: str) -> Any:
    r = spark.read.format("mqstore").option("topic", topic)
    for k, v in {**connection_options(c), **options}.items():
        r = r.option(k, v)
    return r.load()


def keyset(rows: list[Any]) -> set[tuple[int, int]]:
    return {(r["queueId"], r["queueOffset"]) for r in rows}


# -- whole topic, columns ------------------------------------------------------------------------


def test_whole_topic_every_message_once_with_its_columns(
    spark: Any, mqstore_cluster: Cluster, stored: Stored
) -> None:
    df = reader(spark, mqstore_cluster, stored.topic)
    assert df.columns == [
        "topic",
        "queueId",
        "queueOffset",
        "commitLogOffset",
        "storeTimestamp",
        "bornTimestamp",
        "tags",
        "keys",
        "properties",
        "body",
        "msgId",
    ]
    assert df.rdd.getNumPartitions() == QUEUES
    rows = df.collect()
    assert len(rows) == len(stored.results) == QUEUES * WAVES * PER_WAVE
    by_id = {(r["queueId"], r["queueOffset"]): r for r in rows}
    for sent in stored.results:
        row = by_id[(sent.queue_id, sent.queue_offset)]
        wave, q, i = bytes(row["body"]).decode().split("-")
        assert int(q) == sent.queue_id
        assert row["topic"] == stored.topic
        assert row["commitLogOffset"] == sent.commit_log_offset
        assert row["msgId"] == sent.msg_id
        assert row["tags"] == f"w{wave}"
        assert row["keys"] == [f"k{q}-{i}"]
        assert row["properties"]["wave"] == wave
        assert row["properties"]["UNIQ_KEY"] == sent.uniq_key
        assert int(row["storeTimestamp"].timestamp() * 1000) == sent.store_timestamp_ms
        assert row["bornTimestamp"] <= row["storeTimestamp"]


# -- offset ranges -------------------------------------------------------------------------------


def test_offset_json_ranges_per_queue(spark: Any, mqstore_cluster: Cluster, stored: Stored) -> None:
    df = reader(
        spark,
        mqstore_cluster,
        stored.topic,
        startingOffsets=json.dumps({"0": 2, "1": 5, "2": -2}),
        endingOffsets=json.dumps({stored.topic: {"0": 4, "2": 7}}),
    )
    got = keyset(df.collect())
    total = WAVES * PER_WAVE
    want = (
        {(0, o) for o in range(2, 4)}
        | {(1, o) for o in range(5, total)}
        | {(2, o) for o in range(0, 7)}
    )
    assert got == want


def test_queues_option_reads_only_those(
    spark: Any, mqstore_cluster: Cluster, stored: Stored
) -> None:
    rows = reader(spark, mqstore_cluster, stored.topic, queues="2,0").collect()
    assert {r["queueId"] for r in rows} == {0, 2}
    assert len(rows) == 2 * WAVES * PER_WAVE


def test_min_partitions_and_max_records_split_ranges_without_overlap(
    spark: Any, mqstore_cluster: Cluster, stored: Stored
) -> None:
    df = reader(spark, mqstore_cluster, stored.topic, minPartitions="7", pullMessages="4")
    assert df.rdd.getNumPartitions() >= 7
    rows = df.collect()
    assert len(rows) == len(keyset(rows)) == QUEUES * WAVES * PER_WAVE

    df = reader(spark, mqstore_cluster, stored.topic, queues="1", maxRecordsPerPartition="8")
    assert df.rdd.getNumPartitions() == 4  # 30 offsets in pieces of at most 8
    assert keyset(df.collect()) == {(1, o) for o in range(WAVES * PER_WAVE)}


# -- time ranges ---------------------------------------------------------------------------------


def test_timestamps_select_the_waves(spark: Any, mqstore_cluster: Cluster, stored: Stored) -> None:
    w1, w2 = stored.wave_starts_ms[1], stored.wave_starts_ms[2]
    rows = reader(
        spark,
        mqstore_cluster,
        stored.topic,
        startingTimestamp=str(w1),
        endingTimestamp=str(w2),
    ).collect()
    assert {bytes(r["body"]).decode().split("-")[0] for r in rows} == {"1"}
    assert len(rows) == QUEUES * PER_WAVE

    # Per queue: queue 0 from wave 2, queue 1 from wave 1, queue 2 from its start (offsets).
    rows = reader(
        spark,
        mqstore_cluster,
        stored.topic,
        startingOffsetsByTimestamp=json.dumps({"0": w2, "1": w1}),
    ).collect()
    counts = {q: sum(1 for r in rows if r["queueId"] == q) for q in range(QUEUES)}
    assert counts == {0: PER_WAVE, 1: 2 * PER_WAVE, 2: WAVES * PER_WAVE}


def test_starting_timestamp_wins_over_starting_offsets(
    spark: Any, mqstore_cluster: Cluster, stored: Stored
) -> None:
    rows = reader(
        spark,
        mqstore_cluster,
        stored.topic,
        startingTimestamp=str(stored.wave_starts_ms[2]),
        startingOffsets=json.dumps({"0": 0, "1": 0, "2": 0}),
    ).collect()
    assert len(rows) == QUEUES * PER_WAVE


def test_empty_range_reads_nothing(spark: Any, mqstore_cluster: Cluster, stored: Stored) -> None:
    end = WAVES * PER_WAVE
    assert (
        reader(
            spark,
            mqstore_cluster,
            stored.topic,
            startingOffsets=json.dumps({str(q): end for q in range(QUEUES)}),
        ).count()
        == 0
    )


# -- data loss (retention) -----------------------------------------------------------------------

SEGMENT_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def expiring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Small segments that retention deletes as soon as the followers confirm them."""
    c = Cluster(
        tmp_path_factory.mktemp("expiring"),
        extra=expiring_args(SEGMENT_BYTES),
    )
    start_all(c)
    try:
        yield c
    finally:
        c.stop_all()


EXPIRED_TOPIC = "spark-expired"
EXPIRED_TOTAL = 120


@pytest.fixture(scope="module")
def expired(expiring: Cluster) -> int:
    """EXPIRED_TOPIC's queue 0 with EXPIRED_TOTAL messages, the first ones removed by
    retention; returns the queue's lowest offset."""
    with Producer(_settings(expiring), batch_messages=16) as p:  # batches fit a segment
        for f in [p.send(EXPIRED_TOPIC, b"x" * 2_000, queue_id=0) for _ in range(EXPIRED_TOTAL)]:
            f.result(timeout=30)
    _wait_dispatched(expiring, EXPIRED_TOPIC, {0: EXPIRED_TOTAL})
    deadline = time.monotonic() + 30
    with Admin(_settings(expiring)) as a:
        while a.queue(EXPIRED_TOPIC, 0).min_offset == 0:
            assert time.monotonic() < deadline, "retention removed nothing"
            time.sleep(0.05)
        return a.queue(EXPIRED_TOPIC, 0).min_offset


def test_removed_offsets_fail_the_read_or_are_skipped(
    spark: Any, expiring: Cluster, expired: int
) -> None:
    topic, total, lowest = EXPIRED_TOPIC, EXPIRED_TOTAL, expired
    from_zero = json.dumps({"0": 0})
    with pytest.raises(Exception, match="removed by retention") as err:
        reader(spark, expiring, topic, startingOffsets=from_zero).collect()
    assert "failOnDataLoss" in str(err.value)

    rows = reader(spark, expiring, topic, startingOffsets=from_zero, failOnDataLoss="false")
    offsets = sorted(r["queueOffset"] for r in rows.collect())
    assert offsets[0] >= lowest and offsets[-1] == total - 1
    assert offsets == list(range(offsets[0], total))


def test_offsets_removed_while_a_task_reads_fail_it_or_are_skipped(
    expiring: Cluster, expired: int
) -> None:
    """The executor side alone: a range planned before retention moved the queue's start."""
    from mqstore.spark.service_source import (  # noqa: PLC0415 - needs pyspark (the module skips without it)
        SCHEMA,
        QueueRange,
        arrow_schema,
        read_range,
    )

    topic = EXPIRED_TOPIC
    with Admin(_settings(expiring)) as a:
        info = a.queue(topic, 0)
    assert info.min_offset >= expired > 0
    schema = arrow_schema(SCHEMA)
    strict = QueueRange(topic, 0, 0, info.max_offset, True)
    with pytest.raises(OffsetsRemoved, match="failOnDataLoss=false"):
        list(read_range(_settings(expiring), strict, 64, schema))
    lenient = QueueRange(topic, 0, 0, info.max_offset, False)
    batches = list(read_range(_settings(expiring), lenient, 64, schema))
    offsets = [o for b in batches for o in b.column("queueOffset").to_pylist()]
    assert offsets == list(range(offsets[0], info.max_offset))
    assert offsets[0] >= info.min_offset
    assert all(b.schema.equals(schema) for b in batches)
