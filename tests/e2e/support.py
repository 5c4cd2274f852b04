"""Helpers for the end-to-end tests: appending through the commit log, reading everything back
from a consume-queue replica and an index replica in comparable form."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from tests.answers import records_of

CALL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sent:
    topic: str
    queue_id: int
    body: bytes
    key: str
    uniq_key: str
    commit_log_offset: int
    queue_offset: int


def append(
    stub: commitlog_pb2_grpc.CommitLogStub,
    topic: str,
    queue_ids: list[int],
    bodies: list[bytes],
    *,
    keys: list[str] | None = None,
    uniq_keys: list[str] | None = None,
    tags: str = "",
    producer: tuple[str, int] | None = None,
) -> list[Sent]:
    keys = keys or [""] * len(bodies)
    uniq_keys = uniq_keys or [""] * len(bodies)
    props = [
        encode_properties({"KEYS": k, "UNIQ_KEY": u, "TAGS": tags})
        for k, u in zip(keys, uniq_keys, strict=True)
    ]
    request = cl.AppendRequest(
        batches=[cl.MessageBatch(topic=topic, queue_ids=queue_ids, bodies=bodies, properties=props)]
    )
    if producer is not None:
        request.producer_id, request.sequence = producer
    response = stub.Append(request, timeout=CALL_TIMEOUT_S)
    assert list(response.statuses) == [cl.PUT_OK] * len(bodies), response
    return [
        Sent(topic, q, b, k, u, o, qo)
        for q, b, k, u, o, qo in zip(
            queue_ids,
            bodies,
            keys,
            uniq_keys,
            response.commit_log_offsets,
            response.queue_offsets,
            strict=True,
        )
    ]


def decode(raw: bytes) -> Record:
    found = read_record(raw, 0, len(raw))
    assert isinstance(found, Record), found
    return found


def pull_all(
    stub: consumequeue_pb2_grpc.ConsumeQueueStub, topic: str, queue_id: int
) -> list[tuple[int, int, bytes]]:
    """(queue offset, commit-log offset, body) of every message of a queue, in order."""
    out: list[tuple[int, int, bytes]] = []
    offset = 0
    while True:
        response = stub.Pull(
            cq.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=256),
            timeout=CALL_TIMEOUT_S,
        )
        if response.status == cq.OFFSET_TOO_SMALL:
            offset = response.next_begin_offset
            continue
        if response.status != cq.FOUND:
            return out
        for queue_offset, raw in zip(response.queue_offsets, records_of(response), strict=True):
            record = decode(raw)
            out.append((queue_offset, record.physical_offset, record.body))
        offset = response.next_begin_offset


def queue_snapshot(
    stub: consumequeue_pb2_grpc.ConsumeQueueStub, topics: list[str]
) -> dict[tuple[str, int], list[tuple[int, int, bytes]]]:
    snapshot = {}
    for topic in topics:
        listed = stub.ListQueues(cq.ListQueuesRequest(topic=topic), timeout=CALL_TIMEOUT_S)
        for info in listed.queues:
            snapshot[(topic, info.queue_id)] = pull_all(stub, topic, info.queue_id)
    return snapshot


def key_snapshot(
    stub: index_pb2_grpc.IndexStub, topic: str, keys: list[str]
) -> dict[str, list[int]]:
    """Commit-log offsets each key finds, newest first."""
    out = {}
    for key in keys:
        response = stub.QueryByKey(
            ix.QueryByKeyRequest(topic=topic, key=key, max_messages=1000), timeout=CALL_TIMEOUT_S
        )
        out[key] = [m.commit_log_offset for m in response.messages]
    return out


def eventually(check: Callable[[], bool], timeout_s: float = 30.0, step_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(step_s)
    raise AssertionError(f"not true within {timeout_s} s: {check}")


def start_up(
    data: Path,
    *flags: str,
    umask: int | None = None,
    timeout_s: float = 90.0,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """`mqstore up --data-dir DATA --base-port -1 FLAGS` as a user runs it (in `env`, when
    given), and what it printed up to "Ctrl-C stops" (everything is up then)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqstore.cli", "up", "--data-dir", str(data), "--base-port", "-1",
         *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        umask=-1 if umask is None else umask,
        env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            break
    return proc, "".join(lines)


def data_files(directory: str) -> dict[str, bytes]:
    """Every file under `directory`, by relative path: its bytes."""
    out = {}
    for base, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out
