"""commitlog_svc's settings: defaults < TOML file ([commitlog] table) < MQSTORE_COMMITLOG_* <
flags.

    python -m commitlog_svc --data-dir ./data/commitlog --flush sync --file-bytes 134217728

Engine knobs default to RocketMQ's (CommitLogConfig). The store host written into records (and
so into offset msg ids) defaults to the service's own address: `host`, or POD_IP / 127.0.0.1
when it binds every interface, and the API port it really listens on (with port 0, the one the
kernel picked).

A broker group's replica reaches the other replicas as a follower of the commit log does
(FollowerSettings: `--commitlog-tls-ca-file`, `--commitlog-token-file` with the `replicate`
scope, a client certificate for mutual TLS).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import ClassVar, Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from commitlog_svc.config import CommitLogConfig, FlushMode
from mqstore.ports import DEFAULT_PORTS
from mqstore.rpc.settings import FollowerSettings, check_worker_budget
from mqstore.rpc.streams import StreamCap

_API_PORT, _HEALTH_PORT, _METRICS_PORT = DEFAULT_PORTS["commitlog_svc"]
_ENGINE = CommitLogConfig(data_dir=".")
POD_IP_ENV = "POD_IP"
_API_METHOD = "/mqstore.commitlog.v1.CommitLog/"


class CommitLogSettings(FollowerSettings):
    model_config = SettingsConfigDict(
        env_prefix="MQSTORE_COMMITLOG_", extra="forbid", validate_default=True
    )
    section: ClassVar[str] = "commitlog"

    port: int = Field(_API_PORT, ge=0, le=65535, description="main gRPC port (API, reflection)")
    health_port: int = Field(_HEALTH_PORT, ge=0, le=65535, description="grpc.health.v1 port")
    metrics_port: int = Field(_METRICS_PORT, ge=0, le=65535, description="Prometheus port")

    flush: Literal["sync", "async"] = Field(
        "async",
        description="sync: acknowledge once durable (group commit); async: once written, "
        "flushed every flush_interval_ms (RocketMQ's default)",
    )
    file_bytes: int = Field(_ENGINE.file_bytes, ge=4096, description="segment size")
    flush_interval_ms: int = Field(_ENGINE.flush_interval_ms, gt=0)
    sync_flush_timeout_ms: int = Field(_ENGINE.sync_flush_timeout_ms, gt=0)
    checkpoint_interval_ms: int = Field(_ENGINE.checkpoint_interval_ms, gt=0)
    warm_ahead_bytes: int = Field(_ENGINE.warm_ahead_bytes, ge=0)

    retention: bool = Field(True, description="delete expired segments in the background")
    file_reserved_hours: float = Field(_ENGINE.file_reserved_hours, ge=0)
    delete_when_hours: list[int] = Field(
        default_factory=lambda: list(_ENGINE.delete_when_hours),
        description="local hours at which expired segments are deleted (RocketMQ's deleteWhen)",
    )
    clean_interval_ms: int = Field(_ENGINE.clean_interval_ms, gt=0)
    disk_max_used_ratio: float = Field(_ENGINE.disk_max_used_ratio, gt=0, le=1)
    disk_warning_ratio: float = Field(_ENGINE.disk_warning_ratio, gt=0, le=1)

    store_ip: str = Field("", description="IP written into records and msg ids ('': host)")
    store_port: int = Field(0, ge=0, le=65535, description="port for msg ids (0: the API port)")

    record_crc: bool = Field(
        _ENGINE.record_crc,
        description="end every record with RocketMQ's whole-record CRC (__CRC32#); off: the "
        "body CRC alone, as RocketMQ writes by default",
    )

    producers_max: int = Field(_ENGINE.producers_max, ge=1)
    producer_requests_max: int = Field(_ENGINE.producer_requests_max, ge=1)

    # One dispatch frame: the server's default when a subscriber asks for 0, and the cap.
    dispatch_batch_entries: int = Field(1_024, ge=1, le=65_536)
    dispatch_batch_bytes: int = Field(4 << 20, ge=4096)
    # Frames kept for subscribers in step (frame_cache.py); 0: every subscriber scans alone.
    dispatch_share_bytes: int = Field(32 << 20, ge=0)
    # Dispatch columns of the newest appends (append_frames.py); 0: every frame is scanned.
    dispatch_append_bytes: int = Field(_ENGINE.append_frames_bytes, ge=0)
    # ... and their records, sent to subscribers that ask (cq_svc's tail); 0: frames carry none.
    dispatch_records_bytes: int = Field(_ENGINE.append_records_bytes, ge=0)
    # AppendStream: requests written but not yet answered, per stream (the pipelining window).
    # The answers wait to be sent one at a time (a slow reader holds one), and a full window
    # stops the stream's reading (HTTP/2 flow control then holds the producer back).
    append_stream_window: int = Field(16, ge=1, le=1_024)
    # AppendStream calls at once: each holds a server thread, and a reader thread of its own,
    # for as long as it is open; past this, RESOURCE_EXHAUSTED (the SDK's producer retries with
    # backoff). 0: a quarter of max_workers (16 of 64), at least 1.
    append_streams_max: int = Field(0, ge=0)
    # Subscribe calls at once (cq_svc and index_svc replicas, one stream each): each holds a
    # server thread for as long as it is open, and one frame while its reader is slow; past
    # this, RESOURCE_EXHAUSTED (the subscriber reconnects with backoff). 0: a quarter of
    # max_workers (16 of 64), at least 1.
    subscribe_streams_max: int = Field(0, ge=0)

    # Broker groups (docs/replication.md). An empty group: a single replica, no coordinator.
    group: str = Field(
        "",
        pattern=r"^[A-Za-z0-9._-]{0,64}$",
        description="broker group name; empty: a single replica without etcd",
    )
    replica_name: str = Field(
        "",
        pattern=r"^[A-Za-z0-9._-]{0,64}$",
        description="this replica's name in its group (default: the host name)",
    )
    etcd: str = Field("", description="etcd endpoint of the group's coordinator (http://h:p)")
    advertise: str = Field(
        "", description="host:port the other replicas and clients reach (default: store host)"
    )
    replication: Literal["sync", "async"] = Field(
        "sync",
        description="sync: acknowledge once every in-sync replica holds an append durably; "
        "async: the leader alone (a failover may lose its newest appends)",
    )
    min_insync: int = Field(
        2, ge=1, le=5, description="in-sync replicas (the leader included) to take appends"
    )
    replica_lag_max_ms: int = Field(
        3_000, gt=0, description="a follower behind this long leaves the in-sync set"
    )
    lease_ttl_s: int = Field(2, ge=2, le=60, description="leadership lease in etcd")
    allow_unclean_election: bool = Field(
        False, description="let a replica outside the in-sync set lead (may lose acknowledged)"
    )
    replication_ack_timeout_ms: int = Field(
        5_000, gt=0, description="how long an append waits for the in-sync set"
    )

    @model_validator(mode="after")
    def _check_group(self) -> Self:
        if self.group and not self.etcd:
            raise ValueError("a broker group (--group) needs its coordinator (--etcd URL)")
        return self

    @property
    def append_streams_cap(self) -> int:
        return self.append_streams_max or max(1, self.max_workers // 4)

    @property
    def subscribe_streams_cap(self) -> int:
        return self.subscribe_streams_max or max(1, self.max_workers // 4)

    @model_validator(mode="after")
    def _check_streams(self) -> Self:
        check_worker_budget(
            self.max_workers,
            {
                "append_streams_max": self.append_streams_cap,
                "subscribe_streams_max": self.subscribe_streams_cap,
            },
        )
        return self

    def stream_caps(self) -> dict[str, StreamCap]:
        """The API's streams and their caps (mqstore/rpc/streams.py)."""
        return {
            _API_METHOD + "AppendStream": StreamCap(
                self.append_streams_cap, "append streams", "append_streams_max", "retry later"
            ),
            _API_METHOD + "Subscribe": StreamCap(
                self.subscribe_streams_cap,
                "subscriptions",
                "subscribe_streams_max",
                "forget subscribers that are gone, or raise the bound",
            ),
        }

    def store_address(self, bound_port: int) -> tuple[str, int]:
        """(ip, port) that records and msg ids name as the store host."""
        ip = self.store_ip or self.host
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            ip = socket.gethostbyname(ip)  # a host name: the address it resolves to
            addr = ipaddress.ip_address(ip)
        if addr.is_unspecified:
            ip = os.environ.get(POD_IP_ENV) or "127.0.0.1"
        return ip, self.store_port or bound_port

    def engine_config(self, *, store_ip: str = "127.0.0.1", store_port: int = 0) -> CommitLogConfig:
        return CommitLogConfig(
            data_dir=self.data_dir,
            flush=FlushMode(self.flush),
            file_bytes=self.file_bytes,
            flush_interval_ms=self.flush_interval_ms,
            sync_flush_timeout_ms=self.sync_flush_timeout_ms,
            checkpoint_interval_ms=self.checkpoint_interval_ms,
            warm_ahead_bytes=self.warm_ahead_bytes,
            file_reserved_hours=self.file_reserved_hours,
            delete_when_hours=tuple(self.delete_when_hours),
            clean_interval_ms=self.clean_interval_ms,
            disk_max_used_ratio=self.disk_max_used_ratio,
            disk_clean_forcibly_ratio=max(
                _ENGINE.disk_clean_forcibly_ratio, self.disk_max_used_ratio
            ),
            disk_warning_ratio=self.disk_warning_ratio,
            store_ip=store_ip,
            store_port=store_port,
            record_crc=self.record_crc,
            producers_max=self.producers_max,
            producer_requests_max=self.producer_requests_max,
            append_frames_bytes=self.dispatch_append_bytes,
            append_records_bytes=self.dispatch_records_bytes,
        )
