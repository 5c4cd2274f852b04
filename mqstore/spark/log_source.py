"""`spark.read.format("mqstore-log")`: commit-log segment files read directly, no service running.

    df = spark.read.format("mqstore-log").load("data")          # the data dir `mqstore up` made
    df = spark.read.format("mqstore-log").load("/store/commitlog")          # ours or RocketMQ's
    df = (spark.read.format("mqstore-log").option("topics", "orders,refunds")
          .option("mode", "PERMISSIVE").load("/store/commitlog"))

The directory is the data dir `mqstore up` made, commitlog_svc's data dir, or the directory of
the segment files (mqstore.storage.layout finds them; the segment size comes from the files).
Every record is checked as the store checks it (magic, lengths, body CRC, and the PHYSICALOFFSET
field against its position), by the same walk as `mqstore log verify`. Runs of valid records are
read by the compiled reader (`_core.read_log_columns`, every check of read_record) straight into
Arrow column buffers, handed to Spark as RecordBatches; what it stops at (a bad entry, a blank,
a record whose properties are not ASCII or repeat a key) is read by read_record and built into
rows in Python, as before.

Parallel by file and by byte range. `partitions()` cuts every segment into ranges of at most
`splitBytes` (ranges holding nothing but file holes are dropped). A range [a, b) owns the
entries that start in it, and its task:

    starts at                                   then                        stops at
    a, when a is the start of the read          walks records (LogDir.scan) the first valid
      (bad bytes there are reported)                                        record or blank at
    else the first valid record at or after a   reports bad bytes as it      or after b
      (find_next_record, as recovery resyncs)     meets them, also past b

A valid record at or after a is exactly where the walk of the range before resynchronises, so
every record is read by one task, and bad bytes by the task whose walk meets them first.

Options (all strings, case-insensitive keys):
    path               the store's data dir or the commit-log directory (or `.load(path)`)
    topics             comma-separated topics to keep (default: all)
    mode               FAILFAST (default: the read fails on the first bad entry, naming its
                       offset), DROPMALFORMED (bad entries are left out) or PERMISSIVE (a row
                       per bad entry, `badReason` set, decoded fields when the record parsed)
    checkCrc           true (default) | false: skip the body CRC check
    includeBody        true (default) | false: `body` null, for scans that need no payload
    splitBytes         largest byte range of one task (default 64 MiB)
    startOffset        read records starting at or after this commit-log offset (default: all)
    endOffset          ... and before this one (default: the end of the log)
"""

from __future__ import annotations

import importlib
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from mqstore.errors import CorruptRecord, InvalidArgument
from mqstore.formats import _core
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from mqstore.formats.record import Record, find_next_record, read_record, unpack_host
from mqstore.storage.layout import store_parts
from mqstore.storage.logreader import (
    BadEntry,
    BlankEntry,
    Entry,
    LogDir,
    RecordEntry,
    RecordRun,
    RunReader,
    Segment,
)

# pyarrow ships no type information; imported this way it is Any whatever mypy's settings.
pa: Any = importlib.import_module("pyarrow")
pc: Any = importlib.import_module("pyarrow.compute")

SOURCE_NAME: Final = "mqstore-log"
# 64 MiB: a RocketMQ segment (1 GiB) becomes 16 tasks, a test segment of a few KiB one; a task
# of 64 MiB of ~1 KiB records runs for seconds, long enough to hide its start-up cost.
SPLIT_BYTES_DEFAULT: Final = 64 << 20
SPLIT_BYTES_MIN: Final = 4096
# Rows per Arrow batch handed to Spark: its own default for Python sources
# (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS_MAX: Final = 10_000

MODES: Final = ("FAILFAST", "DROPMALFORMED", "PERMISSIVE")

