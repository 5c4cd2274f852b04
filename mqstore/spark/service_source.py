"""`format("mqstore")`: topics' queues through the services, as a Spark data source.

    spark.read.format("mqstore").option("topic", "orders").load()            batch read
    ....option("topics", "orders,payments") / .option("subscribePattern", "orders-.*")
    spark.readStream.format("mqstore").option("topic", "orders").load()      micro-batches
    df.write.format("mqstore").option("topic", "orders").mode("append").save()
    df.writeStream.format("mqstore").option("topic", "orders").start()      per micro-batch

Options: mqstore/spark/options.py (modelled on the Kafka connector; docs/spark.md). Rows
(with columns=kafka, the Kafka connector's instead: KAFKA_SCHEMA):

    topic string, queueId int, queueOffset long, commitLogOffset long,
    storeTimestamp timestamp, bornTimestamp timestamp, tags string, keys array<string>,
    properties map<string,string>, body binary, msgId string

With the option mode PERMISSIVE, a string column `_corrupt_record` (columnNameOfCorruptRecord)
comes last, and every column but the first four may be null: a record that can never be
handed out (the store refuses it as damaged, or its body does not decompress) is a row of its
topic, queueId, queueOffset and commitLogOffset with the error in that column. FAILFAST (the
default) fails the read naming the record; DROPMALFORMED drops it and logs how many a
partition dropped (options.py).

Where the code runs (reference/spark.md §1.4-1.6). `partitions()`, the stream's offsets and
`writer()` run in Python processes on the driver and ask the consume queues (Admin) for the
queues' bounds and time lookups; `read()` and `write()` run in executor workers: a read pulls
one queue's offset range [start, end) through the SDK's Consumer and yields Arrow batches; a
write appends its rows through the commit log.

Reads are replayable: a range of (queue, offset) always yields the same messages while
retention has not removed them, which is what Spark's exactly-once file sink needs of a
streaming source. Stream offsets are Kafka's JSON form {"<topic>": {"<queueId>": next offset}}.

Writes are idempotent per task. Each task appends under producer id
"spark:<writeId>:<partition>" with sequences 0, 1, 2, ... one per batch of
`writeBatchMessages` rows, each batch sent only after the previous one was answered. A retried
task (same writeId, same partition, the same rows in the same order) sends the same batches
under the same sequences: the store answers one it still remembers as a duplicate, and refuses
an older one with FAILED_PRECONDITION ("not after its last stored sequence"), which can only
happen when an earlier attempt stored it (sequences are sent in order), so both count as
already written and nothing is stored twice. Limits: the store remembers 10,000 producers
(LRU); a retry after that many other producers wrote since is stored again. Rows must come in
the same order on a retry (a deterministic upstream, as Spark's own retries assume).

A write with a writeId is idempotent as a whole too (write_ledger.py): once it completed, its
manifest (the rows' count and digest) is in the ledger topic, and a rerun, in any partitioning,
sends nothing and reports the rows as already stored; a rerun with other rows fails before
sending anything, naming what differs. Every write computes the digest of its rows as it goes
and reports what it stored (`WriteReport`: the log, the `reportFile` option,
`mqstore.spark.write`).
"""

from __future__ import annotations

import importlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from mqstore.backoff import Backoff
from mqstore.client.admin import Admin, QueueInfo
from mqstore.client.compression import COMPRESS_OVER_BYTES_DEFAULT, Compression, compress
from mqstore.client.connection import Connection
from mqstore.client.consumer import Consumer
from mqstore.client.errors import (
    BadRecord,
    ClientError,
    DeadlineExceeded,
    FailedPrecondition,
    Unavailable,
    refusal,
)
from mqstore.client.message import Message
from mqstore.client.producer import append_request
from mqstore.client.settings import ClientSettings
from mqstore.formats.javahash import java_string_hash
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import (
    KEY_SEPARATOR,
    KEYS,
    PRODUCER_SEQ,
    RECORD_CRC,
    TAGS,
    UNIQ_KEY,
    encode_properties,
)
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.spark import write_ledger
from mqstore.spark.options import (
    EARLIEST,
    LATEST,
    MODE_DEFAULT,
    BadOption,
    Columns,
    MalformedRecord,
    NoOffsetForTime,
    OffsetsPastEnd,
    OffsetSpec,
    OffsetsRemoved,
    ParseMode,
    ReadOptions,
    Subscription,
    WriteOptions,
    parse_columns,
    parse_mode,
    read_options,
    write_options,
)
from mqstore.spark.write_ledger import Manifest, WriteDigest, WriteIdReused, WriteReport

# ruff: noqa: N802, N803 (Spark's names: initialOffset, latestOffset, batchId, ...)

log = logging.getLogger(__name__)
# pyarrow ships no type information; imported this way it is Any whatever mypy's settings.
pa: Any = importlib.import_module("pyarrow")

SOURCE_NAME = "mqstore"

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("queueId", IntegerType(), False),
        StructField("queueOffset", LongType(), False),
        StructField("commitLogOffset", LongType(), False),
        StructField("storeTimestamp", TimestampType(), False),
        StructField("bornTimestamp", TimestampType(), False),
        StructField("tags", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("body", BinaryType(), False),
        StructField("msgId", StringType(), False),
    ]
)

