"""A real commitlog_svc for the cq_svc tests: start it, append to it, find records in it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqstore.dispatch import DispatchEntry
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import TAGS, encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from tests.answers import records_of

EPHEMERAL_ARGS = ["--port", "0", "--health-port", "0", "--metrics-port", "0"]


# Retention every 100 ms, of every segment but the last (no subscriber pins any): 4 KiB
# segments hold a few dozen small records, so a test expires some within a second.
EXPIRING_LOG_BYTES = 4096
EXPIRING_LOG_ARGS = [
    "--file-reserved-hours",
    "0",
    "--clean-interval-ms",
    "100",
]
EXPIRING_LOG_ENV = {"MQSTORE_COMMITLOG_DELETE_WHEN_HOURS": json.dumps(list(range(24)))}


def start_commitlog(
    root: Path, *args: str, env: dict[str, str] | None = None, file_bytes: int = 1 << 20
) -> ServiceProcess:
    """A commitlog_svc process with its data in root/commitlog; 1 MiB segments by default (a
    segment is preallocated whole, and a test log stays small)."""
    (root / "logs").mkdir(parents=True, exist_ok=True)
    process = ServiceProcess(
        "commitlog_svc",
        str(root / "commitlog"),
        args=[*EPHEMERAL_ARGS, "--file-bytes", str(file_bytes), *args],
        env=env or {},
        log_path=str(root / "logs" / "commitlog.log"),
    )
    process.start()
    process.wait_listening()
    return process


@dataclass(frozen=True)
class Stored:
    """One appended message as the log stored it."""

    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    body: bytes
    tags: str
    store_timestamp_ms: int

    @property
    def end_offset(self) -> int:
        return self.commit_log_offset + self.size

    def entry(self, topic: str, **changes: int) -> DispatchEntry:
        """The dispatch entry the log sends for this message, with `changes` (a test feeding
        a consume queue directly, to make it point somewhere else)."""
        values = {
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "commit_log_offset": self.commit_log_offset,
            "size": self.size,
        }
        values.update(changes)
        return DispatchEntry(
            topic=topic,
            tags_code=tags_code(self.tags),
            store_timestamp_ms=self.store_timestamp_ms,
            **values,
        )


def append(
    stub: cl_grpc.CommitLogStub,
    topic: str,
    bodies: Sequence[bytes],
    *,
    queue_ids: Sequence[int] | None = None,
    tags: Sequence[str] | None = None,
) -> list[Stored]:
    """Append one batch to `topic`; returns what was stored, message by message."""
    qids = list(queue_ids) if queue_ids is not None else [0] * len(bodies)
    tag_list = list(tags) if tags is not None else [""] * len(bodies)
    batch = cl_pb.MessageBatch(
        topic=topic,
        queue_ids=qids,
        bodies=list(bodies),
        properties=[encode_properties({TAGS: t} if t else {}) for t in tag_list],
    )
    response = stub.Append(cl_pb.AppendRequest(batches=[batch]), timeout=30)
    assert list(response.statuses) == [cl_pb.PUT_OK] * len(bodies), response
    return [
        Stored(q, qo, o, sz, b, t, response.store_timestamp_ms)
        for q, qo, o, sz, b, t in zip(
            qids,
            response.queue_offsets,
            response.commit_log_offsets,
            response.sizes,
            bodies,
            tag_list,
            strict=True,
        )
    ]


def decode(raw: bytes) -> Record:
    record = read_record(raw, 0, len(raw))
    assert isinstance(record, Record), record
    return record


def segment_path(log: ServiceProcess, offset: int, file_bytes: int = 1 << 20) -> Path:
    """The segment file holding commit-log `offset` (files are named by their start)."""
    start = offset - offset % file_bytes
    return Path(log.data_dir) / "commitlog" / f"{start:020d}"


def applied(cqs: Sequence[Any], *appended: Sequence[Stored]) -> None:
    """Wait until each cq (a tests/cq_svc/support.WholeCq) applied everything appended."""
    end = max(s.end_offset for batch in appended for s in batch)
    for cq in cqs:
        cq.wait_applied(end)


def wire(responses: Sequence[Any]) -> list[bytes]:
    return [r.SerializeToString() for r in responses]


def log_read(stub: cl_grpc.CommitLogStub, stored: Sequence[Stored]) -> list[bytes]:
    """The records as the log's Read serves them (each must be READ_OK)."""
    response = stub.Read(
        cl_pb.ReadRequest(
            offsets=[s.commit_log_offset for s in stored], sizes=[s.size for s in stored]
        ),
        timeout=30,
    )
    assert list(response.statuses) == [cl_pb.READ_OK] * len(stored)
    return records_of(response)


def append_topics(
    stub: cl_grpc.CommitLogStub, topics: Sequence[str], per_topic: int, queues: int
) -> dict[str, list[Stored]]:
    """One Append of a batch per topic, message i of each in queue i % queues (so the log
    interleaves the queues and the topics); returns what was stored, by topic."""
    batches = [
        cl_pb.MessageBatch(
            topic=t,
            queue_ids=[i % queues for i in range(per_topic)],
            bodies=[f"{t}-{i}".encode() * (1 + i % 5) for i in range(per_topic)],
            properties=[encode_properties({TAGS: f"tag{i % 2}"}) for i in range(per_topic)],
        )
        for t in topics
    ]
    response = stub.Append(cl_pb.AppendRequest(batches=batches), timeout=30)
    assert list(response.statuses) == [cl_pb.PUT_OK] * (per_topic * len(topics))
    out: dict[str, list[Stored]] = {}
    for k, t in enumerate(topics):
        rows = range(k * per_topic, (k + 1) * per_topic)
        out[t] = [
            Stored(
                i % queues,
                response.queue_offsets[r],
                response.commit_log_offsets[r],
                response.sizes[r],
                batches[k].bodies[i],
                f"tag{i % 2}",
                response.store_timestamp_ms,
            )
            for i, r in enumerate(rows)
        ]
    return out
