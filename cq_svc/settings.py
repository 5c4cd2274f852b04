"""cq_svc's settings: ServiceSettings (ports, data dir, logs, shutdown) plus the subscription,
the engine knobs that matter in production, and the API's limits.

Sources, lowest first: defaults < the [cq] table of the TOML file < MQSTORE_CQ_* variables <
flags (`--commitlog-target host:port --subscriber-id cq-1 --cq-store rocksdb`).

API limits: a request's 0 means the default; a negative value is INVALID_ARGUMENT; a value
above the maximum is capped (counts and bytes) or refused (an invisibility beyond its maximum,
which RocketMQ refuses too).
"""

from __future__ import annotations

import os
import resource
from typing import ClassVar, Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from cq_svc.config import AckFlush, CqConfig, StoreKind
from cq_svc.tail_records import TAIL_RECORDS_MIB_DEFAULT
from mqstore.ports import DEFAULT_PORTS
from mqstore.rpc.settings import FollowerSettings, check_worker_budget
from mqstore.rpc.streams import StreamCap

# Unset, open_maps_max is a quarter of the process's open-files limit (each map holds a file
# descriptor; main raises the soft limit to the hard one first), at most OPEN_MAPS_AUTO_MAX:
# each map is also one of the kernel's vm.max_map_count areas (65,530 by default). A file
# store whose queues' files do not all fit reopens them frame after frame (2,000 queues: 4.3 k
# units/s applied with 1,024 maps, 22.7 k with 8,192; docs/cq.md).
OPEN_MAPS_AUTO_MAX = 16_384
OPEN_MAPS_AUTO_MIN = 64


