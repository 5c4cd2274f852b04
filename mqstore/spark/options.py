"""Options of `format("mqstore")`, parsed and checked before any task runs.

Spark hands a data source its options as a case-insensitive dict of strings; everything here
takes such a mapping and returns typed values, or raises `BadOption` naming the option. No
pyspark import: the parsing is plain Python and tested without a session.

Modelled on the Kafka connector (reference/spark.md §2.1):

    connection      commitlog, cq, index (comma-separated addresses), tokenFile, tlsCa,
                    tlsCert, tlsKey, tlsServerName, timeoutS; each also as "mqstore.<name>";
                    anything not given falls back to MQSTORE_* (ClientSettings.from_env)
    topic           required for reads; for writes, overrides the rows' `topic` column
    queues          "0,1,2" or "[0,1,2]": the queues read (default: every queue of the topic)
    startingOffsets "earliest" | "latest" (streaming only) | JSON {"0": 23, "1": -2} or
                    {"<topic>": {...}}; -2 = earliest, -1 = latest. Default: earliest for a
                    batch read, latest for a new streaming query
    endingOffsets   "latest" | JSON, -1 = latest (-2 refused). Batch only
    startingTimestamp / endingTimestamp               one store time (ms) for every queue
    startingOffsetsByTimestamp / endingOffsetsByTimestamp   JSON {"0": ms, ...}
                    resolved with GetOffsetByTime (first message stored at or after it);
                    precedence: timestamp, then by-timestamp, then offsets (as Kafka's)
    minPartitions   at least this many Spark partitions: large ranges are split
    maxRecordsPerPartition   no partition reads more than this many offsets
    failOnDataLoss  "true" (default) | "false": a requested offset that retention removed
                    fails the read, or is skipped
    mode            what a read does with a record that can never be handed out (damaged in
                    the store, or a body that does not decompress), as Spark's file sources
                    treat a malformed record: "FAILFAST" (default) fails the read naming the
                    record's queue, queue offset and commit-log offset; "DROPMALFORMED" drops
                    it, logging it and each partition's count (WARNING: the executors' logs,
                    or spark.tvf.python_worker_logs() with
                    spark.sql.pyspark.worker.logging.enabled); "PERMISSIVE" keeps a row for it
                    with its topic, queueId, queueOffset and commitLogOffset, the other
                    columns null and the error in the corrupt-record column
    columnNameOfCorruptRecord   that column's name under PERMISSIVE (default
                    "_corrupt_record"), a string column added at the end of the schema
    maxOffsetsPerTrigger     streaming: at most this many offsets per micro-batch
    pullMessages    messages per Pull on the executors (1..1024)
    writeId, writeBatchMessages, queuesPerTopic,      writes (see WriteOptions)
    ledgerTopic, reportFile
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mqstore.client.settings import ClientSettings, TlsSettings, split_addresses
from mqstore.errors import DataLoss, InvalidArgument, OutOfRange
from mqstore.formats.record import validate_topic
from mqstore.limits import MessageLimits

_LIMITS = MessageLimits()

# Kafka's sentinels in offset JSON.
EARLIEST = -2
LATEST = -1
# A Pull answers at most 1,024 messages (cq_svc's cap, PULL_MESSAGES_MAX in the SDK); 256 keeps
# one answer of 1 KiB messages well inside the gRPC message limit while amortising the call.
PULL_MESSAGES_DEFAULT = 256
PULL_MESSAGES_MAX = 1_024
# Messages per Append from the writer: one request = one write under the commit log's lock.
# 500 x a few KiB stays well under the producer's 32 MiB request bound.
WRITE_BATCH_MESSAGES_DEFAULT = 500
# Spark partitions a read may be split into: past this the planning itself (a pickle per
# partition) dominates, and a typo ("minPartitions=1000000") would stall the driver.
PARTITIONS_MAX = 100_000
QUEUES_PER_TOPIC_DEFAULT = 4  # as the SDK's Producer (RocketMQ's defaultTopicQueueNums)
# Where batch writes with a writeId keep their manifests (mqstore/spark/write_ledger.py; kept
# here too, so that parsing options needs no client import).
LEDGER_TOPIC_DEFAULT = "MQSTORE_SPARK_WRITES"
# Longest write id: the producer id "spark:<writeId>:<partition>" stays within the store's
# 256-byte limit.
WRITE_ID_CHARS_MAX = 200

# Spark's parse modes (ParseMode): what a read does with a malformed record.
ParseMode = Literal["PERMISSIVE", "DROPMALFORMED", "FAILFAST"]
PARSE_MODES: tuple[ParseMode, ...] = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
# FAILFAST by default, unlike Spark's file sources (PERMISSIVE): PERMISSIVE adds a column to
# the schema, and a read that stopped at a damaged record before keeps doing so unless asked.
MODE_DEFAULT: ParseMode = "FAILFAST"
CORRUPT_RECORD_COLUMN_DEFAULT = "_corrupt_record"  # Spark's columnNameOfCorruptRecord


class BadOption(InvalidArgument):
    """An option of format("mqstore") that cannot work; `field` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"option {option!r}: {message}", field=option)
        self.option = option