# The Kafka connector's columns and types (columns=kafka), every one nullable as there:
#   key        the message's keys, space-separated as stored (RocketMQ's KEYS), UTF-8; null
#              when it has none
#   value      the body (decompressed)
#   topic, partition, offset      the topic, queue id and queue offset
#   timestamp  the store time; timestampType 1 (Kafka's LogAppendTime), the time that
#              startingTimestamp and the other time options look up
#   headers    (includeHeaders=true) every property, TAGS, KEYS and UNIQ_KEY included, in
#              stored order: (name, UTF-8 value)
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
KAFKA_HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)
TIMESTAMP_TYPE_LOG_APPEND = 1  # Kafka's TimestampType.LOG_APPEND_TIME.id (CREATE_TIME is 0)

# The columns a PERMISSIVE row of a bad record always has (topic, queueId, queueOffset,
# commitLogOffset: _bad_values); the others are null in it.
_KNOWN_FOR_BAD = 4


def read_schema(
    mode: ParseMode,
    corrupt_column: str,
    columns: Columns = "mqstore",
    include_headers: bool = False,
) -> StructType:
    """SCHEMA or KAFKA_SCHEMA (with headers when asked); under PERMISSIVE every column but
    those a bad record's row always has nullable and the corrupt-record column (a string)
    last."""
    if columns == "kafka":
        base = StructType([*KAFKA_SCHEMA.fields, *([KAFKA_HEADERS] if include_headers else [])])
    else:
        base = SCHEMA
    if mode != "PERMISSIVE":
        return base
    if corrupt_column in base.names:
        raise BadOption("columnNameOfCorruptRecord", f"{corrupt_column!r} is a column already")
    fields = [
        f if columns == "kafka" or i < _KNOWN_FOR_BAD else StructField(f.name, f.dataType, True)
        for i, f in enumerate(base.fields)
    ]
    return StructType([*fields, StructField(corrupt_column, StringType(), True)])


# A DROPMALFORMED partition logs each record it drops, up to this many (then its count alone):
# a badly damaged log must not flood the executors' logs.
DROPPED_LOGGED_MAX = 10
# Statuses of a Pull after which the offsets stepped over are gone (retention).
_LOST = frozenset({"OFFSET_TOO_SMALL", "MESSAGE_WAS_REMOVING", "OFFSET_FOUND_NULL"})
# Statuses that say the queue ends before the offset asked for (a replica behind the one that
# gave the bounds, or the queue shrank).
_SHORT = frozenset({"OFFSET_OVERFLOW_ONE", "OFFSET_OVERFLOW_BADLY", "NO_MESSAGE_IN_QUEUE"})
# A consume-queue replica behind the one that answered the planner gets this long, in long
# polls, to reach a range's end before the read fails.
REPLICA_CATCH_UP_MS = 10_000
# Appends retried on UNAVAILABLE / DEADLINE_EXCEEDED (same sequence: idempotent) for this long,
# after pauses of mqstore/backoff.py.
APPEND_RETRY_S = 30.0
# Properties a writer never copies from a row: the store's idempotence tag belongs to the
# request that carries it, and the whole-record CRC to the record it checks (the store
# refuses a request naming either).
_RESERVED_PROPERTIES = frozenset({PRODUCER_SEQ, RECORD_CRC})


# -- planning (driver side) ------------------------------------------------------------------


Key = tuple[str, int]  # (topic, queue id)
K = TypeVar("K", int, Key)


@dataclass
class QueueRange(InputPartition):
    """One Spark partition: offsets [start, end) of one queue. `fail_on_data_loss` False also
    for a queue a stream saw appear (it starts at the queue's beginning, whatever that is)."""

    topic: str
    queue_id: int
    start: int
    end: int
    fail_on_data_loss: bool


def _topics(admin: Admin, sub: Subscription) -> list[str]:
    """The topics a read covers: those named, or every topic whose whole name matches."""
    if sub.pattern is None:
        return list(sub.topics)
    return [t for t in admin.topics() if sub.covers(t)]


def _queue_infos(admin: Admin, opts: ReadOptions) -> dict[Key, QueueInfo]:
    """Every queue the read covers. A named topic nothing was stored in, or a queue named in
    `queues` that it lacks, is NotFound naming it (Admin.existing_queues)."""
    sub = opts.subscription
    out: dict[Key, QueueInfo] = {}
    for topic in _topics(admin, sub):
        infos = (
            admin.queues(topic)
            if sub.pattern is not None
            else admin.existing_queues(topic, opts.queues)
        )
        out.update(((topic, i.queue_id), i) for i in infos)
    return out


def _resolve(
    admin: Admin,
    opts: ReadOptions,
    spec: OffsetSpec,
    info: QueueInfo,
    option: str,
    *,
    starting: bool,
) -> int:
    """One queue's offset under `spec`: a store time looked up (GetOffsetByTime), else the
    offset given, else the spec's default; EARLIEST / LATEST become the queue's bounds. A
    starting offset past the queue's end is left to _clamp_start (data loss)."""
    t, q = info.topic, info.queue_id
    ts = spec.timestamp(t, q)
    if ts is not None:
        n = admin.offset_for_time(t, q, ts, "lower")
        # Nothing stored at or after ts: the lookup answers the queue's end (asked again, in
        # case a message came in since the queue's bounds were read).
        if (
            starting
            and n >= info.max_offset
            and opts.timestamp_strategy == "error"
            and admin.queue(t, q).max_offset <= n
        ):
            raise NoOffsetForTime(t, q, ts)
        return n
    given = spec.offset(t, q)
    n = given if given is not None else EARLIEST if spec.default == "earliest" else LATEST
    if n == EARLIEST:
        return info.min_offset
    if n == LATEST:
        return info.max_offset
    if n > info.max_offset and not starting:
        raise BadOption(
            option, f"topic {t!r} queue {q}: offset {n} is past the queue's end {info.max_offset}"
        )
    return n


