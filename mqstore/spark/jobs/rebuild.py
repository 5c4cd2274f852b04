"""Rebuild job: consume-queue and index files built from the commit log on Spark, byte for byte
what cq_svc (FILE store) and index_svc write for the same log.

    python -m mqstore.spark.jobs.rebuild DATA_DIR --cq-out CQ_DATA_DIR --index-out INDEX_DATA_DIR
        [--units-per-file 300000] [--slot-num 5000000 --entry-num 20000000] [--exact]
        [--shard-count 1 --shard-index 0] [--master URL] [--split-bytes N]

DATA_DIR is the data dir `mqstore up` made, commitlog_svc's, or the segments' directory. The
output directories must not exist yet, or be empty (exit 2 before anything is read); they are
data dirs a stopped cq_svc / index_svc can start on (their
checkpoints say the whole log is applied, and carry the log's store id from store.meta), e.g. to
replace files lost with a disk, or to seed a new replica without replaying the log through
gRPC. Geometry flags must match the service's settings (the defaults are its defaults).

How it runs (the byte rules are in derived.py):
- the log is read by `mqstore-log` (parallel by file and byte range, CRC-checked; FAILFAST by
  default: a bad record fails the job rather than leave a hole in a queue);
- consume queues: the entries that get a queue offset are grouped by (topic, queueId); each
  group (one task per queue) writes its unit and time files;
- index: every key of every indexed message gets its number in commit-log order (its rank in
  its partition of the log plus the keys of the partitions before it: numbered_keys_df), which
  fixes the file it lands in (entry_num - 1 keys a file); each file is built by one task under
  a temporary name; the driver names them, and writes the checkpoints.

The cq output holds only the derived trees and `cq_checkpoint`: consumer-group offsets and
receive/ack state are not in the log and are not rebuilt.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pyspark.sql import functions as sf

from mqstore.errors import check
from mqstore.formats import index_checkpoint as ck
from mqstore.formats import index_file as ifmt
from mqstore.formats import index_hash64, sysflag
from mqstore.formats.index_checkpoint import FileRecord
from mqstore.formats.keyhash import KEY_TOPIC_SEPARATOR, java_hashes_utf8
from mqstore.spark.jobs import derived
from mqstore.spark.jobs.common import (
    JobError,
    add_common_args,
    arrow_rows,
    log_dir_of,
    now_ms,
    read_log,
    require_empty_output,
    run_job,
    session_for_main,
    stop_session,
)
from mqstore.spark.jobs.progress import JobProgress
from mqstore.storage.logreader import LogDir, list_segments

CQ_RESULT_SCHEMA = "topic STRING, queueId INT, minOffset BIGINT, maxOffset BIGINT, files INT"
INDEX_RESULT_SCHEMA = (
    "fileNo BIGINT, keys BIGINT, startOffset BIGINT, firstStoreTs BIGINT, beginTs BIGINT, "
    "endTs BIGINT, beginPhy BIGINT, endPhy BIGINT, indexCount INT, entriesCrc BIGINT, "
    "headCrc BIGINT, hash64Crc BIGINT"
)


# pyarrow ships no type information; imported this way it is Any whatever mypy's settings.
pa: Any = importlib.import_module("pyarrow")
pc: Any = importlib.import_module("pyarrow.compute")
_TMP_PREFIX = "rebuild-"


@dataclass(slots=True)
class RebuildReport:
    records: int = 0
    log_min_offset: int = 0
    log_end_offset: int = 0
    queues: int = 0
    units: int = 0
    cq_files: int = 0
    index_files: list[str] = field(default_factory=list)
    index_keys: int = 0


# ---------------------------------------------------------------------------------------------
# Log scope


def log_bounds(spark_df: Any, log_dir: str) -> tuple[int, int, int]:
    """(records, the log's minimum offset, the end of its last valid record)."""
    row = (
        spark_df.filter(sf.col("badReason").isNull())
        .agg(
            sf.count(sf.lit(1)).alias("n"),
            sf.max(sf.col("commitLogOffset") + sf.col("totalSize")).alias("end"),
        )
        .collect()[0]
    )
    low = LogDir(log_dir).min_offset
    return int(row["n"]), low, int(row["end"]) if row["end"] is not None else low


def queue_entries_df(log_df: Any) -> Any:
    """Dispatch entries that get a consume-queue unit (NOT and COMMIT transactions)."""
    txn = sf.col("sysFlag").bitwiseAND(sysflag.TRANSACTION_MASK)
    return log_df.filter(
        sf.col("badReason").isNull()
        & txn.isin(sysflag.TRANSACTION_NOT_TYPE, sysflag.TRANSACTION_COMMIT_TYPE)
    ).select("topic", "queueId", "queueOffset", "commitLogOffset", "totalSize", "tags",
             "storeTimestampMs")  # fmt: skip


def utf8_keys(column: Any) -> derived.Utf8Keys:
    """An Arrow string column (no nulls) as its UTF-8 bytes and offsets, without copying."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    check(array.null_count == 0, "a null among index keys or tags")
    wide = pa.types.is_large_string(array.type)
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)
    bounds = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf else np.zeros(0, dtype=np.uint8)
    return derived.Utf8Keys(data, bounds)


def queue_units_of(table: Any, units_per_file: int, where: str) -> derived.QueueUnits:
    """The units a queue's dispatch entries (a group of queue_entries_df, as Arrow) make, its
    tags hashed for the whole group at once (a null or empty TAGS is tags code 0, as
    javahash.tags_code)."""
    tags = utf8_keys(pc.fill_null(table.column("tags"), ""))

    def ints(name: str) -> npt.NDArray[np.int64]:
        values: npt.NDArray[np.int64] = table.column(name).to_numpy().astype(np.int64)
        return values

    return derived.build_queue_columns(
        ints("queueOffset"),
        ints("commitLogOffset"),
        ints("totalSize"),
        java_hashes_utf8(tags.data, tags.offsets),
        ints("storeTimestampMs"),
        units_per_file,
        where,
    )


def index_keys_df(log_df: Any, geometry: derived.IndexGeometry) -> Any:
    """Every index key in commit-log order: (commitLogOffset, pos, key, storeTimestampMs)."""
    txn = sf.col("sysFlag").bitwiseAND(sysflag.TRANSACTION_MASK)
    uniq = sf.when(
        sf.col("uniqKey").isNotNull() & (sf.length("uniqKey") > 0), sf.array(sf.col("uniqKey"))
    ).otherwise(sf.array().cast("array<string>"))
    tokens = sf.filter(sf.split(sf.coalesce(sf.col("keys"), sf.lit("")), " "), lambda t: t != "")
    keyed = log_df.filter(
        sf.col("badReason").isNull() & (txn != sysflag.TRANSACTION_ROLLBACK_TYPE)
    ).select(
        "commitLogOffset",
        "topic",
        "storeTimestampMs",
        sf.posexplode(sf.concat(uniq, tokens)).alias("pos", "token"),
    )
    out = keyed.select(
        "commitLogOffset",
        "pos",
        sf.concat(sf.col("topic"), sf.lit(KEY_TOPIC_SEPARATOR), sf.col("token")).alias("key"),
        "storeTimestampMs",
    )
    if geometry.shard_count > 1:

        def mine(batches: Iterator[Any]) -> Iterator[Any]:
            for batch in batches:
                keys = batch.column("key").to_pylist()
                if keys:
                    yield batch.filter(derived.shard_mask(keys, geometry))

        out = out.mapInArrow(mine, out.schema)
    return out


def numbered_keys_df(keys_df: Any, geometry: derived.IndexGeometry) -> Any:
    """Keys with their file number and entry number (1 .. entry_num - 1) in that file: each
    key's rank in commit-log order, counted by Spark in every partition at once, with no
    shuffle of the keys (a global window sorts them all in one task: 9 s of 21 s of the audit
    of 1.76 M records).

    A partition of the log is a byte range, so its keys follow those of the partitions below
    it: one small aggregation counts each partition's keys (and finds its offsets, to order
    the partitions and check they do not overlap), then a key's rank is the keys of the
    partitions before its own plus its rank in its partition, where keys come in commit-log
    order already (a range is read from its start, and the cache, filters and posexplode keep
    the order: no sort; build_file_of checks it)."""
    per_file = geometry.keys_per_file
    part = sf.spark_partition_id()
    counts = (
        keys_df.groupBy(part.alias("part"))
        .agg(
            sf.count(sf.lit(1)).alias("n"),
            sf.min("commitLogOffset").alias("low"),
            sf.max("commitLogOffset").alias("high"),
        )
        .collect()
    )
    ranges = sorted((int(r["low"]), int(r["high"]), int(r["part"]), int(r["n"])) for r in counts)
    for (_, high, _, _), (low, _, _, _) in itertools.pairwise(ranges):
        check(high < low, "partitions of the log hold overlapping offsets")
    base = [0] * (max((r[2] for r in ranges), default=0) + 1)
    keys_before = 0
    for _, _, p, n in ranges:
        base[p] = keys_before
        keys_before += n
    # monotonically_increasing_id: the partition id << 33, plus the row's rank in the partition.
    rank = sf.monotonically_increasing_id() - sf.shiftleft(part.cast("bigint"), 33)
    first = sf.element_at(sf.array(*[sf.lit(b).cast("bigint") for b in base]), part + 1)
    numbered = keys_df.withColumn("seq", first + rank)
    return numbered.select(
        (sf.col("seq") / per_file).cast("bigint").alias("fileNo"),
        (sf.col("seq") % per_file + 1).cast("int").alias("number"),
        "commitLogOffset",
        "key",
        "storeTimestampMs",
    )


def build_file_of(table: Any, geometry: derived.IndexGeometry) -> derived.IndexImage:
    """The index file of a group of numbered_keys_df's rows (one fileNo, as Arrow)."""
    table = table.take(pc.sort_indices(table.column("number")))
    phys = table.column("commitLogOffset").to_numpy().astype(np.int64)
    check(bool(np.all(phys[1:] >= phys[:-1])), "index keys numbered out of commit-log order")
    return derived.build_index_file(
        geometry,
        utf8_keys(table.column("key")),
        phys,
        table.column("storeTimestampMs").to_numpy().astype(np.int64),
    )