# (column, Spark SQL type); the Arrow types are in arrow_schema().
FIELDS: Final = (
    ("commitLogOffset", "BIGINT"),
    ("totalSize", "INT"),
    ("topic", "STRING"),
    ("queueId", "INT"),
    ("queueOffset", "BIGINT"),
    ("sysFlag", "INT"),
    ("flag", "INT"),
    ("bodyCrc", "INT"),
    ("bornTimestampMs", "BIGINT"),
    ("bornHost", "STRING"),
    ("storeTimestampMs", "BIGINT"),
    ("storeHost", "STRING"),
    ("reconsumeTimes", "INT"),
    ("preparedTxOffset", "BIGINT"),
    ("tags", "STRING"),
    ("keys", "STRING"),
    ("uniqKey", "STRING"),
    ("properties", "MAP<STRING, STRING>"),
    ("body", "BINARY"),
    ("msgId", "STRING"),
    ("badReason", "STRING"),
)
COLUMNS: Final = tuple(name for name, _ in FIELDS)
SCHEMA_DDL: Final = ", ".join(f"{name} {kind}" for name, kind in FIELDS)


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True, slots=True)
class LogReadOptions:
    directory: str
    topics: frozenset[str] = frozenset()
    mode: str = "FAILFAST"
    check_crc: bool = True
    include_body: bool = True
    split_bytes: int = SPLIT_BYTES_DEFAULT
    start_offset: int | None = None
    end_offset: int | None = None

    @classmethod
    def parse(cls, options: Any) -> LogReadOptions:
        """From a data source's options (a case-insensitive dict of strings)."""
        directory = options.get("path") or ""
        if not directory:
            raise InvalidArgument(
                'mqstore-log needs the commit-log directory: .load(DIR) or .option("path", DIR)',
                field="path",
            )
        parts = store_parts(directory)
        if parts.commitlog is not None or parts.commitlog_replicas:
            directory = parts.require_commitlog(directory)
        mode = (options.get("mode") or "FAILFAST").upper()
        if mode not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        topics = frozenset(t.strip() for t in (options.get("topics") or "").split(",") if t.strip())
        split = _int_option(options, "splitBytes", SPLIT_BYTES_DEFAULT)
        if split < SPLIT_BYTES_MIN:
            raise InvalidArgument(f"splitBytes must be at least {SPLIT_BYTES_MIN}")
        start = _int_option(options, "startOffset", -1)
        end = _int_option(options, "endOffset", -1)
        return cls(
            directory=directory,
            topics=topics,
            mode=mode,
            check_crc=_bool_option(options, "checkCrc", True),
            include_body=_bool_option(options, "includeBody", True),
            split_bytes=split,
            start_offset=start if start >= 0 else None,
            end_offset=end if end >= 0 else None,
        )


def _int_option(options: Any, name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"option {name} must be an integer, not {raw!r}") from None


