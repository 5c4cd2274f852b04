"""What a batch write with a `writeId` stored, kept in the store so that a rerun can tell.

    topic MQSTORE_SPARK_WRITES (option ledgerTopic), queue java_hash(writeId) % 8
      one message per completed write, KEYS = writeId, TAGS = "manifest", body JSON:
      {"version": 1, "write_id": ..., "rows": N, "topics": {"orders": N, ...},
       "digests": {"row": hex, "topic": hex, "queue_id": hex, "body": hex, "tags": hex,
                   "keys": hex, "properties": hex},
       "stored": S, "already_stored": D, "committed_at_ms": T}

A write's identity is its writeId and its rows as the DataFrame holds them: topic, queueId when
given, body, tags, keys and properties (not the unique id the writer draws for each message,
nor the queue it picks for a row without one). Each row is hashed whole (BLAKE2b, 128 bits)
and the hashes are summed modulo 2^128: a sum does not depend on the order of the rows nor on
how Spark split them into partitions, and a row twice counts twice. Each field is summed the
same way with a cheaper 64-bit hash, only to name what differs. `WriteDigest`
holds the sums, the row count and the rows per topic; tasks make one each, the driver adds
them up. (A sum of hashes tells different data apart; it is no defence against someone who
crafts rows to collide.)

How the writer uses it (service_source.MqstoreWriter):

    writeId given, no manifest for it      write, then append the manifest (producer id
                                           "spark-ledger:<writeId>", sequence 0: a second
                                           manifest for the id is answered as a duplicate)
    a manifest with the same digest        a rerun: nothing is sent, the report says how many
                                           rows the first run stored
    a manifest with another digest         the id was used for other data: the write fails
                                           before anything is sent, naming what differs
    no writeId                             a write of its own: a rerun stores the rows again

The manifest is looked up through the consume queues, after they have caught up with the
commit log (a manifest appended a moment ago is seen). A write that failed before its manifest
was appended has none: its rerun writes again, and the store's producer idempotence (per
writeId and partition) answers what the first run stored, when the rows come in the same
partitions and order. Manifests live as long as retention keeps the ledger topic's messages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from mqstore.client.admin import Admin
from mqstore.client.connection import Connection
from mqstore.client.consumer import Consumer
from mqstore.client.errors import FailedPrecondition, Unavailable
from mqstore.client.producer import append_request
from mqstore.client.settings import ClientSettings
from mqstore.formats.javahash import java_string_hash
from mqstore.formats.properties import KEYS, TAGS, encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.spark import options

LEDGER_TOPIC_DEFAULT: Final = options.LEDGER_TOPIC_DEFAULT
# Queues of the ledger topic: a lookup reads one of them whole, so they stay short.
LEDGER_QUEUES: Final = 8
MANIFEST_TAG: Final = "manifest"
MANIFEST_VERSION: Final = 1
# How long a lookup waits for the consume queues to catch up with the commit log.
CATCH_UP_S: Final = 60.0
_CATCH_UP_POLL_S: Final = 0.05
_HASH_BYTES: Final = 16
_MODULUS: Final = 1 << (8 * _HASH_BYTES)
_FIELD_MODULUS: Final = 1 << 32
# The six fields' lengths, ahead of their bytes in what a row's BLAKE2b hashes.
_LENGTHS: Final = struct.Struct(">6I")
# The fields of a row that make a write's identity, in the order a difference is named.
FIELDS: Final = ("topic", "queue_id", "body", "tags", "keys", "properties")
_FIELD_NAMES: Final = {
    "topic": "topics",
    "queue_id": "queueIds",
    "body": "bodies",
    "tags": "tags",
    "keys": "keys",
    "properties": "properties",
}


class WriteIdReused(FailedPrecondition):
    """A batch write's writeId was used before for other rows."""


def _text(value: str | None) -> bytes:
    """None and "" apart: a 0x00 prefix for None, 0x01 then the UTF-8 bytes."""
    return b"\x00" if value is None else b"\x01" + value.encode("utf-8", "surrogatepass")