# ---------------------------------------------------------------------------------------------
# The job


def rebuild(
    spark: Any,
    log_dir: str,
    *,
    cq_out: str | None,
    index_out: str | None,
    units_per_file: int = derived.UNITS_PER_FILE_DEFAULT,
    geometry: derived.IndexGeometry | None = None,
    split_bytes: int | None = None,
    progress: JobProgress | None = None,
) -> RebuildReport:
    geometry = geometry or derived.IndexGeometry()
    steps = 1 + (cq_out is not None) + (index_out is not None)
    progress = progress or JobProgress(spark, "rebuild", steps, show=False)
    log_df = read_log(spark, log_dir, include_body=False, split_bytes=split_bytes).cache()
    report = RebuildReport()
    try:
        with progress.step("reading the log"):
            bounds = log_bounds(log_df, log_dir)
        report.records, report.log_min_offset, report.log_end_offset = bounds
        store_id = derived.store_id_of(log_dir)
        if cq_out is not None:
            out = os.path.abspath(cq_out)
            upf = units_per_file

            def write_group(key: tuple[Any, Any], table: Any) -> Any:
                topic, qid = str(key[0].as_py()), int(key[1].as_py())
                image = queue_units_of(table, upf, f"{topic}/{qid}")
                files = derived.write_queue(out, topic, qid, image)
                row = [topic, qid, image.min_offset, image.max_offset, files]
                return arrow_rows([row], CQ_RESULT_SCHEMA)

            with progress.step("writing consume queues"):
                rows = (
                    queue_entries_df(log_df)
                    .groupBy("topic", "queueId")
                    .applyInArrow(write_group, CQ_RESULT_SCHEMA)
                    .collect()
                )
            report.queues = len(rows)
            report.units = sum(int(r["maxOffset"]) - int(r["minOffset"]) for r in rows)
            report.cq_files = sum(int(r["files"]) for r in rows)
            derived.write_cq_checkpoint(
                out, store_id, report.log_end_offset, report.log_min_offset, now_ms()
            )
        if index_out is not None:
            with progress.step("writing index files"):
                report.index_files, report.index_keys = _rebuild_index(
                    log_df, os.path.abspath(index_out), geometry, store_id, report
                )
    finally:
        log_df.unpersist()
    return report