def _check_named_queues(opts: ReadOptions, infos: Mapping[Key, QueueInfo]) -> None:
    """Offsets or times given for a queue that is not read: a typo, not something to ignore."""
    for option, spec in (
        ("startingOffsets", opts.starting.offsets),
        ("startingOffsetsByTimestamp", opts.starting.timestamps),
        ("endingOffsets", opts.ending.offsets),
        ("endingOffsetsByTimestamp", opts.ending.timestamps),
    ):
        extra = sorted((t, q) for t, per in spec.items() for q in per if (t, q) not in infos)
        if extra:
            named = ", ".join(f"topic {t!r} queue {q}" for t, q in extra)
            raise BadOption(option, f"names {named}, which the read does not cover")


def _clamp_start(opts: ReadOptions, info: QueueInfo, start: int) -> int:
    """`start` within the queue, as failOnDataLoss says: offsets retention removed, or an
    offset past the queue's end (Kafka's "offset was changed"), fail the read, or are
    skipped (the queue read from its first offset, or from its end)."""
    t, q = info.topic, info.queue_id
    if start < info.min_offset:
        if opts.fail_on_data_loss:
            raise OffsetsRemoved(t, q, start, info.min_offset)
        log.warning(
            "topic %s queue %d: offsets %d..%d were removed by retention; skipped",
            t,
            q,
            start,
            info.min_offset - 1,
        )
        return info.min_offset
    if start > info.max_offset:
        if opts.fail_on_data_loss:
            raise OffsetsPastEnd(t, q, start, info.max_offset)
        log.warning(
            "topic %s queue %d: offset %d is past the queue's end %d; going on from its end",
            t,
            q,
            start,
            info.max_offset,
        )
        return info.max_offset
    return start