@dataclass(slots=True, eq=False)
class WriteDigest:
    """Rows added so far: their count, the rows per topic, the sum of the rows' 128-bit
    BLAKE2b hashes (the verdict) and per field the sum of its CRC-32s, only to name what
    differs (a tenth of a BLAKE2b's cost; a collision there could only leave a difference
    unnamed). Sums grow as plain integers and are reduced when read (`sums`)."""

    rows: int = 0
    topics: dict[str, int] = field(default_factory=dict)
    row_sum: int = 0
    field_sums: list[int] = field(default_factory=lambda: [0] * len(FIELDS))
    _topic_bytes: dict[str, bytes] = field(default_factory=dict, repr=False)

    def add(
        self,
        topic: str,
        queue_id: int | None,
        body: bytes,
        tags: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """One row as the DataFrame holds it (body before compression)."""
        t = self._topic_bytes.get(topic)
        if t is None:
            t = self._topic_bytes[topic] = _text(topic)
        q = b"\x00" if queue_id is None else b"\x01" + str(queue_id).encode()
        g = b"\x00" if tags is None else b"\x01" + tags.encode("utf-8", "surrogatepass")
        k = "\x00".join(keys).encode("utf-8", "surrogatepass") if keys else b""
        p = (
            "\x00".join(f"{n}\x01{v}" for n, v in sorted(properties.items())).encode(
                "utf-8", "surrogatepass"
            )
            if properties
            else b""
        )
        whole = b"".join((_LENGTHS.pack(len(t), len(q), len(body), len(g), len(k), len(p)),
                          t, q, body, g, k, p))  # fmt: skip
        self.row_sum += int.from_bytes(
            hashlib.blake2b(whole, digest_size=_HASH_BYTES).digest(), "big"
        )
        crc = zlib.crc32
        sums = self.field_sums
        sums[0] += crc(t)
        sums[1] += crc(q, 1)
        sums[2] += crc(body, 2)
        sums[3] += crc(g, 3)
        sums[4] += crc(k, 4)
        sums[5] += crc(p, 5)
        self.rows += 1
        self.topics[topic] = self.topics.get(topic, 0) + 1

    def count(self, topic: str) -> None:
        """One row counted, not hashed (a write without a writeId: nothing to compare)."""
        self.rows += 1
        self.topics[topic] = self.topics.get(topic, 0) + 1

    @property
    def sums(self) -> dict[str, int]:
        """{"row": the rows' sum mod 2^128, field: its sum mod 2^32, ...}."""
        out = {"row": self.row_sum % _MODULUS}
        for name, value in zip(FIELDS, self.field_sums, strict=True):
            out[name] = value % _FIELD_MODULUS
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WriteDigest):
            return NotImplemented
        return (self.rows, self.topics, self.sums) == (other.rows, other.topics, other.sums)

    def __hash__(self) -> int:
        raise TypeError("a WriteDigest changes as rows are added: it is not hashable")

    def merge(self, other: WriteDigest) -> None:
        self.rows += other.rows
        for topic, n in other.topics.items():
            self.topics[topic] = self.topics.get(topic, 0) + n
        self.row_sum += other.row_sum
        for i, value in enumerate(other.field_sums):
            self.field_sums[i] += value

    def differences(self, earlier: WriteDigest) -> list[str]:
        """What differs from an earlier write's rows, in words (empty: the same rows)."""
        out = []
        if self.rows != earlier.rows:
            out.append(f"{earlier.rows} rows then, {self.rows} now")
        for topic in sorted(set(self.topics) | set(earlier.topics)):
            then, now = earlier.topics.get(topic, 0), self.topics.get(topic, 0)
            if then != now:
                out.append(f"topic {topic!r}: {then} rows then, {now} now")
        for name in FIELDS:
            if self.sums[name] != earlier.sums.get(name):
                out.append(f"the {_FIELD_NAMES[name]} differ")
        if not out and self.sums["row"] != earlier.sums.get("row"):
            out.append("the rows pair their fields differently")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "topics": dict(sorted(self.topics.items())),
            "digests": {name: f"{value:x}" for name, value in self.sums.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriteDigest:
        digests = {str(k): int(v, 16) for k, v in data["digests"].items()}
        return cls(
            rows=int(data["rows"]),
            topics={str(k): int(v) for k, v in data["topics"].items()},
            row_sum=digests["row"],
            field_sums=[digests[name] for name in FIELDS],
        )


@dataclass(frozen=True, slots=True)
class Manifest:
    """A completed write, as its ledger message says."""

    write_id: str
    digest: WriteDigest
    stored: int
    already_stored: int
    committed_at_ms: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": MANIFEST_VERSION,
                "write_id": self.write_id,
                **self.digest.to_json(),
                "stored": self.stored,
                "already_stored": self.already_stored,
                "committed_at_ms": self.committed_at_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, body: bytes) -> Manifest:
        data = json.loads(body)
        return cls(
            write_id=str(data["write_id"]),
            digest=WriteDigest.from_json(data),
            stored=int(data["stored"]),
            already_stored=int(data["already_stored"]),
            committed_at_ms=int(data["committed_at_ms"]),
        )


