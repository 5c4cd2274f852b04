"""The three services in this process, wired as in production, for the API harnesses.

commitlog_svc (CommitLogService), cq_svc (CqService) and index_svc (IndexService) on loopback
port 0, each behind its real ServiceHost (interceptors, size limits), the two followers
subscribed to the commit log. `Stack.seed` appends a few known messages and waits until both
followers have applied them, so that fuzzed pulls and key queries find real records.

The harnesses call through real gRPC channels: a status is what a client would see, after the
error interceptor's mapping, and the request was (de)serialized for real.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import grpc

from commitlog_svc.main import CommitLogService
from commitlog_svc.settings import CommitLogSettings
from cq_svc.main import CqService
from cq_svc.settings import CqSettings
from index_svc.main import IndexService
from index_svc.settings import IndexSettings
from mqstore.formats.properties import encode_properties
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq_pb
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as cq_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as ix_pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc as ix_grpc

EPHEMERAL = {"port": 0, "health_port": 0, "metrics_port": 0}
# Room for a record with a 4 MiB body (the body limit) in one segment.
FILE_BYTES = 8 << 20
# Past the 4 MiB body limit, so that the body limit is what refuses a big body; small enough
# that a test can send a message over it cheaply.
MAX_MESSAGE_BYTES = 6 << 20
# Answers of a key query: small, so that a test can ask for more than the cap cheaply.
INDEX_MAX_RESULTS = 16
INDEX_DEFAULT_RESULTS = 8
# Pull caps small enough that a test can go past them with a few dozen messages (the rule is
# the same at the defaults, 1,024 messages and 32 MiB).
PULL_MESSAGES_MAX = 64
PULL_BYTES_MAX = 64 << 10
# Bounds a wait for the followers; never times a result.
CATCH_UP_S = 30.0
RPC_TIMEOUT_S = 10.0

TOPIC = "T"
RETRY_TOPIC = "%RETRY%g"
QUEUES = 4
SEED_MESSAGES = 24  # KEYS "k<i> dup": "dup" has more matches than INDEX_MAX_RESULTS
TAGS = ("a", "b", "c")


@dataclass(frozen=True)
class Stored:
    """One seeded message: where it went."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    size: int
    keys: str
    uniq_key: str
    tags: str


