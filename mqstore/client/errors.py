"""Typed exceptions of the SDK: one class per gRPC status, each carrying what the server said.

    ClientError                      (base)  .code .details .field .method
    ├── InvalidArgument              INVALID_ARGUMENT   also an mqstore.errors.InvalidArgument
    ├── OutOfRange                   OUT_OF_RANGE       also an mqstore.errors.OutOfRange
    ├── NotFound                     NOT_FOUND          ...
    ├── FailedPrecondition           FAILED_PRECONDITION
    ├── ResourceExhausted            RESOURCE_EXHAUSTED (disk full, store busy, too big)
    ├── Unavailable                  UNAVAILABLE        retried by the SDK where that is safe
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

import grpc

from mqstore import errors as domain
from mqstore.rpc.errors import error_from_rpc


class ClientError(domain.MqstoreError):
    """A call failed. `code` is the gRPC status, `details` the server's message, `field` the
    request field it named (INVALID_ARGUMENT), `method` the call ("CommitLog/Append")."""

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

    def __str__(self) -> str:
        where = f"{self.method}: " if self.method else ""
        field = f" (field {self.field})" if self.field else ""
        return f"{where}{self.code.name}: {self.details}{field}"


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