def _bool_option(options: Any, name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise InvalidArgument(f"option {name} must be true or false, not {raw!r}")
    return value == "true"


# ---------------------------------------------------------------------------------------------
# Planning: byte ranges


@dataclass(frozen=True, slots=True)
class LogRange:
    """Entries starting in [start, end) of the log in `directory`. `exact_start`: start is
    where the read begins, so bytes there are reported even when no record starts there."""

    directory: str
    start: int
    end: int
    exact_start: bool


class LogRangePartition(InputPartition):
    """One Spark task: a LogRange (InputPartition must be picklable; a dataclass field is)."""

    def __init__(self, log_range: LogRange) -> None:
        super().__init__(log_range)
        self.log_range = log_range


def plan_ranges(
    directory: str,
    split_bytes: int = SPLIT_BYTES_DEFAULT,
    start_offset: int | None = None,
    end_offset: int | None = None,
) -> list[LogRange]:
    """The ranges of a read, in log order: each segment cut at multiples of `split_bytes`
        from its start, limited to [start_offset, end_offset); ranges that are all file holes
        (the preallocated tail of the newest file) are left out, except the first. The first range
    starts exactly at the log's minimum unless `start_offset` is given (which may fall anywhere)."""
    log = LogDir(directory)
    lo = log.min_offset if start_offset is None else max(start_offset, log.min_offset)
    hi = log.end_offset if end_offset is None else min(end_offset, log.end_offset)
    ranges: list[LogRange] = []
    for seg in log.segments:
        pos = max(lo, seg.start_offset)
        while pos < min(hi, seg.end_offset):
            nxt = min(seg.start_offset + _round_up(pos - seg.start_offset + 1, split_bytes), hi)
            nxt = min(nxt, seg.end_offset)
            first = not ranges and start_offset is None
            if first or _holds_data(seg, pos - seg.start_offset, nxt - seg.start_offset):
                ranges.append(LogRange(log.directory, pos, nxt, exact_start=first))
            pos = nxt
    return ranges


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _holds_data(seg: Segment, start: int, end: int) -> bool:
    """Whether the file may hold non-hole bytes in [start, end) (SEEK_DATA; True if unknown)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return True
    try:
        fd = os.open(seg.path, os.O_RDONLY)
    except OSError:
        return True  # the task reports it as unreadable
    try:
        return os.lseek(fd, start, seek_data) < end
    except OSError:
        return False  # ENXIO: nothing but holes from start to the end of the file
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Reading one range


def first_record_at_or_after(log: LogDir, offset: int) -> int | None:
    """The commit-log offset of the first valid record starting at or after `offset` in the
    segment holding it, or None when none starts there (find_next_record's rules)."""
    for seg in log.segments:
        if seg.end_offset <= offset:
            continue
        pos = max(0, offset - seg.start_offset)
        with open(seg.path, "rb") as f:
            try:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return None
            try:
                size = min(len(buf), seg.file_bytes)
                here = read_record(buf, pos, size, expected_offset=seg.start_offset + pos)
                if isinstance(here, Record):
                    return seg.start_offset + pos
                found = find_next_record(buf, pos - 1, size, seg.start_offset)
            finally:
                buf.close()
        return None if found < 0 else seg.start_offset + found
    return None


def iter_range(
    r: LogRange, *, check_crc: bool = True, runs: RunReader | None = None
) -> Iterator[Entry | RecordRun]:
    """The entries range `r` owns (see the module docstring), in log order; with `runs`, its
    valid records in RecordRuns (LogDir.scan)."""
    log = LogDir(r.directory)
    if r.exact_start:
        begin: int | None = r.start
    else:
        begin = first_record_at_or_after(log, r.start)
        if begin is None or begin >= r.end:
            return
    entries = log.scan_runs(begin, check_crc=check_crc, runs=runs)
    try:
        for entry in entries:
            if entry.offset >= r.end and not isinstance(entry, BadEntry | RecordRun):
                return
            yield entry
    finally:
        entries.close()


# ---------------------------------------------------------------------------------------------
# Rows


def _host(raw: bytes) -> str:
    ip, port = unpack_host(raw)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


class _Columns:
    """Column lists of one Arrow batch."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {name: [] for name in COLUMNS}

    def __len__(self) -> int:
        return len(self.cols["commitLogOffset"])

    def add_record(self, offset: int, rec: Record, include_body: bool, bad: str | None) -> None:
        c = self.cols
        props = decode_properties(rec.properties) if rec.properties else {}
        c["commitLogOffset"].append(offset)
        c["totalSize"].append(rec.total_size)
        c["topic"].append(rec.topic)
        c["queueId"].append(rec.queue_id)
        c["queueOffset"].append(rec.queue_offset)
        c["sysFlag"].append(rec.sys_flag)
        c["flag"].append(rec.flag)
        c["bodyCrc"].append(rec.body_crc)
        c["bornTimestampMs"].append(rec.born_timestamp_ms)
        c["bornHost"].append(_host(rec.born_host))
        c["storeTimestampMs"].append(rec.store_timestamp_ms)
        c["storeHost"].append(_host(rec.store_host))
        c["reconsumeTimes"].append(rec.reconsume_times)
        c["preparedTxOffset"].append(rec.prepared_tx_offset)
        c["tags"].append(props.get(TAGS))
        c["keys"].append(props.get(KEYS))
        c["uniqKey"].append(props.get(UNIQ_KEY))
        c["properties"].append(list(props.items()))
        c["body"].append(rec.body if include_body else None)
        c["msgId"].append(offset_msg_id(rec.store_host, offset))
        c["badReason"].append(bad)

    def add_bad(self, entry: BadEntry, include_body: bool) -> None:
        reason = (
            entry.reason
            if entry.next_offset is None
            else (f"{entry.reason} (reading resumed at {entry.next_offset})")
        )
        if entry.record is not None:
            self.add_record(entry.offset, entry.record, include_body, reason)
            return
        for values in self.cols.values():
            values.append(None)
        self.cols["commitLogOffset"][-1] = entry.offset
        self.cols["badReason"][-1] = reason


def arrow_schema() -> Any:
    """The Arrow schema of the rows, equal to what Spark expects for SCHEMA_DDL."""
    return pa.schema(
        [
            ("commitLogOffset", pa.int64()),
            ("totalSize", pa.int32()),
            ("topic", pa.string()),
            ("queueId", pa.int32()),
            ("queueOffset", pa.int64()),
            ("sysFlag", pa.int32()),
            ("flag", pa.int32()),
            ("bodyCrc", pa.int32()),
            ("bornTimestampMs", pa.int64()),
            ("bornHost", pa.string()),
            ("storeTimestampMs", pa.int64()),
            ("storeHost", pa.string()),
            ("reconsumeTimes", pa.int32()),
            ("preparedTxOffset", pa.int64()),
            ("tags", pa.string()),
            ("keys", pa.string()),
            ("uniqKey", pa.string()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("body", pa.binary()),
            ("msgId", pa.string()),
            ("badReason", pa.string()),
        ]
    )


def column_reader(r: LogRange, opts: LogReadOptions) -> RunReader:
    """The RunReader of range `r`: the compiled reader (_core.read_log_columns) of the valid
    records that start before the range's end (and the read's endOffset), as RecordBatches."""
    stop = r.end if opts.end_offset is None else min(r.end, opts.end_offset)
    kept = opts.topics or None
    schema = arrow_schema()

    def read(buf: Any, pos: int, size: int, base: int) -> tuple[int, RecordRun | None]:
        found = _core.read_log_columns(
            buf, pos, size, stop - base, base, opts.check_crc, opts.include_body, kept,
            BATCH_ROWS_MAX,
        )  # fmt: skip
        _, after, rows, pairs, cols, topics, hosts = found
        if not rows:
            return after, None
        return after, RecordRun(
            base + pos, _record_batch(schema, opts, rows, pairs, cols, topics, hosts)
        )

    return read


def _record_batch(
    schema: Any,
    opts: LogReadOptions,
    rows: int,
    pairs: int,
    cols: list[Any],
    topics: list[str],
    hosts: list[bytes],
) -> Any:
    """The RecordBatch over read_log_columns' buffers (no copy but the dictionary columns)."""
    out: dict[str, Any] = {}
    fixed = _core.LOG_FIXED_COLUMNS
    for (name, width), buf in zip(fixed, cols, strict=False):
        kind = pa.int64() if width == 8 else pa.int32()
        out[name] = pa.Array.from_buffers(kind, rows, [None, pa.py_buffer(buf)])
    body_offsets, body, props_offsets, key_offsets, keys, value_offsets, values = [
        pa.py_buffer(b) for b in cols[len(fixed) : len(fixed) + 7]
    ]
    id_offsets, ids = (pa.py_buffer(b) for b in cols[len(fixed) + 7 :])
    out["topic"] = pa.array(topics, pa.string()).take(out["topic"])
    names = pa.array([_host(h) for h in hosts], pa.string())
    out["bornHost"] = names.take(out["bornHost"])
    out["storeHost"] = names.take(out["storeHost"])
    value_array = pa.Array.from_buffers(pa.string(), pairs, [None, value_offsets, values])
    null = pa.scalar(None, pa.int32())
    for name in ("tags", "keys", "uniqKey"):
        index = out[name]
        out[name] = value_array.take(pc.if_else(pc.greater_equal(index, 0), index, null))
    out["properties"] = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), rows + 1, [None, props_offsets]),
        pa.Array.from_buffers(pa.string(), pairs, [None, key_offsets, keys]),
        value_array,
    )
    out["body"] = (
        pa.Array.from_buffers(pa.binary(), rows, [None, body_offsets, body])
        if opts.include_body
        else pa.nulls(rows, pa.binary())
    )
    out["msgId"] = pa.Array.from_buffers(pa.string(), rows, [None, id_offsets, ids])
    out["badReason"] = pa.nulls(rows, pa.string())
    return pa.RecordBatch.from_arrays([out[name] for name in COLUMNS], schema=schema)