def ledger_queue(write_id: str) -> int:
    return abs(java_string_hash(write_id)) % LEDGER_QUEUES


@dataclass(frozen=True, slots=True)
class _LedgerMessage:
    """A manifest as an appendable message (producer.Appendable)."""

    topic: str
    queue_id: int
    body: bytes
    properties: bytes
    sys_flag: int = 0


def manifest_producer_id(write_id: str) -> str:
    return f"spark-ledger:{write_id}"


def wait_caught_up(admin: Admin, timeout_s: float = CATCH_UP_S) -> None:
    """Until every reachable consume-queue replica has applied what the commit log held when
    this was called: a manifest appended before then is in the consume queues after it."""
    target = admin.status().commitlog.confirm_offset
    deadline = time.monotonic() + timeout_s
    while True:
        replicas = [r for r in admin.status().cq if r.reachable]
        if replicas and all(r.applied_offset >= target for r in replicas):
            return
        if time.monotonic() >= deadline:
            raise Unavailable(
                f"the consume queues did not reach commit-log offset {target} within "
                f"{timeout_s} s: cannot tell whether this writeId was used before",
                method="ConsumeQueue/GetStatus",
            )
        time.sleep(_CATCH_UP_POLL_S)


def find(settings: ClientSettings, ledger_topic: str, write_id: str) -> Manifest | None:
    """The first manifest of `write_id` in the ledger, or None."""
    queue_id = ledger_queue(write_id)
    with Admin(settings) as admin:
        wait_caught_up(admin)
        if admin.queue(ledger_topic, queue_id).max_offset == 0:
            return None  # no write ever wrote a manifest to this queue
        with Consumer(
            admin.connection, ledger_topic, queues=[queue_id], start="earliest", long_poll_ms=0
        ) as consumer:
            for m in consumer.messages(follow=False):
                if m.properties.get(KEYS) == write_id and m.properties.get(TAGS) == MANIFEST_TAG:
                    return Manifest.decode(m.body)
    return None


def append_manifest(conn: Connection, ledger_topic: str, manifest: Manifest) -> Manifest:
    """Append `manifest`; the manifest the ledger holds for its write id afterwards: this one,
    or the one a run that finished first appended (answered as a duplicate)."""
    message = _LedgerMessage(
        ledger_topic,
        ledger_queue(manifest.write_id),
        manifest.encode(),
        encode_properties({KEYS: manifest.write_id, TAGS: MANIFEST_TAG}),
    )
    request, _ = append_request(manifest_producer_id(manifest.write_id), 0, [message])
    response = conn.call(conn.commitlog().Append, request, name="CommitLog/Append")
    if list(response.statuses) != [cl_pb.PUT_OK]:
        raise Unavailable(
            f"the ledger did not take the manifest of write {manifest.write_id!r}: "
            f"{[cl_pb.PutStatus.Name(s) for s in response.statuses]}",
            method="CommitLog/Append",
        )
    if not response.duplicate:
        return manifest
    read = conn.call(
        conn.commitlog().Read,
        cl_pb.ReadRequest(offsets=response.commit_log_offsets, sizes=response.sizes),
        name="CommitLog/Read",
    )
    record = read_record(read.records_blob, 0, read.record_sizes[0])
    if not isinstance(record, Record):
        raise Unavailable(
            f"the ledger's manifest of write {manifest.write_id!r} does not read back",
            method="CommitLog/Read",
        )
    return Manifest.decode(record.body)


def merged(digests: Iterable[WriteDigest]) -> WriteDigest:
    out = WriteDigest()
    for d in digests:
        out.merge(d)
    return out


@dataclass(frozen=True, slots=True)
class WriteReport:
    """What one run of a batch write did: `rows` in the DataFrame, `stored` now, and
    `already_stored` (a rerun of a completed write, or retried requests the store had)."""

    write_id: str
    rows: int
    stored: int
    already_stored: int
    topics: dict[str, int]
    rerun: bool  # a completed write with the same rows was found: nothing was sent

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriteReport:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