def open_maps_for_fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return OPEN_MAPS_AUTO_MAX
    return max(OPEN_MAPS_AUTO_MIN, min(OPEN_MAPS_AUTO_MAX, soft // 4))


def raise_open_files_limit() -> tuple[int, int]:
    """The soft open-files limit raised to the hard one, as a server that keeps many files
    mapped asks (RocketMQ's start script asks for 655,350); (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # a hard limit of "unlimited" past the kernel's nr_open
        return soft, soft
    return soft, hard


_API, _HEALTH, _METRICS = DEFAULT_PORTS["cq_svc"]
_COMMITLOG_PORT = DEFAULT_PORTS["commitlog_svc"][0]
_API_METHOD = "/mqstore.consumequeue.v1.ConsumeQueue/"


def _default_subscriber_id() -> str:
    # In Kubernetes the pod name is stable across restarts of a StatefulSet member.
    return os.environ.get("POD_NAME") or "cq-0"


class CqSettings(FollowerSettings):
    model_config = SettingsConfigDict(
        env_prefix="MQSTORE_CQ_", extra="forbid", validate_default=True
    )
    section: ClassVar[str] = "cq"

    port: int = Field(_API, ge=0, le=65535, description="main gRPC port (API and reflection)")
    health_port: int = Field(_HEALTH, ge=0, le=65535, description="plaintext grpc.health.v1")
    metrics_port: int = Field(_METRICS, ge=0, le=65535, description="Prometheus port")

    # -- the subscription --------------------------------------------------------------------------
    commitlog_target: str = Field(
        f"127.0.0.1:{_COMMITLOG_PORT}", min_length=1, description="commitlog_svc's host:port"
    )
    subscriber_id: str = Field(
        default_factory=_default_subscriber_id,
        min_length=1,
        max_length=255,
        description="this replica's stable name at the commit log (POD_NAME, else cq-0)",
    )

    # -- the engine (CqConfig; defaults are RocketMQ's unless said) --------------------------------
    cq_store: StoreKind = StoreKind.FILE
    flush_interval_ms: int = Field(1_000, ge=1)
    flush_least_pages: int = Field(2, ge=0)
    # RocketMQ checkpoints every 60 s. A checkpoint bounds both the replay after a crash and how
    # far the commit log's retention floor lags (it moves with our confirmed offset), so 10 s:
    # an msync of the dirty queues every 10 s is cheap next to a minute of replay.
    flush_thorough_interval_ms: int = Field(10_000, ge=1)
    ack_flush: AckFlush = AckFlush.SYNC
    units_per_file: int = Field(300_000, ge=1)
    open_maps_max: int | None = Field(None, ge=2)  # None: open_maps_for_fd_limit()
    ack_idle_ms: int = Field(10_000, ge=1)
    ack_window_max: int = Field(65_536, ge=1)

    # -- Pull --------------------------------------------------------------------------------------
    # RocketMQ's client pulls 32 by default (pullBatchSize).
    pull_messages_default: int = Field(32, ge=1)
    # 1,024 messages: a pull is answered in one Read and one response, and a thousand records is
    # already past the point where a bigger batch buys anything over the call cost.
    pull_messages_max: int = Field(1_024, ge=1)
    # A response of 4 MiB (one maximal body) by default; 32 MiB at most, half the 64 MiB message
    # limit of the channels, so the Read answer and the response both fit with room to spare.
    pull_bytes_default: int = Field(4 << 20, ge=1)
    pull_bytes_max: int = Field(32 << 20, ge=1)
    # Tag strings per request: a subscription names a handful; 256 bounds the set we hash.
    tags_max: int = Field(256, ge=1)

    # -- long polling and streams ----------------------------------------------------------------
    # RocketMQ's broker holds a pull up to the client's 15 s suspend time; 30 s at most here.
    long_poll_max_ms: int = Field(30_000, ge=0)
    # Each waiting call holds a server thread: past this many at once, RESOURCE_EXHAUSTED.
    # Long polls and streams together leave UNARY_WORKERS_MIN threads to other calls: 24 + 16
    # + 16 + 8 = 64. A caught-up SDK consumer follows (below); unary long polls are Receive's
    # and those of consumers of more than 1,024 queues.
    long_polls_max: int = Field(24, ge=1)
    # A pull stream holds a server thread while its caller reads: at most this many at once,
    # each at most this many answers long (then the caller opens the next one).
    pull_streams_max: int = Field(16, ge=1)
    pull_stream_batches_max: int = Field(64, ge=1)
    # A Follow stream (one long poll over several queues) holds a server thread for as long as
    # it is open, reading or waiting: at most this many at once (a caught-up consumer refused
    # one pulls instead). It answers at most this many batches, then the caller opens the
    # next; it names at most this many queues.
    follow_streams_max: int = Field(16, ge=1)
    follow_batches_max: int = Field(4_096, ge=1)
    follow_queues_max: int = Field(1_024, ge=1)
    # A streamed answer (a PullStream batch, a Follow round over its queues) carries at most
    # this many bytes of records, and at least one record. A stream holds its one answer until
    # its reader takes it, so this bounds what a slow reader costs (times the stream caps):
    # 1 MiB is 1,024 records of 1 KiB, past where a bigger answer buys anything.
    stream_answer_bytes_max: int = Field(1 << 20, ge=1)
    # The newest records, brought by the dispatch frames, held to answer tail pulls without a
    # commit-log Read (tail_records.py); 0 turns it off.
    tail_records_mib: int = Field(TAIL_RECORDS_MIB_DEFAULT, ge=0, le=4_096)
    # ... brought while consumers read at the tail: one waits there, or one waited or was
    # served from it within this long (nobody there: the frames carry none).
    tail_wanted_ms: int = Field(10_000, ge=1)

    # -- Receive -----------------------------------------------------------------------------------
    receive_messages_default: int = Field(32, ge=1)
    receive_messages_max: int = Field(1_024, ge=1)
    # RocketMQ 5's simple consumer: invisibility of 30 s by default, at most 12 h.
    invisible_default_ms: int = Field(30_000, ge=1)
    invisible_max_ms: int = Field(12 * 3_600_000, ge=1)

    # -- the commit log's Read ---------------------------------------------------------------------
    # commitlog_svc's data dir, where this process can see it (same host, or a volume of the
    # same pod): pulls read the segment files instead of a Read (local_reads.py). Empty: off.
    commitlog_dir: str = Field("", description="commitlog_svc's data dir, to read its segments")
    # Bounds a Read when the caller gave no deadline (the caller's deadline wins when shorter).
    read_timeout_ms: int = Field(10_000, ge=1)
    # The log's bounds are asked every 5 s between handshakes: its end feeds the lag gauge (a
    # scrape comes every 15 s or more), its minimum the expiry of consume-queue files (segments
    # expire hours apart).
    log_probe_interval_ms: int = Field(5_000, ge=1)

    @model_validator(mode="after")
    def _check_relations(self) -> Self:
        check_worker_budget(
            self.max_workers,
            {
                "long_polls_max": self.long_polls_max,
                "pull_streams_max": self.pull_streams_max,
                "follow_streams_max": self.follow_streams_max,
            },
        )
        if self.pull_bytes_max > self.max_message_bytes // 2:
            raise ValueError("pull_bytes_max must be at most half of max_message_bytes")
        for default, top in (
            ("pull_messages_default", "pull_messages_max"),
            ("pull_bytes_default", "pull_bytes_max"),
            ("receive_messages_default", "receive_messages_max"),
            ("invisible_default_ms", "invisible_max_ms"),
        ):
            if getattr(self, default) > getattr(self, top):
                raise ValueError(f"{default} must not exceed {top}")
        return self

    def stream_caps(self) -> dict[str, StreamCap]:
        """The API's server streams and their caps (mqstore/rpc/streams.py)."""
        return {
            _API_METHOD + "PullStream": StreamCap(
                self.pull_streams_max, "pull streams", "pull_streams_max", "pull one at a time"
            ),
            _API_METHOD + "Follow": StreamCap(
                self.follow_streams_max, "follow streams", "follow_streams_max", "pull instead"
            ),
        }

    def engine_config(self) -> CqConfig:
        return CqConfig(
            data_dir=self.data_dir,
            cq_store=self.cq_store,
            units_per_file=self.units_per_file,
            open_maps_max=self.open_maps_max or open_maps_for_fd_limit(),
            flush_interval_ms=self.flush_interval_ms,
            flush_least_pages=self.flush_least_pages,
            flush_thorough_interval_ms=self.flush_thorough_interval_ms,
            pull_bytes_cap=self.pull_bytes_max,
            ack_flush=self.ack_flush,
            ack_idle_ms=self.ack_idle_ms,
            ack_window_max=self.ack_window_max,
        )
