"""Options of `format("mqstore")`, parsed and checked before any task runs.

Spark hands a data source its options as a case-insensitive dict of strings; everything here
takes such a mapping and returns typed values, or raises `BadOption` naming the option. No
pyspark import: the parsing is plain Python and tested without a session.

Modelled on the Kafka connector (reference/spark.md §2.1):

    connection      commitlog, cq, index (comma-separated addresses), tokenFile, tlsCa,
                    tlsCert, tlsKey, tlsServerName, timeoutS; each also as "mqstore.<name>";
                    anything not given falls back to MQSTORE_* (ClientSettings.from_env)
    topic           a read of one topic; for writes, overrides the rows' `topic` column
    topics / subscribe      several topics, comma-separated (Kafka's subscribe)
    subscribePattern        every topic whose whole name matches this regular expression
                    (Kafka's); a stream picks up matching topics created while it runs.
                    Reads take exactly one of topic, topics, subscribe, subscribePattern;
                    a named topic that does not exist fails the read naming it
    queues          "0,1,2" or "[0,1,2]": the queues read (default: every queue of the topic);
                    with `topic` only
    startingOffsets "earliest" | "latest" (streaming only) | JSON {"0": 23, "1": -2} (one
                    topic) or {"<topic>": {"0": 23}, ...}; -2 = earliest, -1 = latest.
                    Default: earliest for a batch read, latest for a new streaming query. An
                    offset past a queue's end is data loss (failOnDataLoss)
    endingOffsets   "latest" | JSON, -1 = latest (-2 refused). Batch only
    startingTimestamp / endingTimestamp               one store time (ms) for every queue
    startingOffsetsByTimestamp / endingOffsetsByTimestamp   JSON {"0": ms, ...} or per topic
                    resolved with GetOffsetByTime (first message stored at or after it);
                    precedence: timestamp, then by-timestamp, then offsets (as Kafka's)
    startingOffsetsByTimestampStrategy  "error" (default) | "latest": a starting time after
                    a queue's last message fails the read, or starts at the queue's end
    columns         "mqstore" (default) | "kafka": the Kafka connector's columns (key, value,
                    topic, partition, offset, timestamp, timestampType; KAFKA_SCHEMA)
    includeHeaders  "false" (default) | "true": with columns=kafka, a `headers` column
    minPartitions   at least this many Spark partitions: large ranges are split
    maxRecordsPerPartition   no partition reads more than this many offsets
    failOnDataLoss  "true" (default) | "false": offsets retention removed, or a queue that
                    ends before where the read or the stream's checkpoint is (the queue was
                    rebuilt, or the offsets are another store's), fail the read, or are
                    skipped (a stream then goes on from the queue's end), as Kafka's
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
    minOffsetsPerTrigger     streaming: a trigger with fewer new offsets runs no batch, until
                    maxTriggerDelay (default "15m"; "500ms", "30s", "2h", ...) passed since
                    the last batch (as Kafka's; ignored under Trigger.AvailableNow)
    pullMessages    messages per Pull on the executors (1..1024)
    writeId, writeBatchMessages, queuesPerTopic,      writes (see WriteOptions)
    ledgerTopic, reportFile
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from mqstore.client.settings import ClientSettings, TlsSettings, split_addresses
from mqstore.errors import DataLoss, InvalidArgument, NotFound, OutOfRange
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

# The options that name what a read subscribes to; a read takes exactly one.
SUBSCRIBE_OPTIONS = ("topic", "topics", "subscribe", "subscribePattern")
# The read's columns: mqstore's own, or the Kafka connector's (service_source.KAFKA_SCHEMA).
Columns = Literal["mqstore", "kafka"]
COLUMNS: tuple[Columns, ...] = ("mqstore", "kafka")
# What a starting time after a queue's last message does (Kafka's
# startingOffsetsByTimestampStrategy): fail the read, or start at the queue's end.
TimestampStrategy = Literal["error", "latest"]
TIMESTAMP_STRATEGIES: tuple[TimestampStrategy, ...] = ("error", "latest")
# Kafka's maxTriggerDelay default: with minOffsetsPerTrigger, a batch runs at least this often.
MAX_TRIGGER_DELAY_DEFAULT_MS = 15 * 60 * 1_000
# Duration units of maxTriggerDelay, as Spark's time strings (a bare number is milliseconds).
_DURATION_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)


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


class OffsetsPastEnd(OutOfRange):
    """A queue ends before where a read starts or a stream stands (failOnDataLoss=true): it
    was rebuilt or truncated, or the offsets are another store's."""

    def __init__(self, topic: str, queue_id: int, offset: int, end: int) -> None:
        super().__init__(
            f"topic {topic!r} queue {queue_id}: offset {offset} is past the queue's end {end} "
            "(the queue holds fewer messages than the read or the stream's checkpoint expects: "
            "it was rebuilt or truncated, or the offsets are another store's); set "
            "failOnDataLoss=false to go on from the queue's end"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.end = end


class NoOffsetForTime(NotFound):
    """No message stored at or after a starting time (startingOffsetsByTimestampStrategy
    error, Kafka's default)."""

    def __init__(self, topic: str, queue_id: int, timestamp_ms: int) -> None:
        super().__init__(
            f"topic {topic!r} queue {queue_id}: no message was stored at or after "
            f"{timestamp_ms} ms (the starting time); set startingOffsetsByTimestampStrategy="
            "latest to start such a queue at its end"
        )
        self.topic = topic
        self.queue_id = queue_id
        self.timestamp_ms = timestamp_ms


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


def per_topic_json(name: str, value: str, sub: Subscription) -> dict[str, dict[int, int]]:
    """Kafka's {"<topic>": {"0": n, ...}, ...}, or {"0": n, ...} for a read of one topic ->
    {topic: {0: n, ...}}; every topic named must be one the read covers."""
    doc = _json(name, value)
    if not isinstance(doc, dict):
        raise BadOption(name, 'expected a JSON object such as {"0": 23, "1": -2}')
    nested = [v for v in doc.values() if isinstance(v, dict)]
    if nested and len(nested) != len(doc):
        raise BadOption(name, 'mixes queues and topics; give {"<topic>": {"0": 23}, ...}')
    if not nested:
        if not doc:
            return {}
        if sub.single is None:
            raise BadOption(
                name, 'the read covers several topics: give {"<topic>": {"0": 23}, ...}'
            )
        return {sub.single: _per_queue(name, doc)}
    other = sorted(t for t in doc if not sub.covers(t))
    if other:
        raise BadOption(name, f"names topics {other}, other than the topics read ({sub})")
    return {str(t): _per_queue(name, per) for t, per in doc.items()}


def _per_queue(name: str, doc: dict[str, object]) -> dict[int, int]:
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
class Subscription:
    """What a read covers: named topics, or every topic whose whole name matches `pattern`."""

    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None

    @property
    def single(self) -> str | None:
        """The topic of a read of one named topic, else None."""
        return self.topics[0] if self.pattern is None and len(self.topics) == 1 else None

    def covers(self, topic: str) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return topic in self.topics

    def __str__(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern {self.pattern.pattern!r}"
        return ", ".join(self.topics)


@dataclass(frozen=True)
class OffsetSpec:
    """Where each queue starts or ends: a default for queues not named, per-topic per-queue
    offsets (EARLIEST / LATEST sentinels allowed), and store times to resolve."""

    default: Bound
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> queue -> n
    timestamps: dict[str, dict[int, int]] = field(default_factory=dict)  # topic -> queue -> ms
    all_timestamp: int | None = None  # one ms for every queue

    @property
    def by_time(self) -> bool:
        return self.all_timestamp is not None or any(self.timestamps.values())

    def offset(self, topic: str, queue_id: int) -> int | None:
        return self.offsets.get(topic, {}).get(queue_id)

    def timestamp(self, topic: str, queue_id: int) -> int | None:
        if self.all_timestamp is not None:
            return self.all_timestamp
        return self.timestamps.get(topic, {}).get(queue_id)


@dataclass(frozen=True)
class ReadOptions:
    settings: ClientSettings
    subscription: Subscription
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
    columns: Columns = "mqstore"
    include_headers: bool = False
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_DEFAULT_MS
    timestamp_strategy: TimestampStrategy = "error"


def _topic(opts: Mapping[str, str], *, required: bool) -> str | None:
    topic = _get(opts, "topic")
    if topic is None:
        if required:
            raise BadOption(
                "topic",
                "is required (or topics / subscribe: several, comma-separated; or "
                "subscribePattern: a regular expression over topic names)",
            )
        return None
    if "," in topic:
        raise BadOption("topic", f"{topic!r} names several topics: give them as the option topics")
    return _valid_topic("topic", topic)


def _valid_topic(option: str, topic: str) -> str:
    try:
        validate_topic(topic, _LIMITS)
    except InvalidArgument as err:
        raise BadOption(option, str(err)) from None
    return topic


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [n for n in SUBSCRIBE_OPTIONS if _get(opts, n) is not None]
    if len(given) > 1:
        raise BadOption(given[1], f"give one of {', '.join(SUBSCRIBE_OPTIONS)}, not {given}")
    name = given[0] if given else "topic"
    if name == "topic":
        topic = _topic(opts, required=True)
        assert topic is not None
        return Subscription((topic,))
    value = _get(opts, name)
    assert value is not None
    if name == "subscribePattern":
        if not value.strip():
            raise BadOption(name, "is empty")
        try:
            return Subscription(pattern=re.compile(value))
        except re.error as err:
            raise BadOption(name, f"{value!r} is not a regular expression ({err})") from None
    topics = [t.strip() for t in value.split(",") if t.strip()]
    if not topics:
        raise BadOption(name, "lists no topic")
    return Subscription(tuple(dict.fromkeys(_valid_topic(name, t) for t in topics)))


def _queues(opts: Mapping[str, str], sub: Subscription) -> tuple[int, ...] | None:
    value = _get(opts, "queues")
    if value is None:
        return None
    if sub.single is None:
        raise BadOption("queues", "is for a read of one topic (the option topic)")
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


def _by_timestamp(
    opts: Mapping[str, str], name: str, sub: Subscription
) -> dict[str, dict[int, int]]:
    value = _get(opts, name)
    if value is None:
        return {}
    out = per_topic_json(name, value, sub)
    negative = sorted((t, q) for t, per in out.items() for q, ms in per.items() if ms < 0)
    if negative:
        raise BadOption(name, f"queues {negative}: a store time is >= 0 ms")
    return out


def _offsets_json_values(per_topic: dict[str, dict[int, int]]) -> list[int]:
    return [n for per in per_topic.values() for n in per.values()]


def _starting(opts: Mapping[str, str], sub: Subscription, *, streaming: bool) -> OffsetSpec:
    default: Bound = "latest" if streaming else "earliest"
    offsets: dict[str, dict[int, int]] = {}
    value = _get(opts, "startingOffsets")
    if value is not None:
        text = value.strip()
        if text.lower() in ("earliest", "latest"):
            default = "earliest" if text.lower() == "earliest" else "latest"
            if default == "latest" and not streaming:
                raise BadOption("startingOffsets", "'latest' is for streaming reads only")
        else:
            offsets = per_topic_json("startingOffsets", text, sub)
            bad = sorted(
                (t, q) for t, per in offsets.items() for q, n in per.items() if n < EARLIEST
            )
            if bad:
                raise BadOption("startingOffsets", f"queues {bad}: offsets are >= 0, -2 or -1")
            if not streaming and LATEST in _offsets_json_values(offsets):
                raise BadOption("startingOffsets", "-1 (latest) is for streaming reads only")
    return OffsetSpec(
        default,
        offsets,
        _by_timestamp(opts, "startingOffsetsByTimestamp", sub),
        _timestamp(opts, "startingTimestamp"),
    )


def _ending(opts: Mapping[str, str], sub: Subscription, *, streaming: bool) -> OffsetSpec:
    names = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
    if streaming:
        given = [n for n in names if _get(opts, n) is not None]
        if given:
            raise BadOption(given[0], "is for batch reads only (a stream has no end)")
        return OffsetSpec("latest")
    offsets: dict[str, dict[int, int]] = {}
    value = _get(opts, "endingOffsets")
    if value is not None:
        text = value.strip()
        if text.lower() == "earliest":
            raise BadOption("endingOffsets", "'earliest' would read nothing; use 'latest' or JSON")
        if text.lower() != "latest":
            offsets = per_topic_json("endingOffsets", text, sub)
            if EARLIEST in _offsets_json_values(offsets):
                raise BadOption("endingOffsets", "-2 (earliest) is not allowed as an end")
            bad = sorted((t, q) for t, per in offsets.items() for q, n in per.items() if n < LATEST)
            if bad:
                raise BadOption("endingOffsets", f"queues {bad}: offsets are >= 0 or -1")
    return OffsetSpec(
        "latest",
        offsets,
        _by_timestamp(opts, "endingOffsetsByTimestamp", sub),
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


def _choice(opts: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = _get(opts, name)
    if value is None:
        return default
    text = value.strip().lower()
    if text not in choices:
        raise BadOption(name, f"{value!r} is not one of {', '.join(choices)}")
    return text


def parse_columns(options: Mapping[str, str]) -> tuple[Columns, bool]:
    """(columns, includeHeaders): with parse_mode, what decides a read's schema."""
    opts = _lower(options)
    columns: Columns = (
        "kafka" if _choice(opts, "columns", COLUMNS, "mqstore") == "kafka" else "mqstore"
    )
    headers = parse_bool(opts, "includeHeaders", False)
    if headers and columns != "kafka":
        raise BadOption(
            "includeHeaders",
            "is for columns=kafka (mqstore's columns carry every property in 'properties')",
        )
    return columns, headers


def parse_duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    """A duration as Spark's time strings: "500ms", "30s", "15m", "2h", "1d"; a bare number
    is milliseconds."""
    value = _get(opts, name)
    if value is None:
        return default
    found = _DURATION.fullmatch(value)
    if found is None:
        raise BadOption(name, f"{value!r} is not a duration such as 500ms, 30s, 15m or 2h")
    unit = (found.group(2) or "ms").lower()
    return int(found.group(1)) * _DURATION_MS[unit]


def read_options(
    options: Mapping[str, str], *, streaming: bool, env: Mapping[str, str] | None = None
) -> ReadOptions:
    opts = _lower(options)
    sub = _subscription(opts)
    max_offsets = parse_int(opts, "maxOffsetsPerTrigger", low=1)
    min_offsets = parse_int(opts, "minOffsetsPerTrigger", low=1)
    delay_ms = parse_duration_ms(opts, "maxTriggerDelay", MAX_TRIGGER_DELAY_DEFAULT_MS)
    if not streaming:
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if _get(opts, name) is not None:
                raise BadOption(name, "is for streaming reads only")
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise BadOption(
            "minOffsetsPerTrigger", f"{min_offsets} is over maxOffsetsPerTrigger {max_offsets}"
        )
    pull = parse_int(opts, "pullMessages", low=1, high=PULL_MESSAGES_MAX)
    mode, corrupt_column = parse_mode(opts)
    columns, headers = parse_columns(opts)
    strategy: TimestampStrategy = (
        "latest"
        if _choice(opts, "startingOffsetsByTimestampStrategy", TIMESTAMP_STRATEGIES, "error")
        == "latest"
        else "error"
    )
    return ReadOptions(
        settings=client_settings(opts, env),
        subscription=sub,
        queues=_queues(opts, sub),
        starting=_starting(opts, sub, streaming=streaming),
        ending=_ending(opts, sub, streaming=streaming),
        min_partitions=parse_int(opts, "minPartitions", low=1, high=PARTITIONS_MAX),
        max_records_per_partition=parse_int(opts, "maxRecordsPerPartition", low=1),
        fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
        max_offsets_per_trigger=max_offsets,
        pull_messages=PULL_MESSAGES_DEFAULT if pull is None else pull,
        mode=mode,
        corrupt_record_column=corrupt_column,
        columns=columns,
        include_headers=headers,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=delay_ms,
        timestamp_strategy=strategy,
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
    read_only = ("startingOffsets", "endingOffsets", "maxOffsetsPerTrigger", "queues")
    for name in (*read_only, "topics", "subscribe", "subscribePattern"):
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