def _rebuild_index(
    log_df: Any,
    out: str,
    geometry: derived.IndexGeometry,
    store_id: bytes,
    report: RebuildReport,
) -> tuple[list[str], int]:
    index_dir = os.path.join(out, derived.INDEX_SUBDIR)
    os.makedirs(index_dir, exist_ok=True)

    def write_file(key: tuple[Any], table: Any) -> Any:
        file_no = int(key[0].as_py())
        image = build_file_of(table, geometry)
        tmp = os.path.join(index_dir, f"{_TMP_PREFIX}{file_no}")
        derived.write_file(tmp, image.data)
        if image.companion is not None:
            derived.write_file(tmp + index_hash64.SUFFIX, image.companion)
        rec = derived.file_record(geometry, image, 0, 0, sealed=False)
        h = image.header
        return arrow_rows(
            [[file_no, len(table), image.start_offset, image.first_store_ts_ms, h.begin_ts_ms,
              h.end_ts_ms, h.begin_phy, h.end_phy, h.index_count, rec.entries_crc,
              rec.head_crc, rec.hash64_crc]],
            INDEX_RESULT_SCHEMA,
        )  # fmt: skip

    keys_df = index_keys_df(log_df, geometry)
    numbered = numbered_keys_df(keys_df, geometry)
    rows = sorted(
        numbered.groupBy("fileNo").applyInArrow(write_file, INDEX_RESULT_SCHEMA).collect(),
        key=lambda r: int(r["fileNo"]),
    )
    names_ms = derived.file_names_ms([int(r["firstStoreTs"]) for r in rows])
    records: list[FileRecord] = []
    names: list[str] = []
    for i, (row, name_ms) in enumerate(zip(rows, names_ms, strict=True)):
        last = i == len(rows) - 1
        end = report.log_end_offset if last else int(rows[i + 1]["startOffset"])
        rec = _record_of(row, geometry, name_ms, end, sealed=not last)
        name = ifmt.name_of(name_ms)
        tmp = os.path.join(index_dir, f"{_TMP_PREFIX}{int(row['fileNo'])}")
        os.replace(tmp, os.path.join(index_dir, name))
        if geometry.exact:
            os.replace(
                tmp + index_hash64.SUFFIX, os.path.join(index_dir, name) + index_hash64.SUFFIX
            )
        records.append(rec)
        names.append(name)
    derived.write_index_checkpoint(
        out,
        geometry,
        records,
        store_id,
        report.log_end_offset,
        report.log_min_offset,
        now_ms(),
    )
    return names, sum(int(r["keys"]) for r in rows)


