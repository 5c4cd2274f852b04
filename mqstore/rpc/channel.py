"""Client channels with the settings every mqstore client wants.

- Message sizes matching the servers' (64 MiB).
- Keepalive every 30 s, so long-lived subscriptions and long polls notice a dead peer; the
  servers allow pings that often (server.py).
- Reconnects at most 2 s apart, so a restarted service is found again quickly.
- Retries of UNAVAILABLE for the idempotent calls only (reads, lookups, Confirm); Append is
  retried by the SDK with its idempotence key, and a stream is never retried for us.
- Security (`ChannelSecurity`): TLS checked against a CA bundle (the system's roots when none
  is given), a client certificate for mutual TLS, and a bearer token sent as
  `authorization: Bearer <token>` on every call. The followers' channels to commitlog_svc and
  the SDK's channels are built from the same pieces here, so the two cannot drift apart.

The token goes on the calls by a client interceptor rather than as gRPC call credentials,
because gRPC refuses call credentials on a plaintext channel, and plaintext with a token is a
legitimate set-up on loopback or inside a mesh that does the TLS. The token is read from its
file when the security is built and is kept out of every repr.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from mqstore.errors import InvalidArgument

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


# HTTP/2 windows and frames sized for batches: a stream's window aims this high (the default
# starts at 64 KiB and grows by probing) and a frame carries up to this much: a large answer
# then goes in fewer frames and window updates, less CPU on both sides (docs/bench.md).
HTTP2_STREAM_WINDOW_BYTES = 8 << 20
HTTP2_FRAME_BYTES_MAX = 4 << 20


def http2_options() -> list[tuple[str, Any]]:
    """The HTTP/2 options both ends of every mqstore connection use."""
    return [
        ("grpc.http2.lookahead_bytes", HTTP2_STREAM_WINDOW_BYTES),
        ("grpc.http2.max_frame_size", HTTP2_FRAME_BYTES_MAX),
    ]


def channel_options() -> list[tuple[str, Any]]:
    return [
        *http2_options(),
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


# The metadata key and scheme of the token (RFC 6750's header, lower-case as HTTP/2 wants).
AUTHORIZATION_KEY = "authorization"
BEARER_PREFIX = "Bearer "


def read_secret(path: str) -> str:
    """A token from its file: surrounding whitespace (a trailing newline) is not part of it."""
    with open(path, encoding="utf-8") as f:
        secret = f.read().strip()
    if not secret:
        raise InvalidArgument(f"the token file {path} is empty", field="token_file")
    return secret


def _read_bytes(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class ChannelSecurity:
    """How a client checks a service and proves itself to it.

    `tls` turns TLS on; `ca_file` is the CA bundle the server's certificate must chain to
    (None: the system's roots); `cert_file` and `key_file` together present a client
    certificate (mutual TLS); `server_name` replaces the target's host as the name checked
    against the server's certificate. `token` is sent on every call; build it with
    `from_files` so that it comes from a file."""

    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise InvalidArgument("a client certificate needs both its file and its key file")
        if not self.tls and (self.ca_file or self.cert_file or self.server_name):
            raise InvalidArgument("a CA, a client certificate or a server name need tls=True")

    @classmethod
    def from_files(
        cls,
        *,
        tls: bool | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        server_name: str | None = None,
        token_file: str | None = None,
    ) -> ChannelSecurity:
        """`tls` None: on when any TLS file or a server name is given. Empty strings count as
        not given (settings use "" for unset)."""
        if tls is None:
            tls = bool(ca_file or cert_file or key_file or server_name)
        return cls(
            tls=tls,
            ca_file=ca_file or None,
            cert_file=cert_file or None,
            key_file=key_file or None,
            server_name=server_name or None,
            token=read_secret(token_file) if token_file else None,
        )

    def credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials from the files (read now), or None for a plaintext channel."""
        if not self.tls:
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=_read_bytes(self.ca_file),
            private_key=_read_bytes(self.key_file),
            certificate_chain=_read_bytes(self.cert_file),
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.token)

    def options(self) -> list[tuple[str, Any]]:
        options = channel_options()
        if self.tls and self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return options


PLAINTEXT = ChannelSecurity()


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION_KEY, BEARER_PREFIX + token),) if token else ()


def make_channel(target: str, security: ChannelSecurity = PLAINTEXT) -> grpc.Channel:
    """A channel to `target` with the shared options, TLS when `security` says so, and its
    token on every call."""
    options = security.options()
    credentials = security.credentials()
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    metadata = security.metadata()
    if not metadata:
        return channel
    return grpc.intercept_channel(channel, _MetadataInterceptor(metadata))


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _MetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed metadata (the token) to every call of every kind."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), *self._metadata),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Any:
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Any:
        return continuation(self._details(details), request_iterator)