class Stack:
    def __init__(
        self,
        root: str | None = None,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        long_poll_max_ms: int = 0,
    ) -> None:
        self._own_root = root is None
        self.root = root if root is not None else tempfile.mkdtemp(prefix="mqstore-fuzz-")
        self.commitlog = CommitLogService(
            CommitLogSettings.load(
                [],
                **EPHEMERAL,
                data_dir=os.path.join(self.root, "commitlog"),
                file_bytes=FILE_BYTES,
                warm_ahead_bytes=0,
                flush_interval_ms=20,
                checkpoint_interval_ms=200,
                retention=False,
                grace_period_s=1.0,
                log_format="console",
                max_message_bytes=max_message_bytes,
            )
        )
        self.cq: CqService | None = None
        self.index: IndexService | None = None
        self._channels: list[grpc.Channel] = []
        self.stored: list[Stored] = []
        self.commitlog.start()
        try:
            self.cq = CqService(
                CqSettings.load(
                    [],
                    **EPHEMERAL,
                    data_dir=os.path.join(self.root, "cq"),
                    commitlog_target=self.commitlog_target,
                    subscriber_id="cq-fuzz",
                    units_per_file=1_000,
                    flush_interval_ms=20,
                    long_poll_max_ms=long_poll_max_ms,
                    pull_messages_max=PULL_MESSAGES_MAX,
                    pull_bytes_default=PULL_BYTES_MAX // 4,
                    pull_bytes_max=PULL_BYTES_MAX,
                    grace_period_s=1.0,
                    log_format="console",
                )
            )
            self.cq.start()
            self.index = IndexService(
                IndexSettings.load(
                    [],
                    **EPHEMERAL,
                    data_dir=os.path.join(self.root, "index"),
                    commitlog_target=self.commitlog_target,
                    subscriber_id="index-fuzz",
                    slot_num=64,
                    entry_num=1_024,
                    flush_interval_ms=50,
                    max_results=INDEX_MAX_RESULTS,
                    default_results=INDEX_DEFAULT_RESULTS,
                    grace_period_s=1.0,
                    log_format="console",
                )
            )
            self.index.start()
        except BaseException:
            self.stop()
            raise
        self.log = cl_grpc.CommitLogStub(self._channel(self.commitlog.host.port))
        self.queues = cq_grpc.ConsumeQueueStub(self._channel(self.cq.host.port))
        self.keys = ix_grpc.IndexStub(self._channel(self.index.host.port))

    @property
    def commitlog_target(self) -> str:
        return f"127.0.0.1:{self.commitlog.host.port}"

    def _channel(self, port: int) -> grpc.Channel:
        # Limits far past the servers': what refuses a big message must be the server.
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[
                ("grpc.max_send_message_length", -1),
                ("grpc.max_receive_message_length", -1),
            ],
        )
        self._channels.append(channel)
        return channel

    def raw_channel(self, service: str) -> grpc.Channel:
        """A channel to one service's API port ("commitlog", "cq", "index")."""
        host = {"commitlog": self.commitlog.host, "cq": self._cq.host, "index": self._index.host}
        return self._channel(host[service].port)

    @property
    def _cq(self) -> CqService:
        assert self.cq is not None
        return self.cq

    @property
    def _index(self) -> IndexService:
        assert self.index is not None
        return self.index

    @property
    def engine(self) -> Any:
        """The commit log's engine (max_offset, read_record) for checks beside the API."""
        assert self.commitlog.engine is not None
        return self.commitlog.engine

    # -- data -----------------------------------------------------------------------------------

    def seed(self) -> None:
        """The known messages, applied by both followers before this returns."""
        n = SEED_MESSAGES
        props = [
            encode_properties(
                {"KEYS": f"k{i} dup", "TAGS": TAGS[i % len(TAGS)], "UNIQ_KEY": f"U{i:08X}"}
            )
            for i in range(n)
        ]
        batches = [
            cl_pb.MessageBatch(
                topic=TOPIC,
                queue_ids=[i % QUEUES for i in range(n)],
                bodies=[b"seed-%d" % i for i in range(n)],
                properties=props,
            ),
            cl_pb.MessageBatch(topic=RETRY_TOPIC, queue_ids=[0, 0], bodies=[b"r0", b"r1"]),
        ]
        response = self.log.Append(cl_pb.AppendRequest(batches=batches), timeout=RPC_TIMEOUT_S)
        if set(response.statuses) != {cl_pb.PUT_OK}:
            raise RuntimeError(f"seeding failed: {response}")
        for i in range(n + 2):
            seeded = i < n
            self.stored.append(
                Stored(
                    topic=TOPIC if seeded else RETRY_TOPIC,
                    queue_id=i % QUEUES if seeded else 0,
                    queue_offset=response.queue_offsets[i],
                    commit_log_offset=response.commit_log_offsets[i],
                    size=response.sizes[i],
                    keys=f"k{i} dup" if seeded else "",
                    uniq_key=f"U{i:08X}" if seeded else "",
                    tags=TAGS[i % len(TAGS)] if seeded else "",
                )
            )
        self.wait_followers()

    def wait_followers(self) -> None:
        """Until both followers have applied everything the log holds now."""
        end = self.engine.max_offset
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline:
            cq = self.queues.GetStatus(cq_pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S)
            ix = self.keys.GetStatus(ix_pb.GetStatusRequest(), timeout=RPC_TIMEOUT_S)
            if cq.caught_up and ix.caught_up and min(cq.applied_offset, ix.applied_offset) >= end:
                return
            time.sleep(0.02)
        raise RuntimeError(f"the followers did not reach offset {end} in {CATCH_UP_S} s")

    # -- stop -----------------------------------------------------------------------------------

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()
        if self.index is not None:
            self.index.host.shutdown()
            self.index = None
        if self.cq is not None:
            self.cq.stop()
            self.cq = None
        self.commitlog.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