class MalformedRecord(DataLoss):
    """A read met a record that can never be handed out, under mode FAILFAST."""

    def __init__(
        self, topic: str, queue_id: int, queue_offset: int, commit_log_offset: int, reason: str
    ) -> None:
        super().__init__(
            f"topic {topic!r} queue {queue_id}: the record at queue offset {queue_offset} "
            f"(commit-log offset {commit_log_offset}) can never be read: {reason}. Parse mode: "
            "FAILFAST; set the option mode to DROPMALFORMED or PERMISSIVE to read past it"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:  # rebuilt from its fields (Spark pickles it)
        return (
            MalformedRecord,
            (self.topic, self.queue_id, self.queue_offset, self.commit_log_offset, self.reason),
        )


class OffsetsRemoved(OutOfRange):
    """Offsets a read asked for were removed by retention (failOnDataLoss=true)."""

    def __init__(self, topic: str, queue_id: int, offset: int, min_offset: int) -> None:
        super().__init__(
            f"topic {topic!r} queue {queue_id}: offsets {offset}..{min_offset - 1} were removed "
            f"by retention (the queue now starts at {min_offset}); set failOnDataLoss=false "
            "to skip them"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.min_offset = min_offset


# -- helpers over the raw mapping ------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Spark's CaseInsensitiveDict already lower-cases keys; a plain dict (tests, jobs) may not."""
    return {str(k).lower(): str(v) for k, v in options.items()}


def _get(opts: Mapping[str, str], name: str) -> str | None:
    value = opts.get(name.lower())
    if value is None:
        value = opts.get(f"mqstore.{name}".lower())
    return value


def parse_bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(opts, name)
    if value is None:
        return default
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise BadOption(name, f"{value!r} is not true or false")


def parse_int(
    opts: Mapping[str, str], name: str, *, low: int, high: int | None = None
) -> int | None:
    value = _get(opts, name)
    if value is None:
        return None
    try:
        n = int(value.strip())
    except ValueError:
        raise BadOption(name, f"{value!r} is not an integer") from None
    if n < low or (high is not None and n > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise BadOption(name, f"{n} is outside {bound}")
    return n


def _json(name: str, value: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise BadOption(name, f"not JSON ({err.msg} at character {err.pos})") from None


def _queue_id(name: str, key: object) -> int:
    try:
        q = int(str(key))
    except ValueError:
        raise BadOption(name, f"{key!r} is not a queue id") from None
    if not 0 <= q <= _LIMITS.queue_id_max:
        raise BadOption(name, f"queue id {q} is outside 0..{_LIMITS.queue_id_max}")
    return q


def per_queue_json(name: str, value: str, topic: str) -> dict[int, int]:
    """{"0": n, ...} or Kafka's {"<topic>": {"0": n, ...}} -> {0: n, ...}."""
    doc = _json(name, value)
    if not isinstance(doc, dict):
        raise BadOption(name, 'expected a JSON object such as {"0": 23, "1": -2}')
    if len(doc) == 1 and topic in doc and isinstance(doc[topic], dict):
        doc = doc[topic]
        assert isinstance(doc, dict)
    elif any(isinstance(v, dict) for v in doc.values()):
        raise BadOption(name, f"names a topic other than {topic!r}: {sorted(doc)}")
    out: dict[int, int] = {}
    for key, raw in doc.items():
        q = _queue_id(name, key)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise BadOption(name, f"queue {q}: {raw!r} is not an integer")
        out[q] = raw
    return out


# -- connection ------------------------------------------------------------------------------


def client_settings(
    options: Mapping[str, str], env: Mapping[str, str] | None = None
) -> ClientSettings:
    """The services' addresses and security from the options, the rest from MQSTORE_*."""
    opts = _lower(options)
    env = os.environ if env is None else env
    overrides: dict[str, object] = {}
    commitlog = _get(opts, "commitlog")
    if commitlog is not None:
        if not commitlog.strip():
            raise BadOption("commitlog", "is empty")
        overrides["commitlog"] = commitlog.strip()
    for name in ("cq", "index"):
        value = _get(opts, name)
        if value is not None:
            addresses = split_addresses(value)
            if not addresses:
                raise BadOption(name, "lists no address")
            overrides[name] = addresses
    token_file = _get(opts, "tokenFile")
    if token_file:
        overrides["token_file"] = token_file
    timeout = _get(opts, "timeoutS")
    if timeout is not None:
        try:
            seconds = float(timeout)
        except ValueError:
            raise BadOption("timeoutS", f"{timeout!r} is not a number of seconds") from None
        if not seconds > 0:
            raise BadOption("timeoutS", "must be positive")
        overrides["timeout_s"] = seconds
    tls = {
        key: _get(opts, name)
        for key, name in (
            ("ca_file", "tlsCa"),
            ("cert_file", "tlsCert"),
            ("key_file", "tlsKey"),
            ("server_name", "tlsServerName"),
        )
        if _get(opts, name)
    }
    try:
        if tls:
            overrides["tls"] = TlsSettings(**tls)
        return ClientSettings.from_env(env, **overrides)
    except BadOption:
        raise
    except InvalidArgument as err:
        raise BadOption(err.field or "connection", str(err)) from None


# -- reads -----------------------------------------------------------------------------------

Bound = Literal["earliest", "latest"]


@dataclass(frozen=True)
class OffsetSpec:
    """Where each queue starts or ends: a default for queues not named, per-queue offsets
    (EARLIEST / LATEST sentinels allowed), and per-queue store times to resolve."""

    default: Bound
    offsets: dict[int, int] = field(default_factory=dict)
    timestamps: dict[int, int] = field(default_factory=dict)  # queue -> ms
    all_timestamp: int | None = None  # one ms for every queue

    @property
    def by_time(self) -> bool:
        return self.all_timestamp is not None or bool(self.timestamps)


@dataclass(frozen=True)
class ReadOptions:
    settings: ClientSettings
    topic: str
    queues: tuple[int, ...] | None  # None: every queue of the topic
    starting: OffsetSpec
    ending: OffsetSpec  # streaming: always "latest"
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    max_offsets_per_trigger: int | None
    pull_messages: int
    mode: ParseMode = MODE_DEFAULT
    corrupt_record_column: str = CORRUPT_RECORD_COLUMN_DEFAULT


def _topic(opts: Mapping[str, str], *, required: bool) -> str | None:
    topic = _get(opts, "topic")
    if topic is None:
        if required:
            raise BadOption("topic", "is required")
        return None
    try:
        validate_topic(topic, _LIMITS)
    except InvalidArgument as err:
        raise BadOption("topic", str(err)) from None
    return topic


def _queues(opts: Mapping[str, str]) -> tuple[int, ...] | None:
    value = _get(opts, "queues")
    if value is None:
        return None
    text = value.strip()
    items: list[object]
    if text.startswith("["):
        doc = _json("queues", text)
        if not isinstance(doc, list):
            raise BadOption("queues", "expected a JSON list of queue ids")
        items = list(doc)
    else:
        items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise BadOption("queues", "lists no queue (leave it out to read every queue)")
    if any(isinstance(i, bool | float) for i in items):
        raise BadOption("queues", f"{items!r} holds something that is not a queue id")
    return tuple(dict.fromkeys(_queue_id("queues", i) for i in items))


def _timestamp(opts: Mapping[str, str], name: str) -> int | None:
    return parse_int(opts, name, low=0)


def _by_timestamp(opts: Mapping[str, str], name: str, topic: str) -> dict[int, int]:
    value = _get(opts, name)
    if value is None:
        return {}
    out = per_queue_json(name, value, topic)
    negative = sorted(q for q, ms in out.items() if ms < 0)
    if negative:
        raise BadOption(name, f"queues {negative}: a store time is >= 0 ms")
    return out


def _starting(opts: Mapping[str, str], topic: str, *, streaming: bool) -> OffsetSpec:
    default: Bound = "latest" if streaming else "earliest"
    offsets: dict[int, int] = {}
    value = _get(opts, "startingOffsets")
    if value is not None:
        text = value.strip()
        if text.lower() in ("earliest", "latest"):
            default = "earliest" if text.lower() == "earliest" else "latest"
            if default == "latest" and not streaming:
                raise BadOption("startingOffsets", "'latest' is for streaming reads only")
        else:
            offsets = per_queue_json("startingOffsets", text, topic)
            bad = sorted(q for q, n in offsets.items() if n < EARLIEST)
            if bad:
                raise BadOption("startingOffsets", f"queues {bad}: offsets are >= 0, -2 or -1")
            if not streaming and any(n == LATEST for n in offsets.values()):
                raise BadOption("startingOffsets", "-1 (latest) is for streaming reads only")
    return OffsetSpec(
        default,
        offsets,
        _by_timestamp(opts, "startingOffsetsByTimestamp", topic),
        _timestamp(opts, "startingTimestamp"),
    )


def _ending(opts: Mapping[str, str], topic: str, *, streaming: bool) -> OffsetSpec:
    names = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
    if streaming:
        given = [n for n in names if _get(opts, n) is not None]
        if given:
            raise BadOption(given[0], "is for batch reads only (a stream has no end)")
        return OffsetSpec("latest")
    offsets: dict[int, int] = {}
    value = _get(opts, "endingOffsets")
    if value is not None:
        text = value.strip()
        if text.lower() == "earliest":
            raise BadOption("endingOffsets", "'earliest' would read nothing; use 'latest' or JSON")
        if text.lower() != "latest":
            offsets = per_queue_json("endingOffsets", text, topic)
            if any(n == EARLIEST for n in offsets.values()):
                raise BadOption("endingOffsets", "-2 (earliest) is not allowed as an end")
            bad = sorted(q for q, n in offsets.items() if n < LATEST)
            if bad:
                raise BadOption("endingOffsets", f"queues {bad}: offsets are >= 0 or -1")
    return OffsetSpec(
        "latest",
        offsets,
        _by_timestamp(opts, "endingOffsetsByTimestamp", topic),
        _timestamp(opts, "endingTimestamp"),
    )


def parse_mode(options: Mapping[str, str]) -> tuple[ParseMode, str]:
    """(mode, the corrupt-record column's name): what decides a read's schema."""
    opts = _lower(options)
    value = _get(opts, "mode")
    mode = MODE_DEFAULT
    if value is not None:
        found = [m for m in PARSE_MODES if m == value.strip().upper()]
        if not found:
            raise BadOption("mode", f"{value!r} is not one of {', '.join(PARSE_MODES)}")
        mode = found[0]
    column = _get(opts, "columnNameOfCorruptRecord")
    if column is None:
        return mode, CORRUPT_RECORD_COLUMN_DEFAULT
    if not column.strip():
        raise BadOption("columnNameOfCorruptRecord", "is empty")
    return mode, column.strip()


def read_options(
    options: Mapping[str, str], *, streaming: bool, env: Mapping[str, str] | None = None
) -> ReadOptions:
    opts = _lower(options)
    topic = _topic(opts, required=True)
    assert topic is not None
    max_offsets = parse_int(opts, "maxOffsetsPerTrigger", low=1)
    if max_offsets is not None and not streaming:
        raise BadOption("maxOffsetsPerTrigger", "is for streaming reads only")
    pull = parse_int(opts, "pullMessages", low=1, high=PULL_MESSAGES_MAX)
    mode, corrupt_column = parse_mode(opts)
    return ReadOptions(
        settings=client_settings(opts, env),
        topic=topic,
        queues=_queues(opts),
        starting=_starting(opts, topic, streaming=streaming),
        ending=_ending(opts, topic, streaming=streaming),
        min_partitions=parse_int(opts, "minPartitions", low=1, high=PARTITIONS_MAX),
        max_records_per_partition=parse_int(opts, "maxRecordsPerPartition", low=1),
        fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
        max_offsets_per_trigger=max_offsets,
        pull_messages=PULL_MESSAGES_DEFAULT if pull is None else pull,
        mode=mode,
        corrupt_record_column=corrupt_column,
    )


# -- writes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """`write_id`: names this write, so that a rerun stores nothing more, whatever its
    partitioning, and a reuse for other rows fails (mqstore/spark/write_ledger.py); None: the
    driver makes one per write, and a rerun stores the rows again. `ledger_topic`: where the
    manifests of writes with an id go. `report_file`: a path on the driver where the write
    leaves its WriteReport as JSON (what `mqstore.spark.write` returns)."""

    settings: ClientSettings
    topic: str | None  # every row's topic when given (as Kafka's sink); else the topic column
    write_id: str | None
    batch_messages: int
    queues_per_topic: int
    ledger_topic: str = LEDGER_TOPIC_DEFAULT
    report_file: str | None = None


def write_options(options: Mapping[str, str], env: Mapping[str, str] | None = None) -> WriteOptions:
    opts = _lower(options)
    write_id = _get(opts, "writeId")
    if write_id is not None:
        if not write_id or len(write_id) > WRITE_ID_CHARS_MAX:
            raise BadOption("writeId", f"must be 1..{WRITE_ID_CHARS_MAX} characters")
        if any(c in write_id for c in "\x01\x02"):
            raise BadOption("writeId", "holds a 0x01 or 0x02 character")
    batch = parse_int(opts, "writeBatchMessages", low=1, high=_LIMITS.batch_messages_max)
    queues = parse_int(opts, "queuesPerTopic", low=1, high=_LIMITS.queue_id_max + 1)
    for name in ("startingOffsets", "endingOffsets", "maxOffsetsPerTrigger", "queues"):
        if _get(opts, name) is not None:
            raise BadOption(name, "is a read option; a write does not take it")
    ledger = _get(opts, "ledgerTopic") or LEDGER_TOPIC_DEFAULT
    try:
        validate_topic(ledger, _LIMITS)
    except InvalidArgument as err:
        raise BadOption("ledgerTopic", str(err)) from None
    return WriteOptions(
        settings=client_settings(opts, env),
        topic=_topic(opts, required=False),
        write_id=write_id,
        batch_messages=WRITE_BATCH_MESSAGES_DEFAULT if batch is None else batch,
        queues_per_topic=QUEUES_PER_TOPIC_DEFAULT if queues is None else queues,
        ledger_topic=ledger,
        report_file=_get(opts, "reportFile") or None,
    )
