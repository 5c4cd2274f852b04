"""Typed exceptions of the SDK: one class per gRPC status, each carrying what the server said.

    ClientError                      (base)  .code .details .field .method
    ├── InvalidArgument              INVALID_ARGUMENT   also an mqstore.errors.InvalidArgument
    ├── OutOfRange                   OUT_OF_RANGE       also an mqstore.errors.OutOfRange
    ├── NotFound                     NOT_FOUND          ...
    ├── FailedPrecondition           FAILED_PRECONDITION
    ├── ResourceExhausted            RESOURCE_EXHAUSTED (disk full, store busy, too big)
    ├── Unavailable                  UNAVAILABLE        retried by the SDK where that is safe
    │   └── StoreUnreachable                            no connection could be made (.address
    │                                                   .cause .transport): why, as far as
    │                                                   the transport tells
    ├── DataLoss                     DATA_LOSS          the stored bytes failed their checks
    │   └── BadRecord                                   one record of a queue that can never
    │                                                   be handed out (.topic .queue_id
    │                                                   .queue_offset .commit_log_offset):
    │                                                   the consumer moves past it
    ├── Unauthenticated              UNAUTHENTICATED    no token, or a wrong one (also domain)
    ├── PermissionDenied             PERMISSION_DENIED  the token lacks the scope (also domain)
    ├── DeadlineExceeded             DEADLINE_EXCEEDED  the call's deadline passed
    ├── Cancelled                    CANCELLED
    └── Internal                     INTERNAL / UNKNOWN / anything else
    MessageRefused(ClientError)      one message of an append was not stored (.put_status)

The classes that exist on the server side too (mqstore/errors.py) subclass those, so
`except mqstore.errors.NotFound` catches a NotFound whether it came from an engine in this
process or from a service over gRPC.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import unquote

import grpc

from mqstore import errors as domain
from mqstore.rpc.errors import error_from_rpc


class ClientError(domain.MqstoreError):
    """A call failed. `code` is the gRPC status, `details` the server's message, `field` the
    request field it named (INVALID_ARGUMENT), `method` the call ("CommitLog/Append"); `hint`
    what the client adds: where the call went and what to check (empty when nothing)."""

    status = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        field: str = "",
        method: str = "",
    ) -> None:
        Exception.__init__(self, details)
        self.code = code or self.status
        self.details = details
        self.field = field
        self.method = method
        self.hint = ""

    def __str__(self) -> str:
        where = f"{self.method}: " if self.method else ""
        field = f" (field {self.field})" if self.field else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.code.name}: {self.details}{field}{hint}"


class InvalidArgument(ClientError, domain.InvalidArgument):
    status = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRange(ClientError, domain.OutOfRange):
    status = grpc.StatusCode.OUT_OF_RANGE


class NotFound(ClientError, domain.NotFound):
    status = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(ClientError, domain.FailedPrecondition):
    status = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(ClientError, domain.ResourceExhausted):
    status = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ClientError, domain.Unavailable):
    status = grpc.StatusCode.UNAVAILABLE


class StoreUnreachable(Unavailable):
    """No connection to `address` could be made: the call never reached a server. `cause` is
    the likely reason (a CAUSE_* name, `connect_failure`), `details` says it with what to check,
    `transport` is what gRPC reported."""

    def __init__(
        self, details: str, *, address: str, cause: str, transport: str, method: str = ""
    ) -> None:
        super().__init__(details, method=method)
        self.address = address
        self.cause = cause
        self.transport = transport

    def __str__(self) -> str:
        where = f"{self.method}: " if self.method else ""
        return f"{where}{self.code.name}: cannot reach {self.address}: {self.details}"


class DataLoss(ClientError, domain.DataLoss):
    status = grpc.StatusCode.DATA_LOSS


class BadRecord(DataLoss):
    """A record of a queue that can never be handed out: the store refuses it as damaged (it
    fails its CRC or layout checks), or it does not decode here (a body marked compressed
    that does not decompress, a record that fails its checks on arrival).

    The consumer hands out every message before it, then raises this once, at its place in
    the queue (on_bad_record="raise", the default), and moves past it: the queue's position is
    `queue_offset + 1` afterwards, and the next call goes on with the messages after it (with
    auto_commit, a commit covers it). To stop instead, do not call again, or seek back to
    `queue_offset`. In receive mode the delivery is acknowledged when this is raised (it can
    never be consumed), `receipt_handle` says which. on_bad_record="skip" never raises it:
    the record is logged, counted in `Consumer.stats.bad_records` and stepped over the same
    way. A raw `Consumer.pull` lists these in `PullResult.bad_records` instead of raising.

    `commit_log_offset` is where the record lies in the commit log (-1 when not known)."""

    def __init__(
        self,
        reason: str,
        *,
        topic: str,
        queue_id: int,
        queue_offset: int,
        commit_log_offset: int = -1,
        receipt_handle: str = "",
        method: str = "",
    ) -> None:
        super().__init__(
            f"{topic}/{queue_id} offset {queue_offset} (commit-log offset {commit_log_offset}) "
            f"can never be handed out: {reason}",
            method=method,
        )
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.reason = reason
        self.receipt_handle = receipt_handle

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable (Spark ships a task's error to the driver): the fields, not the message.
        fields = (self.reason, self.topic, self.queue_id, self.queue_offset)
        return (_bad_record, (*fields, self.commit_log_offset, self.receipt_handle, self.method))


def _bad_record(
    reason: str,
    topic: str,
    queue_id: int,
    queue_offset: int,
    commit_log_offset: int,
    receipt_handle: str,
    method: str,
) -> BadRecord:
    return BadRecord(
        reason,
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=commit_log_offset,
        receipt_handle=receipt_handle,
        method=method,
    )


class Unauthenticated(ClientError, domain.Unauthenticated):
    status = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ClientError, domain.PermissionDenied):
    status = grpc.StatusCode.PERMISSION_DENIED


class DeadlineExceeded(ClientError):
    status = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ClientError):
    status = grpc.StatusCode.CANCELLED


class Internal(ClientError):
    status = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[ClientError]] = {
    cls.status: cls
    for cls in (
        InvalidArgument,
        OutOfRange,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unavailable,
        DataLoss,
        Unauthenticated,
        PermissionDenied,
        DeadlineExceeded,
        Cancelled,
        Internal,
    )
}


def error_for(
    code: grpc.StatusCode, details: str, *, field: str = "", method: str = ""
) -> ClientError:
    cls = _BY_CODE.get(code, Internal)
    return cls(details, code=code, field=field, method=method)


def from_rpc_error(err: grpc.RpcError, method: str = "") -> ClientError:
    """The typed exception for a failed call (sync or asyncio)."""
    code, details, field = error_from_rpc(err)
    return error_for(code, details, field=field, method=method)


class MessageRefused(ClientError):
    """The store refused one message of an append (RocketMQ's PutMessageStatus).

    `put_status` is the PutStatus name ("MESSAGE_ILLEGAL", "CREATE_MAPPED_FILE_FAILED", ...);
    `code` the status it amounts to, so callers can treat a refusal like a failed call."""

    def __init__(
        self,
        put_status: str,
        details: str,
        *,
        code: grpc.StatusCode,
        field: str = "",
        index: int = -1,
    ) -> None:
        super().__init__(details, code=code, field=field, method="CommitLog/Append")
        self.put_status = put_status
        self.index = index

    def __str__(self) -> str:
        field = f" (field {self.field})" if self.field else ""
        return f"message refused: {self.put_status}: {self.details}{field}"


# How each PutStatus reads as a status code. CREATE_MAPPED_FILE_FAILED is RocketMQ's "disk
# full" (no space to preallocate the next segment); SERVICE_NOT_AVAILABLE and
# OS_PAGE_CACHE_BUSY are worth a retry; FLUSH_DISK_TIMEOUT means stored but not yet known
# durable; FLUSH_DISK_FAILED means the store stopped taking writes until it restarts.
PUT_STATUS_CODES: dict[str, grpc.StatusCode] = {
    "FLUSH_DISK_TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "FLUSH_SLAVE_TIMEOUT": grpc.StatusCode.DEADLINE_EXCEEDED,
    "SLAVE_NOT_AVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "SERVICE_NOT_AVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "CREATE_MAPPED_FILE_FAILED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "MESSAGE_ILLEGAL": grpc.StatusCode.INVALID_ARGUMENT,
    "PROPERTIES_SIZE_EXCEEDED": grpc.StatusCode.INVALID_ARGUMENT,
    "OS_PAGE_CACHE_BUSY": grpc.StatusCode.UNAVAILABLE,
    "UNKNOWN_ERROR": grpc.StatusCode.UNKNOWN,
    "FLUSH_DISK_FAILED": grpc.StatusCode.INTERNAL,
}


def refusal(put_status: str, reason: str, *, field: str = "", index: int = -1) -> MessageRefused:
    code = PUT_STATUS_CODES.get(put_status, grpc.StatusCode.UNKNOWN)
    return MessageRefused(put_status, reason or put_status, code=code, field=field, index=index)


# -- a store that cannot be reached ------------------------------------------------------------

# How gRPC's status details start when the call reached no server (UNAVAILABLE): no
# connection to any address of the target could be made, or its name did not resolve.
_NOT_CONNECTED: Final = (
    "failed to connect to all addresses",
    "errors resolving",
    "DNS resolution failed",
)
# "... last error: UNKNOWN: ipv4:127.0.0.1:7100: Failed to connect to remote host: ..." (an
# IPv6 address comes percent-encoded: ipv6:%5B::1%5D:7100).
_LAST_ERROR: Final = re.compile(
    r"last error: [A-Z_]+: (?:ipv4|ipv6|unix-abstract|unix|vsock):(\S+): (.*)", re.S
)
# The transport's words for a connection the other side closed or reset during setup: a TLS
# server reading a plaintext client's bytes, or refusing the client's certificate, just closes.
_CLOSED: Final = ("Socket closed", "Connection reset", "Broken pipe", "end of stream", "EOF")

CAUSE_REFUSED: Final = "refused"
CAUSE_UNKNOWN_HOST: Final = "unknown_host"
CAUSE_TLS_EXPECTED: Final = "tls_expected"
CAUSE_PLAINTEXT_SERVER: Final = "plaintext_server"
CAUSE_CLIENT_CERT_REQUIRED: Final = "client_cert_required"
CAUSE_CLIENT_CERT_REJECTED: Final = "client_cert_rejected"
CAUSE_SERVER_CERT_UNTRUSTED: Final = "server_cert_untrusted"
CAUSE_SERVER_NAME_MISMATCH: Final = "server_name_mismatch"
CAUSE_NO_ANSWER: Final = "no_answer"
CAUSE_UNKNOWN: Final = "unknown"

_TLS_CA: Final = "the store's CA: MQSTORE_TLS_CA or --tls-ca, as `mqstore up --secure` prints"
_EXPLAINED: Final[dict[str, str]] = {
    CAUSE_REFUSED: "connection refused: nothing listens there (is the store running? "
    "`mqstore up` starts one; or the address or port is wrong)",
    CAUSE_UNKNOWN_HOST: "the host name does not resolve (a typo, or a name this machine "
    "cannot look up)",
    CAUSE_TLS_EXPECTED: f"the server closed the connection: it expects TLS, most likely (give "
    f"{_TLS_CA}); or it is not an mqstore service",
    CAUSE_PLAINTEXT_SERVER: "the TLS handshake failed: the server answers in plaintext, not "
    "TLS (a store started without --tls-cert-file: leave out MQSTORE_TLS_CA / --tls-ca), or "
    "it is not an mqstore service",
    CAUSE_CLIENT_CERT_REQUIRED: "the server closed the connection in the TLS handshake: it "
    "requires a client certificate, most likely (mutual TLS: MQSTORE_TLS_CERT and "
    "MQSTORE_TLS_KEY, or --tls-cert and --tls-key)",
    CAUSE_CLIENT_CERT_REJECTED: "the server closed the connection in the TLS handshake: it "
    "did not accept the client certificate, most likely (signed by a CA it does not trust, "
    "or expired)",
    CAUSE_SERVER_CERT_UNTRUSTED: "the server's certificate is not signed by the CA given "
    f"(give {_TLS_CA})",
    CAUSE_SERVER_NAME_MISMATCH: "the server's certificate does not name this host (give "
    "the name it holds: MQSTORE_TLS_SERVER_NAME or --tls-server-name)",
    CAUSE_NO_ANSWER: "no answer (a host that is down, or a firewall dropping the packets)",
}
_UNKNOWN_CANDIDATES: Final = (
    "the store is not running there, or one side speaks TLS and the other does not"
)


def not_connected(err: ClientError) -> bool:
    """True when gRPC failed the call before any server saw it: no connection could be made."""
    return err.code == grpc.StatusCode.UNAVAILABLE and err.details.startswith(_NOT_CONNECTED)


def connect_cause(transport: str, *, tls: bool, client_cert: bool) -> str:
    """The likely reason (CAUSE_*) a connection failed, from gRPC's words for it and from how
    the client connects: a server that closes the connection during setup says nothing more,
    so which side of TLS the client is on decides what that most likely means."""
    if "Connection refused" in transport:
        return CAUSE_REFUSED
    if "errors resolving" in transport or "DNS resolution failed" in transport:
        return CAUSE_UNKNOWN_HOST
    if "WRONG_VERSION_NUMBER" in transport or "wrong version number" in transport:
        return CAUSE_PLAINTEXT_SERVER
    if "CERTIFICATE_VERIFY_FAILED" in transport:
        return CAUSE_SERVER_CERT_UNTRUSTED
    if "Hostname Verification" in transport:
        return CAUSE_SERVER_NAME_MISMATCH
    if any(word in transport for word in _CLOSED):
        if not tls:
            return CAUSE_TLS_EXPECTED
        return CAUSE_CLIENT_CERT_REJECTED if client_cert else CAUSE_CLIENT_CERT_REQUIRED
    if "timed out" in transport or "Timeout" in transport:
        return CAUSE_NO_ANSWER
    return CAUSE_UNKNOWN


def connect_failure(
    err: ClientError, *, address: str = "", tls: bool, client_cert: bool
) -> StoreUnreachable:
    """The StoreUnreachable for a call that reached no server (`not_connected(err)`), naming
    `address` (else the one gRPC names) and the likely cause."""
    found = _LAST_ERROR.search(err.details)
    transport = found.group(2).strip() if found else err.details
    if not address:
        address = unquote(found.group(1)) if found else "the store"
    cause = connect_cause(err.details, tls=tls, client_cert=client_cert)
    text = _EXPLAINED.get(cause, f"{transport}: {_UNKNOWN_CANDIDATES}")
    return StoreUnreachable(
        text, address=address, cause=cause, transport=transport, method=err.method
    )


def explain_unauthenticated(
    err: ClientError, *, address: str, token_given: bool, token_file: str | None = None
) -> ClientError:
    """The store's UNAUTHENTICATED, with a hint naming `address` and what to check: the token is
    missing (none was set), or the store did not take it (the one in `token_file`)."""
    if not token_given:
        hint = (
            "no token was sent: give the store's token, MQSTORE_TOKEN_FILE or --token-file, "
            "as `mqstore up --secure` prints"
        )
    else:
        source = f" in {token_file}" if token_file else ""
        hint = (
            f"the store did not take the token{source}: expired, revoked, or another "
            "store's? (`mqstore token new` makes one)"
        )
    err.hint = f"{address} refused the call: {hint}" if address else hint
    return err
