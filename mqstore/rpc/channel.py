"""Client channels with the settings every mqstore client wants.

- Message sizes matching the servers' (64 MiB).
- Keepalive every 30 s, so long-lived subscriptions and long polls notice a dead peer; the
  servers allow pings that often (server.py).
- Reconnects at most 2 s apart, so a restarted service is found again quickly.
- Retries of UNAVAILABLE for the idempotent calls only (reads, lookups, Confirm); Append is
  retried by the SDK with its idempotence key, and a stream is never retried for us.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

MAX_MESSAGE_BYTES = 64 << 20
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000
# gRPC's own reconnect backoff grows to 120 s by default: a client would go on failing long
# after a restarted service is back. Capped at 2 s, a restart costs a client ~2 s at most.
RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 2_000

_RETRY_POLICY = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}
_IDEMPOTENT = (
    [
        {"service": "mqstore.commitlog.v1.CommitLog", "method": m}
        for m in ("Read", "GetMessage", "Confirm", "GetStatus")
    ]
    + [
        {"service": "mqstore.consumequeue.v1.ConsumeQueue", "method": m}
        for m in (
            "GetOffsetByTime",
            "GetQueueInfo",
            "ListQueues",
            "ListTopics",
            "FetchOffset",
            "GetStatus",
        )
    ]
    + [{"service": "mqstore.index.v1.Index"}]
)
SERVICE_CONFIG = json.dumps({"methodConfig": [{"name": _IDEMPOTENT, "retryPolicy": _RETRY_POLICY}]})


def channel_options() -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.service_config", SERVICE_CONFIG),
        ("grpc.enable_retries", 1),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
    ]


def make_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=channel_options())