def split_ranges(
    ranges: Sequence[QueueRange], min_partitions: int | None, max_records: int | None
) -> list[QueueRange]:
    """Split ranges so there are at least `min_partitions` (each range's share proportional to
    its size, as Kafka's KafkaOffsetRangeCalculator, rounded up so that the minimum holds
    whenever there are that many offsets) and none holds more than `max_records` offsets."""
    ranges = [r for r in ranges if r.end > r.start]
    total = sum(r.end - r.start for r in ranges)
    out: list[QueueRange] = []
    for r in ranges:
        size = r.end - r.start
        parts = 1
        if min_partitions is not None and min_partitions > len(ranges):
            parts = max(parts, -(-size * min_partitions // total))  # ceil: never fewer
        if max_records is not None:
            parts = max(parts, -(-size // max_records))
        parts = min(parts, size)
        step, extra = divmod(size, parts)
        at = r.start
        for i in range(parts):
            end = at + step + (1 if i < extra else 0)
            out.append(QueueRange(r.topic, r.queue_id, at, end, r.fail_on_data_loss))
            at = end
    return out


# -- reading (executor side) -----------------------------------------------------------------


def arrow_schema(schema: StructType) -> Any:
    """The Arrow schema Spark checks a read's batches against (UTC timestamps)."""
    return to_arrow_schema(schema, timezone="UTC")


def _values(m: Message) -> tuple[Any, ...]:
    """A message's row, in SCHEMA's order (timestamps in microseconds, as Arrow wants)."""
    return (
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.commit_log_offset,
        m.store_timestamp_ms * 1000,
        m.born_timestamp_ms * 1000,
        m.tags,
        m.keys,
        list(m.properties.items()),
        m.body,
        m.msg_id,
    )


def _bad_values(b: BadRecord) -> tuple[Any, ...]:
    """A bad record's PERMISSIVE row: what is known of it, nulls, then its error."""
    known = (b.topic, b.queue_id, b.queue_offset, b.commit_log_offset)
    return (*known, *[None] * (len(SCHEMA.fields) - len(known)), str(b))


def _kafka_values(m: Message) -> tuple[Any, ...]:
    """A message's row in KAFKA_SCHEMA's order (without headers)."""
    keys = m.keys
    return (
        KEY_SEPARATOR.join(keys).encode("utf-8") if keys else None,
        m.body,
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.store_timestamp_ms * 1000,
        TIMESTAMP_TYPE_LOG_APPEND,
    )


def _kafka_headers_values(m: Message) -> tuple[Any, ...]:
    headers = [{"key": k, "value": v.encode("utf-8")} for k, v in m.properties.items()]
    return (*_kafka_values(m), headers)


def _kafka_bad_values(b: BadRecord, headers: bool) -> tuple[Any, ...]:
    """A bad record's PERMISSIVE row in Kafka's columns: topic, partition, offset, the error
    (which names the commit-log offset too)."""
    return (None, None, b.topic, b.queue_id, b.queue_offset, None, None, *[None] * headers, str(b))


@dataclass(frozen=True)
class RowLayout:
    """How a read turns messages (and, under PERMISSIVE, bad records) into rows."""

    values: Callable[[Message], tuple[Any, ...]] = _values
    bad_values: Callable[[BadRecord], tuple[Any, ...]] = _bad_values


def row_layout(columns: Columns, include_headers: bool) -> RowLayout:
    if columns == "mqstore":
        return RowLayout()
    return RowLayout(
        _kafka_headers_values if include_headers else _kafka_values,
        lambda b: _kafka_bad_values(b, include_headers),
    )


MQSTORE_ROWS = RowLayout()


def _record_batch(rows: Sequence[tuple[Any, ...]], schema: Any) -> Any:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    arrays = [pa.array(list(col), type=f.type) for col, f in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def to_batch(messages: Sequence[Message], schema: Any, layout: RowLayout = MQSTORE_ROWS) -> Any:
    """Messages as one RecordBatch with exactly `schema` (read_schema's Arrow form)."""
    return _record_batch(list(map(layout.values, messages)), schema)


def to_permissive_batch(
    rows: Sequence[Message | BadRecord], schema: Any, layout: RowLayout = MQSTORE_ROWS
) -> Any:
    """Messages and bad records, in the order given, as one RecordBatch of the PERMISSIVE
    schema (read_schema): a message's row has no error, a bad record's is bad_values."""
    return _record_batch(
        [
            (*layout.values(r), None) if isinstance(r, Message) else layout.bad_values(r)
            for r in rows
        ],
        schema,
    )


def read_range(
    settings: ClientSettings,
    r: QueueRange,
    pull_messages: int,
    schema: Any,
    mode: ParseMode = MODE_DEFAULT,
    layout: RowLayout = MQSTORE_ROWS,
) -> Iterator[Any]:
    """Offsets [r.start, r.end) of one queue as RecordBatches (one per Pull); a record that
    can never be handed out as `mode` says (module docstring)."""
    dropped = 0
    with Consumer(settings, r.topic, queues=[r.queue_id], long_poll_ms=0) as consumer:
        offset = r.start
        waited_ms = 0
        while offset < r.end:
            want = min(pull_messages, r.end - offset)
            long_poll = min(1_000, REPLICA_CATCH_UP_MS - waited_ms) if waited_ms else 0
            res = consumer.pull(r.queue_id, offset, max_messages=want, long_poll_ms=long_poll)
            if res.status == "FOUND":
                waited_ms = 0
                got = [m for m in res.messages if offset <= m.queue_offset < r.end]
                bad = [b for b in res.bad_records if offset <= b.queue_offset < r.end]
                if bad and mode == "FAILFAST":
                    b = bad[0]
                    raise MalformedRecord(
                        b.topic, b.queue_id, b.queue_offset, b.commit_log_offset, b.reason
                    )
                if bad and mode == "PERMISSIVE":
                    rows: list[Message | BadRecord] = [*got, *bad]
                    rows.sort(key=lambda row: row.queue_offset)
                    yield to_permissive_batch(rows, schema, layout)
                elif got:
                    yield (
                        to_batch(got, schema, layout)
                        if mode != "PERMISSIVE"
                        else to_permissive_batch(got, schema, layout)
                    )
                for b in bad if mode == "DROPMALFORMED" else ():
                    dropped += 1
                    if dropped <= DROPPED_LOGGED_MAX:
                        log.warning("mode DROPMALFORMED: dropped %s", b)
                if res.next_offset <= offset:
                    raise ClientError(
                        f"queue {r.queue_id}: a pull at {offset} did not move forward",
                        code=grpc.StatusCode.INTERNAL,
                    )
                offset = res.next_offset
            elif res.status in _LOST:
                start = max(res.next_offset, res.min_offset, offset + 1)
                if r.fail_on_data_loss:
                    raise OffsetsRemoved(r.topic, r.queue_id, offset, start)
                log.warning(
                    "topic %s queue %d: offsets %d..%d were removed; skipped",
                    r.topic,
                    r.queue_id,
                    offset,
                    start - 1,
                )
                offset = start
            elif res.status in _SHORT and waited_ms < REPLICA_CATCH_UP_MS:
                waited_ms += max(long_poll, 100)
                if not long_poll:
                    time.sleep(0.1)
            elif res.status in _SHORT and not r.fail_on_data_loss:
                log.warning(
                    "topic %s queue %d: the queue ends at %d, before the range's end %d; "
                    "offsets %d..%d skipped",
                    r.topic,
                    r.queue_id,
                    res.max_offset,
                    r.end,
                    offset,
                    r.end - 1,
                )
                break
            else:
                raise ClientError(
                    f"topic {r.topic!r} queue {r.queue_id}: offset {offset} should hold a "
                    f"message but the pull answered {res.status} (queue {res.min_offset}.."
                    f"{res.max_offset})",
                    code=grpc.StatusCode.OUT_OF_RANGE,
                )
    if dropped:
        log.warning(
            "mode DROPMALFORMED: topic %s queue %d offsets [%d, %d): dropped %d malformed "
            "record(s)",
            r.topic,
            r.queue_id,
            r.start,
            r.end,
            dropped,
        )


def _read_partition(
    opts: ReadOptions, partition: InputPartition, schema: StructType
) -> Iterator[Any]:
    # Spark replaces an empty partition list with [InputPartition(None)] (spark.md §1.4).
    if not isinstance(partition, QueueRange):
        return iter(())
    return read_range(
        opts.settings,
        partition,
        opts.pull_messages,
        arrow_schema(schema),
        opts.mode,
        row_layout(opts.columns, opts.include_headers),
    )


def _check_read_schema(schema: StructType, opts: ReadOptions) -> None:
    expected = read_schema(
        opts.mode, opts.corrupt_record_column, opts.columns, opts.include_headers
    )
    if schema != expected:
        raise BadOption(
            "schema",
            f"format('mqstore') reads its own schema ({expected.simpleString()}); select "
            "columns after load() instead of passing a schema",
        )


class MqstoreBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        with Admin(opts.settings) as admin:
            infos = _queue_infos(admin, opts)
            _check_named_queues(opts, infos)
            ranges = []
            for (t, q), info in sorted(infos.items()):
                start = _clamp_start(
                    opts,
                    info,
                    _resolve(admin, opts, opts.starting, info, "startingOffsets", starting=True),
                )
                end = _resolve(admin, opts, opts.ending, info, "endingOffsets", starting=False)
                if end < start:
                    raise BadOption(
                        "endingOffsets",
                        f"topic {t!r} queue {q}: the read would end at {end}, before its start "
                        f"{start}",
                    )
                ranges.append(QueueRange(t, q, start, end, opts.fail_on_data_loss))
        # A list, never a tuple (spark.md §1.4).
        return list(split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition, self.schema)


# -- streaming -------------------------------------------------------------------------------


def _offsets_json(offsets: Mapping[Key, int]) -> dict[str, dict[str, int]]:
    """Kafka's offset form: {"<topic>": {"<queueId>": next offset}}."""
    out: dict[str, dict[str, int]] = {}
    for (t, q), n in sorted(offsets.items()):
        out.setdefault(t, {})[str(q)] = n
    return out


def _offsets_of(doc: Mapping[str, Any] | None, sub: Subscription) -> dict[Key, int]:
    """A stream offset back as {(topic, queue): offset}; the flat {"<queueId>": n} of a
    checkpoint written before topics were named in it belongs to the read's one topic."""
    out: dict[Key, int] = {}
    for k, v in (doc or {}).items():
        if isinstance(v, Mapping):
            out.update(((str(k), int(q)), int(n)) for q, n in v.items())
        elif sub.single is not None:
            out[(sub.single, int(k))] = int(v)
        else:
            raise BadOption(
                "checkpointLocation",
                f"the checkpoint's offsets {dict(doc or {})} name no topic: they are of a "
                "read of one topic (the option topic), not of " + str(sub),
            )
    return out


def cap_offsets(start: Mapping[K, int], latest: Mapping[K, int], limit: int) -> dict[K, int]:
    """At most `limit` offsets past `start` in all, shared in proportion to what each queue
    has available (as Kafka's maxOffsetsPerTrigger), the rounding remainder to the first
    queues with room, so that every trigger makes progress."""
    available = {q: max(0, n - start.get(q, 0)) for q, n in latest.items()}
    total = sum(available.values())
    if total <= limit:
        return dict(latest)
    share = {q: a * limit // total for q, a in available.items()}
    left = limit - sum(share.values())
    for q in sorted(available):
        if left <= 0:
            break
        if share[q] < available[q]:
            share[q] += 1
            left -= 1
    return {q: start.get(q, 0) + share[q] for q in latest}


def offsets_behind(source: Any) -> dict[str, float] | None:
    """Kafka's lag metrics of one source of a streaming query's progress
    (`query.lastProgress["sources"][i]`, a dict or pyspark's SourceProgress), from what Spark
    reports there: its endOffset and latestOffset (reportLatestOffset). {"minOffsetsBehindLatest",
    "maxOffsetsBehindLatest", "avgOffsetsBehindLatest"} over the queues; None when the
    progress holds no latestOffset. (A Python data source cannot fill the progress's own
    `metrics` in PySpark 4.x: Spark's PythonMicroBatchStream does not implement
    ReportsSourceMetrics.)"""

    def field(name: str) -> Any:
        value = source.get(name) if isinstance(source, Mapping) else getattr(source, name, None)
        return json.loads(value) if isinstance(value, str) else value

    end, latest = field("endOffset"), field("latestOffset")
    if not isinstance(latest, Mapping) or not latest:
        return None

    def flat(doc: Any) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for k, v in (doc or {}).items():
            if isinstance(v, Mapping):
                out.update(((str(k), str(q)), int(n)) for q, n in v.items())
            else:
                out[("", str(k))] = int(v)
        return out

    done = flat(end if isinstance(end, Mapping) else {})
    behind = [max(0, n - done.get(k, 0)) for k, n in flat(latest).items()]
    if not behind:
        return None
    return {
        "minOffsetsBehindLatest": min(behind),
        "maxOffsetsBehindLatest": max(behind),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }


class MqstoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"<topic>": {"<queueId>": next offset}} (Kafka's form). A queue or, under
    subscribePattern, a topic that appears while the query runs is read from its beginning
    (as Kafka's new partitions). Under Trigger.AvailableNow the target is the queues' ends
    when the query started, reached in maxOffsetsPerTrigger steps.

    Read limits (Kafka's): maxOffsetsPerTrigger caps a batch; minOffsetsPerTrigger holds a
    trigger back (latestOffset answers the start: no batch) while fewer offsets are new and
    less than maxTriggerDelay passed since the last batch ran. PySpark carries one ReadLimit,
    so getDefaultReadLimit names the minimum when there is one and latestOffset applies the
    maximum and the delay from the options with it; a ReadAllAvailable from Spark
    (Trigger.Once) reads everything. Under Trigger.AvailableNow the minimum is not applied
    (the query ends at the first trigger that brings nothing)."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._target: dict[Key, int] | None = None
        self._latest_seen: dict[Key, int] | None = None  # for reportLatestOffset
        self._last_batch_s: float | None = None  # monotonic time the last batch was let run

    def _latest(self) -> dict[Key, int]:
        with Admin(self.opts.settings) as admin:
            return {k: info.max_offset for k, info in _queue_infos(admin, self.opts).items()}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        opts = self.opts
        with Admin(opts.settings) as admin:
            infos = _queue_infos(admin, opts)
            _check_named_queues(opts, infos)
            return _offsets_json(
                {
                    k: _clamp_start(
                        opts,
                        info,
                        _resolve(
                            admin, opts, opts.starting, info, "startingOffsets", starting=True
                        ),
                    )
                    for k, info in infos.items()
                }
            )

    def getDefaultReadLimit(self) -> ReadLimit:
        low, high = self.opts.min_offsets_per_trigger, self.opts.max_offsets_per_trigger
        if low is not None:
            return ReadMinRows(low)
        return ReadAllAvailable() if high is None else ReadMaxRows(high)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        """The queues' ends as the last latestOffset saw them (Kafka's): the progress's
        `latestOffset`, against which its `endOffset` shows the lag (offsets_behind)."""
        return None if self._latest_seen is None else _offsets_json(self._latest_seen)

    def _hold_back(self, begin: Mapping[Key, int], latest: Mapping[Key, int], low: int) -> bool:
        """Kafka's delayBatch: True while fewer than `low` offsets are new and less than
        maxTriggerDelay passed since the last batch was let run."""
        now = time.monotonic()
        delay_s = self.opts.max_trigger_delay_ms / 1000
        if self._last_batch_s is not None and now - self._last_batch_s < delay_s:
            new = sum(max(0, n - begin.get(k, 0)) for k, n in latest.items())
            if new < low:
                return True
        self._last_batch_s = now
        return False

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, dict[str, int]]:
        opts = self.opts
        begin = _offsets_of(start, opts.subscription)
        latest = self._target if self._target is not None else self._latest()
        self._latest_seen = dict(latest)
        merged = dict(latest)
        for k, n in begin.items():
            end = merged.setdefault(k, n)  # a queue the listing no longer shows stays put
            if end < n:  # the queue ends before where the query is: data loss (Kafka's)
                if opts.fail_on_data_loss:
                    raise OffsetsPastEnd(k[0], k[1], n, end)
                log.warning(
                    "topic %s queue %d: the stream is at %d, past the queue's end %d; going on "
                    "from its end",
                    k[0],
                    k[1],
                    n,
                    end,
                )
        if limit is None:  # the engine's older call: the options' limits
            limit = self.getDefaultReadLimit()
        if isinstance(limit, ReadAllAvailable):
            return _offsets_json(merged)
        high = limit.max_rows if isinstance(limit, ReadMaxRows) else opts.max_offsets_per_trigger
        if (
            isinstance(limit, ReadMinRows)
            and self._target is None
            and self._hold_back(begin, merged, limit.min_rows)
        ):
            # No batch: the start, with any queue that went back at its end.
            return _offsets_json({k: min(n, merged[k]) for k, n in begin.items()})
        if high is not None:
            merged = cap_offsets({k: min(n, merged[k]) for k, n in begin.items()}, merged, high)
        return _offsets_json(merged)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        sub = self.opts.subscription
        begin, finish = _offsets_of(start, sub), _offsets_of(end, sub)
        ranges = [
            QueueRange(
                t,
                q,
                begin.get((t, q), 0),
                n,
                # A queue new to the query starts at 0, whatever retention left of it.
                self.opts.fail_on_data_loss and (t, q) in begin,
            )
            for (t, q), n in sorted(finish.items())
        ]
        return list(split_ranges(ranges, None, self.opts.max_records_per_partition))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition, self.schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to acknowledge: the checkpoint holds the offsets (spark.md §1.5)."""


# -- writing ---------------------------------------------------------------------------------

# Column -> the Spark types a write accepts for it.
_WRITE_COLUMNS: dict[str, tuple[type, ...]] = {
    "body": (BinaryType, StringType),
    "topic": (StringType,),
    "queueId": (IntegerType, LongType),
    "tags": (StringType,),
    "keys": (ArrayType, StringType),
    "properties": (MapType,),
}


def _check_write_schema(schema: StructType, opts: WriteOptions) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise BadOption("schema", "a write needs a 'body' column (binary or string)")
    if "topic" not in fields and opts.topic is None:
        raise BadOption("topic", "is required when the rows have no 'topic' column")
    for name, accepted in _WRITE_COLUMNS.items():
        t = fields.get(name)
        if t is None:
            continue
        ok = isinstance(t, accepted)
        if isinstance(t, ArrayType):
            ok = ok and isinstance(t.elementType, StringType)
        if isinstance(t, MapType):
            ok = isinstance(t.keyType, StringType) and isinstance(t.valueType, StringType)
        if not ok:
            raise BadOption("schema", f"column {name!r} has type {t.simpleString()}")


@dataclass
class WriteSummary(WriterCommitMessage):
    """What one task wrote: `stored` messages appended now, `duplicates` answered as already
    stored (a retried task), in `requests` appends; `digest` of its rows (write_ledger)."""

    partition: int
    stored: int
    duplicates: int
    requests: int
    digest: WriteDigest = field(default_factory=WriteDigest)


@dataclass(frozen=True)
class _Row:
    topic: str
    queue_id: int
    body: bytes
    properties: bytes
    sys_flag: int


class MqstoreWriter(DataSourceArrowWriter):
    """A batch write. On the driver, before any task: with a writeId, the ledger's manifest of
    an earlier run of it, if any (then the tasks only digest their rows). In the tasks: the
    rows, appended (write_partition). On the driver after them: the digests compared with the
    manifest (a rerun, or a reuse that fails), or the manifest appended; the report."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_write_schema(schema, opts)
        self.opts = opts
        self.schema = schema
        # Made on the driver, pickled with the writer into every task (and every retry).
        self.write_id = opts.write_id or uuid.uuid4().hex
        self.earlier = (
            write_ledger.find(opts.settings, opts.ledger_topic, opts.write_id)
            if opts.write_id
            else None
        )
        self.summaries: list[WriteSummary] = []
        self.report: WriteReport | None = None

    def producer_id(self, partition: int) -> str:
        return f"spark:{self.write_id}:{partition}"

    def write(self, iterator: Iterator[Any]) -> WriteSummary:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        return write_partition(
            self.opts,
            self.producer_id(partition),
            partition,
            iterator,
            send=self.earlier is None,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.summaries = [m for m in messages if isinstance(m, WriteSummary)]
        digest = write_ledger.merged(s.digest for s in self.summaries)
        stored = sum(s.stored for s in self.summaries)
        duplicates = sum(s.duplicates for s in self.summaries)
        earlier = self.earlier
        if earlier is None and self.opts.write_id:
            mine = Manifest(self.write_id, digest, stored, duplicates, int(time.time() * 1000))
            with Connection(self.opts.settings) as conn:
                kept = write_ledger.append_manifest(conn, self.opts.ledger_topic, mine)
            if kept is not mine:  # another run of this id completed first
                self._check_same(digest, kept, sent=True)
        elif earlier is not None:
            self._check_same(digest, earlier, sent=False)
            duplicates = digest.rows
        report = WriteReport(
            write_id=self.write_id if self.opts.write_id else "",
            rows=digest.rows,
            stored=stored,
            already_stored=duplicates,
            topics=dict(sorted(digest.topics.items())),
            rerun=earlier is not None,
        )
        self.report = report
        log.info(
            "write %s: %d rows, %d stored, %d already stored%s",
            self.write_id,
            report.rows,
            report.stored,
            report.already_stored,
            " (a rerun of a completed write: nothing sent)" if report.rerun else "",
        )
        if self.opts.report_file:
            with open(self.opts.report_file, "w", encoding="utf-8") as f:
                json.dump(report.to_json(), f)

    def _check_same(self, digest: WriteDigest, earlier: Manifest, *, sent: bool) -> None:
        differs = digest.differences(earlier.digest)
        if not differs:
            return
        done = (
            "this run's rows were stored all the same (the earlier run completed while it ran)"
            if sent
            else "nothing of this run was stored"
        )
        raise WriteIdReused(
            f"writeId {self.write_id!r} was used by an earlier write of other rows "
            f"({'; '.join(differs)}): {done}. A rerun of that write needs the same rows "
            "(in any partitioning); other rows need a new writeId",
            method="CommitLog/Append",
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Appends cannot be taken back; re-running the write with the same writeId adds
        # only what is missing.
        log.warning("write %s failed; re-run it with writeId=%s", self.write_id, self.write_id)


# Local properties Spark's micro-batch execution sets for the tasks of a batch
# (StreamExecution.QUERY_ID_KEY, MicroBatchExecution.BATCH_ID_KEY): the query id is kept in
# the checkpoint, so a replayed batch has the same (query id, batch id) as its first run.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class MqstoreStreamWriter(DataSourceStreamArrowWriter):
    """writeStream.format("mqstore"): each micro-batch's rows appended as a batch write is,
    under producer id "spark:<writeId or query id>:<batch id>:<partition>". A batch Spark
    replays after a failure (same checkpoint, same offsets, a replayable source) sends the
    same requests and is answered as already stored: exactly once into the topic."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _check_write_schema(schema, opts)
        self.opts = opts
        self.schema = schema

    def write(self, iterator: Iterator[Any]) -> WriteSummary:
        ctx = TaskContext.get()
        if ctx is None:
            raise ClientError(
                "a stream write runs in a Spark task", code=grpc.StatusCode.FAILED_PRECONDITION
            )
        query = self.opts.write_id or ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:
            raise ClientError(
                "the task carries no streaming query or batch id",
                code=grpc.StatusCode.FAILED_PRECONDITION,
            )
        partition = ctx.partitionId()
        producer_id = f"spark:{query}:{batch}:{partition}"
        return write_partition(self.opts, producer_id, partition, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in messages if isinstance(m, WriteSummary)]
        log.info(
            "stream batch %d: %d stored, %d already stored",
            batchId,
            sum(s.stored for s in done),
            sum(s.duplicates for s in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("stream batch %d failed; its replay stores only what is missing", batchId)


def _rows(
    opts: WriteOptions, partition: int, batches: Iterator[Any], digest: WriteDigest
) -> Iterator[_Row]:
    """The rows as messages to append, each added to `digest` as the DataFrame holds it
    (hashed with a writeId, only counted without one)."""
    ids = UniqIdGenerator()
    index = itertools.count()
    for batch in batches:
        cols = {
            name: batch.column(name).to_pylist()
            for name in batch.schema.names
            if name in _WRITE_COLUMNS  # other columns (a read's msgId, ...) are not written
        }
        for i in range(batch.num_rows):
            n = next(index)
            body = cols["body"][i]
            if body is None:
                raise BadOption("schema", f"row {n} of partition {partition} has a null body")
            if isinstance(body, str):
                body = body.encode("utf-8")
            # As Kafka's sink: the option, when given, overrides the rows' topic column.
            topic = opts.topic or (cols["topic"][i] if "topic" in cols else None)
            if topic is None:
                raise BadOption("topic", f"row {n} of partition {partition} has no topic")
            props: dict[str, str] = {}
            for k, v in (cols["properties"][i] if "properties" in cols else None) or ():
                if k not in _RESERVED_PROPERTIES and v is not None:
                    props[k] = v
            tags = cols["tags"][i] if "tags" in cols else None
            raw_keys = cols["keys"][i] if "keys" in cols else None
            keys = raw_keys.split() if isinstance(raw_keys, str) else list(raw_keys or ())
            queue_id = cols["queueId"][i] if "queueId" in cols else None
            if opts.write_id:
                digest.add(topic, queue_id, body, tags or None, keys, props)
            else:
                digest.count(topic)
            if tags:
                props[TAGS] = tags
            if keys:
                props[KEYS] = KEY_SEPARATOR.join(keys)
            props.setdefault(UNIQ_KEY, ids.next_id())
            if queue_id is None:
                # Deterministic, so that a retried task sends the very same requests.
                spread = abs(java_string_hash(keys[0])) if keys else partition + n
                queue_id = spread % opts.queues_per_topic
            sys_flag = 0
            if len(body) > COMPRESS_OVER_BYTES_DEFAULT:
                body, sys_flag = compress(body, Compression.ZLIB)
            yield _Row(topic, int(queue_id), body, encode_properties(props), sys_flag)


def _append(conn: Connection, request: Any) -> Any | None:
    """One Append, retried with the same sequence while the commit log is unreachable. None:
    an earlier attempt stored this sequence (FAILED_PRECONDITION, see the module docstring)."""
    deadline = time.monotonic() + APPEND_RETRY_S
    backoff = Backoff()
    while True:
        try:
            return conn.call(conn.commitlog().Append, request, name="CommitLog/Append")
        except FailedPrecondition as err:
            # The store's two answers for an old sequence ("not after its last stored
            # sequence", "the records of sequence N expired") both mean it was stored.
            if "sequence" not in err.details:
                raise
            return None
        except (Unavailable, DeadlineExceeded):
            if time.monotonic() + backoff.pause_s > deadline:
                raise
            time.sleep(backoff.next_s())


def write_partition(
    opts: WriteOptions,
    producer_id: str,
    partition: int,
    batches: Iterator[Any],
    *,
    send: bool = True,
) -> WriteSummary:
    """Append one task's rows, `opts.batch_messages` per request, sequences 0, 1, 2, ...
    With `send` False (a rerun of a completed write), only digest them."""
    summary = WriteSummary(partition, 0, 0, 0)
    rows = _rows(opts, partition, batches, summary.digest)
    if not send:
        for _ in rows:
            pass
        return summary
    with Connection(opts.settings) as conn:
        for sequence in itertools.count():
            chunk = list(itertools.islice(rows, opts.batch_messages))
            if not chunk:
                break
            response = _append(conn, append_request(producer_id, sequence, chunk)[0])
            summary.requests += 1
            if response is None or response.duplicate:
                summary.duplicates += len(chunk)
                continue
            for i, status in enumerate(response.statuses):
                if status != cl_pb.PUT_OK:
                    why = {r.index: r for r in response.refusals}.get(i)
                    raise refusal(
                        cl_pb.PutStatus.Name(status),
                        why.reason if why else "",
                        field=why.field if why else "",
                        index=i,
                    )
            summary.stored += len(chunk)
    return summary


# -- the source ------------------------------------------------------------------------------


class MqstoreDataSource(DataSource):
    """format("mqstore"): batch and streaming reads of a topic, batch and streaming writes."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return read_schema(*parse_mode(self.options), *parse_columns(self.options))

    def reader(self, schema: StructType) -> MqstoreBatchReader:
        opts = read_options(self.options, streaming=False)
        _check_read_schema(schema, opts)
        return MqstoreBatchReader(opts, schema)

    def streamReader(self, schema: StructType) -> MqstoreStreamReader:
        opts = read_options(self.options, streaming=True)
        _check_read_schema(schema, opts)
        return MqstoreStreamReader(opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> MqstoreStreamWriter:
        if overwrite:
            raise BadOption("outputMode", "a topic is append-only: use outputMode('append')")
        return MqstoreStreamWriter(write_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> MqstoreWriter:
        if overwrite:
            raise BadOption("mode", "a topic is append-only: use mode('append')")
        return MqstoreWriter(write_options(self.options), schema)