def _record_of(
    row: Any, geometry: derived.IndexGeometry, name_ms: int, end_offset: int, *, sealed: bool
) -> FileRecord:
    flags = ck.FILE_HEAD_CRC | (ck.FILE_SEALED if sealed else 0)
    if geometry.exact:
        flags |= ck.FILE_HAS_COMPANION
    return FileRecord(
        name_ms=name_ms,
        slot_num=geometry.slot_num,
        entry_num=geometry.entry_num,
        start_offset=int(row["startOffset"]),
        end_offset=end_offset,
        begin_ts_ms=int(row["beginTs"]),
        end_ts_ms=int(row["endTs"]),
        begin_phy=int(row["beginPhy"]),
        end_phy=int(row["endPhy"]),
        index_count=int(row["indexCount"]),
        flags=flags,
        entries_crc=int(row["entriesCrc"]),
        head_crc=int(row["headCrc"]),
        hash64_crc=int(row["hash64Crc"]),
    )


# ---------------------------------------------------------------------------------------------
# Command line


def add_geometry_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--units-per-file",
        type=int,
        default=derived.UNITS_PER_FILE_DEFAULT,
        help="cq_svc's units_per_file (default 300000)",
    )
    parser.add_argument("--slot-num", type=int, default=ifmt.DEFAULT_SLOT_NUM)
    parser.add_argument("--entry-num", type=int, default=ifmt.DEFAULT_ENTRY_NUM)
    parser.add_argument("--exact", action="store_true", help="index_svc's exact mode")
    parser.add_argument("--shard-count", type=int, default=1)
    parser.add_argument("--shard-index", type=int, default=0)


def geometry_of(args: argparse.Namespace) -> derived.IndexGeometry:
    return derived.IndexGeometry(
        slot_num=args.slot_num,
        entry_num=args.entry_num,
        exact=args.exact,
        shard_count=args.shard_count,
        shard_index=args.shard_index,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mqstore.spark.jobs.rebuild",
        description="Build cq_svc's and index_svc's files from a commit log.",
    )
    p.add_argument(
        "log_dir", help="the data dir `mqstore up` made, commitlog_svc's, or the segments' dir"
    )
    p.add_argument("--cq-out", default=None, help="cq_svc data dir to write")
    p.add_argument("--index-out", default=None, help="index_svc data dir to write")
    add_geometry_args(p)
    add_common_args(p)
    return p


def summary(report: RebuildReport) -> str:
    return (
        f"rebuilt from {report.records} records, offsets [{report.log_min_offset}, "
        f"{report.log_end_offset}): {report.queues} queues, {report.units} units in "
        f"{report.cq_files} files; {report.index_keys} index keys in "
        f"{len(report.index_files)} files"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_job("rebuild", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    if args.cq_out is None and args.index_out is None:
        raise JobError("give --cq-out, --index-out or both")
    for out in (args.cq_out, args.index_out):
        if out is not None:
            require_empty_output(out, "rebuild writes into a new or empty folder")
    log_dir = log_dir_of(args.log_dir)
    list_segments(log_dir)  # a directory without a readable log: exit 2 before Spark
    geometry = geometry_of(args)
    spark, owned = session_for_main("mqstore-rebuild", args)
    try:
        report = rebuild(
            spark,
            log_dir,
            cq_out=args.cq_out,
            index_out=args.index_out,
            units_per_file=args.units_per_file,
            geometry=geometry,
            split_bytes=args.split_bytes,
            progress=JobProgress(
                spark, "rebuild", 1 + (args.cq_out is not None) + (args.index_out is not None)
            ),
        )
    finally:
        stop_session(spark, owned)
    print(summary(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
