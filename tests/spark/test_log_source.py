"""format("mqstore-log"): segment files read directly, against what the services serve.

The store (`log_store`) is built once per run: the three real services on loopback, small
segments (64 KiB, so the log spans several files), 50-unit consume-queue files and 399-key index
files (so queues and the index roll over), ~600 messages in three topics with keys and tags.
Each topic is read through format("mqstore") while the services run; then they stop, and the
files stay for these tests and the jobs' (test_jobs_*.py import the fixture).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mqstore.client import ClientSettings, Producer
from mqstore.formats.record import PHYSICAL_OFFSET_POS
from mqstore.spark.log_source import (
    COLUMNS,
    LogReadOptions,
    plan_ranges,
    read_ranges,
)
from mqstore.storage.logreader import LogDir, RecordEntry
from mqstore.testing.cluster import start_store
from tests.cli.segments import one_byte_in_each_field

# The fields of a record with the whole-record CRC (rocketmq-store.md §1.1 and the property).
FIELD_NAMES = (
    "TOTALSIZE", "MAGICCODE", "BODYCRC", "QUEUEID", "FLAG", "QUEUEOFFSET", "PHYSICALOFFSET",
    "SYSFLAG", "BORNTIMESTAMP", "BORNHOST", "STORETIMESTAMP", "STOREHOST", "RECONSUMETIMES",
    "PREPAREDTXOFFSET", "BODYLENGTH", "BODY", "TOPICLENGTH", "TOPIC", "PROPERTIESLENGTH",
    "PROPERTIES", "__CRC32#",
)  # fmt: skip

TOPICS = ("orders", "refunds", "audit-log")
MESSAGES = 600
FILE_BYTES = 65_536
UNITS_PER_FILE = 50
SLOT_NUM = 64
ENTRY_NUM = 400
COMPARED = ("topic", "queueId", "queueOffset", "commitLogOffset", "tags", "body", "msgId")


@dataclass
class LogStore:
    root: Path
    log_dir: Path  # commitlog_svc's data dir (segments in its commitlog/)
    cq_dir: Path
    index_dir: Path
    service_rows: list[dict[str, Any]]


_STORE: dict[str, LogStore] = {}


def _produce(settings: ClientSettings) -> None:
    # Appends of at most 16 KiB: a batch must fit one 64 KiB segment.
    with Producer(settings, batch_bytes=16_384) as producer:
        futures = []
        for i in range(MESSAGES):
            topic = TOPICS[i % len(TOPICS)]
            keys = [f"order-{i}", f"customer-{i % 17}"] if i % 5 else None
            body = (f"message {i} " * (1 + i % 9)).encode()
            tags = f"tag{i % 4}" if i % 3 else ""
            futures.append(producer.send(topic, body, keys=keys, tags=tags))
        producer.flush()
    assert len({f.result().commit_log_offset for f in futures}) == MESSAGES


@pytest.fixture
def log_store(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> LogStore:
    """The store of the module docstring, built on first use (the services' rows read through
    format("mqstore") before they stop)."""
    if "store" in _STORE:
        return _STORE["store"]
    root = tmp_path_factory.mktemp("log-store")
    cluster = start_store(
        root,
        extra={
            "commitlog_svc": ["--file-bytes", str(FILE_BYTES)],
            "cq_svc": ["--units-per-file", str(UNITS_PER_FILE)],
            "index_svc": ["--slot-num", str(SLOT_NUM), "--entry-num", str(ENTRY_NUM)],
        },
    )
    try:
        cq = cluster.followers["cq"].target
        settings = ClientSettings(
            commitlog=cluster.commitlog.target, cq=(cq,), index=(cluster.followers["index"].target,)
        )
        _produce(settings)
        rows: list[dict[str, Any]] = []
        for topic in TOPICS:
            df = (
                spark.read.format("mqstore")
                .option("commitlog", cluster.commitlog.target)
                .option("cq", cq)
                .option("topic", topic)
                .load()
            )
            rows.extend(r.asDict() for r in df.select(*COMPARED).collect())
    finally:
        cluster.stop_all()  # SIGTERM: each service flushes and checkpoints on its way out
    store = LogStore(root, root / "commitlog", root / "cq", root / "index", rows)
    _STORE["store"] = store
    return store


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    # A message without tags: null from the log (no TAGS property), "" from format("mqstore").
    return {**row, "body": bytes(row["body"]), "tags": row["tags"] or None}


def _rows(df: Any) -> list[dict[str, Any]]:
    return sorted((r.asDict() for r in df.collect()), key=lambda r: r["commitLogOffset"])


def test_raw_log_read_equals_the_service_read(spark: Any, log_store: LogStore) -> None:
    df = spark.read.format("mqstore-log").option("splitBytes", "8192").load(str(log_store.log_dir))
    assert df.rdd.getNumPartitions() > len(LogDir(str(log_store.log_dir)).segments)
    raw = _rows(df.select(*COMPARED, "badReason"))
    assert all(r.pop("badReason") is None for r in raw)
    service = sorted(log_store.service_rows, key=lambda r: r["commitLogOffset"])
    assert len(raw) == MESSAGES
    assert [_comparable(r) for r in raw] == [_comparable(r) for r in service]


def test_byte_ranges_read_every_record_once_whatever_the_split(log_store: LogStore) -> None:
    directory = str(log_store.log_dir)
    expected = [e.offset for e in LogDir(directory).scan() if isinstance(e, RecordEntry)]
    for split in (4096, 5000, 65_536):
        batches: list[Any] = []
        opts = LogReadOptions(directory, split_bytes=split, include_body=False)
        read_ranges(plan_ranges(directory, split), opts, batches.append)
        got = [o for b in batches for o in b.column("commitLogOffset").to_pylist()]
        assert got == expected, f"split {split}"


def _corrupt_copy(log_store: LogStore, tmp_path: Path) -> tuple[Path, int]:
    """A copy of the log with one record's PHYSICALOFFSET field altered (its whole-record CRC
    fails, as its position check would); returns the copy and that record's offset."""
    copy = tmp_path / "commitlog"
    shutil.copytree(log_store.log_dir / "commitlog", copy)
    log = LogDir(str(copy))
    victim = [e for e in log.scan() if isinstance(e, RecordEntry)][MESSAGES // 2]
    seg = next(s for s in log.segments if s.start_offset <= victim.offset < s.end_offset)
    with open(seg.path, "r+b") as f:
        f.seek(victim.offset - seg.start_offset + PHYSICAL_OFFSET_POS)
        f.write((victim.offset + 1).to_bytes(8, "big"))
    return copy, victim.offset


def test_a_bad_record_fails_the_read_by_default_naming_its_offset(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    copy, offset = _corrupt_copy(log_store, tmp_path)
    with pytest.raises(Exception, match=f"corrupt record at offset {offset}"):
        spark.read.format("mqstore-log").load(str(copy)).count()


def test_permissive_reports_the_bad_record_and_dropmalformed_leaves_it_out(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    copy, offset = _corrupt_copy(log_store, tmp_path)
    reader = spark.read.format("mqstore-log").option("splitBytes", "32768")
    rows = reader.option("mode", "PERMISSIVE").load(str(copy)).select(*COLUMNS).collect()
    bad = [r for r in rows if r["badReason"] is not None]
    assert [r["commitLogOffset"] for r in bad] == [offset]
    assert "record CRC mismatch" in bad[0]["badReason"]
    assert len(rows) == MESSAGES
    dropped = reader.option("mode", "DROPMALFORMED").load(str(copy))
    assert dropped.count() == MESSAGES - 1


def test_a_byte_changed_in_any_field_of_a_record_is_never_returned(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    """One byte changed in each field of a record (one record a field, every other record):
    none of them is returned as a row (DROPMALFORMED), each is a bad row of its own
    (PERMISSIVE), and every other record reads as before. The whole-record CRC covers the
    fields the body CRC does not (born time, queue id, hosts, topic, properties)."""
    copy = tmp_path / "commitlog"
    shutil.copytree(log_store.log_dir / "commitlog", copy)
    log = LogDir(str(copy))
    entries = [e for e in log.scan() if isinstance(e, RecordEntry)]
    damaged: dict[int, str] = {}
    for k, field in enumerate(FIELD_NAMES):
        entry = entries[10 + 2 * k]
        seg = next(s for s in log.segments if s.start_offset <= entry.offset < s.end_offset)
        with open(seg.path, "r+b") as f:
            f.seek(entry.offset - seg.start_offset)
            raw = f.read(entry.record.total_size)
            at = one_byte_in_each_field(raw).get(field, len(raw) - 1)  # (no CRC: the last byte)
            f.seek(entry.offset - seg.start_offset + at)
            f.write(bytes([raw[at] ^ 0x01]))
        damaged[entry.offset] = field
    reader = spark.read.format("mqstore-log").option("splitBytes", "32768")
    kept = reader.option("mode", "DROPMALFORMED").load(str(copy)).select("commitLogOffset")
    kept_offsets = {r["commitLogOffset"] for r in kept.collect()}
    assert kept_offsets == {e.offset for e in entries} - set(damaged)
    rows = reader.option("mode", "PERMISSIVE").load(str(copy)).select(*COLUMNS).collect()
    bad = sorted(r["commitLogOffset"] for r in rows if r["badReason"] is not None)
    assert bad == sorted(damaged)


def test_topic_filter_and_bad_options(spark: Any, log_store: LogStore) -> None:
    df = spark.read.format("mqstore-log").option("topics", "orders").load(str(log_store.log_dir))
    assert {r["topic"] for r in df.select("topic").distinct().collect()} == {"orders"}
    assert df.count() == MESSAGES // len(TOPICS)
    with pytest.raises(Exception, match="mode must be one of"):
        spark.read.format("mqstore-log").option("mode", "LENIENT").load(
            str(log_store.log_dir)
        ).count()