def read_batches(r: LogRange, opts: LogReadOptions) -> Iterator[Any]:
    """The rows of range `r` as pyarrow RecordBatches of at most BATCH_ROWS_MAX rows: the
    valid records as the compiled reader's batches, the entries it leaves to Python (bad
    entries, records whose properties decode_properties must read) in batches between them."""
    schema = arrow_schema()
    topics = opts.topics
    cols = _Columns()
    end = opts.end_offset

    def flush() -> Any:
        arrays = [pa.array(cols.cols[f.name], type=f.type) for f in schema]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    for entry in iter_range(r, check_crc=opts.check_crc, runs=column_reader(r, opts)):
        if end is not None and entry.offset >= end:
            break
        if isinstance(entry, RecordRun):
            if len(cols):
                yield flush()
                cols = _Columns()
            yield entry.records
            continue
        if isinstance(entry, RecordEntry):
            if topics and entry.record.topic not in topics:
                continue
            cols.add_record(entry.offset, entry.record, opts.include_body, None)
        elif isinstance(entry, BlankEntry):
            continue
        elif opts.mode == "FAILFAST":
            raise CorruptRecord(
                entry.offset,
                f"{entry.reason} (in {r.directory}; mode PERMISSIVE or DROPMALFORMED reads on)",
            )
        elif opts.mode == "PERMISSIVE":
            cols.add_bad(entry, opts.include_body)
        if len(cols) >= BATCH_ROWS_MAX:
            yield flush()
            cols = _Columns()
    if len(cols):
        yield flush()


def read_ranges(
    ranges: Sequence[LogRange], opts: LogReadOptions, sink: Callable[[Any], None]
) -> None:
    """Every range in order, one after the other, each batch to `sink` (no Spark: for tools
    and for the benchmark's sequential baseline)."""
    for r in ranges:
        for batch in read_batches(r, opts):
            sink(batch)


# ---------------------------------------------------------------------------------------------
# The data source


class MqstoreLogDataSource(DataSource):
    """Commit-log segment files as rows (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return MqstoreLogReader(LogReadOptions.parse(self.options), schema)


class MqstoreLogReader(DataSourceReader):
    def __init__(self, opts: LogReadOptions, schema: StructType) -> None:
        self.opts = opts
        if [f.name for f in schema.fields] != list(COLUMNS):
            raise InvalidArgument(
                "mqstore-log has a fixed schema; select columns after load() instead of "
                "passing .schema(...)"
            )

    def partitions(self) -> list[InputPartition]:
        o = self.opts
        ranges = plan_ranges(o.directory, o.split_bytes, o.start_offset, o.end_offset)
        return [LogRangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        log_range = getattr(partition, "log_range", None)
        if not isinstance(log_range, LogRange):
            return  # Spark's stand-in partition for an empty plan (nothing to read)
        yield from read_batches(log_range, self.opts)
