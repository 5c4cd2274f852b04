"""Typed errors of mqstore, and the one table that maps them to gRPC status codes.

    MqstoreError                      (base; never raised itself)
    ├── InvalidArgument               INVALID_ARGUMENT  bad input from a caller
    │   ├── MessageIllegal            a field over its limit, a bad topic, an empty batch
    │   ├── PropertiesTooLarge        encoded properties over 32,767 bytes
    │   └── MalformedRequest          request bytes that do not parse as the method's message
    ├── OutOfRange                    OUT_OF_RANGE      an offset outside what is stored
    │   └── NotCommitted              written, but the broker group's in-sync set lacks it
    ├── NotFound                      NOT_FOUND         an unknown id or queue
    ├── FailedPrecondition            FAILED_PRECONDITION  asked of the wrong place (shard)
    │   ├── NotEligible               a candidate outside the in-sync set (no unclean election)
    │   ├── NotFollower               replicated bytes sent to a replica that leads
    │   ├── ReplicaOffsetMismatch     replicated bytes that do not start at the replica's end
    │   ├── HistoryMismatch           a leader's epochs that contradict the replica's history
    │   ├── StaleEpoch                an epoch not newer than the replica's last
    │   └── StoreIdMismatch           a replica holding another log than its group's
    ├── Aborted                       ABORTED           a compare-and-set lost to another write
    │   └── InSyncSetConflict         the in-sync set changed since the leader read it
    ├── ResourceExhausted             RESOURCE_EXHAUSTED
    │   ├── DiskFull                  no space to preallocate a file
    │   └── StoreBusy                 the write lock was not free within the bound
    ├── Unavailable                   UNAVAILABLE       closed, not writable, recovering
    │   ├── StoreLocked               another process holds the store's lock file
    │   ├── CoordinatorUnavailable    the coordinator (etcd) did not answer within its bound
    │   ├── LeadershipLost            this replica's term is over: lease gone, key not ours,
    │   │                             or its fencing deadline passed
    │   └── NotLeader                 a follower refuses producers' appends (names the leader)
    ├── DataLoss                      DATA_LOSS         stored bytes fail their checks
    │   ├── CorruptRecord             a commit-log record fails its CRC or length check
    │   ├── ChunkRefused              replicated bytes fail recovery's checks: none stored
    │   ├── CorruptFile               a metadata file (checkpoint, meta) fails its CRC
    │   ├── MalformedFrame            a dispatch frame whose columns do not fit together
    │   └── CorruptCoordinatorValue   a value under the group's coordinator keys does not parse
    ├── Unauthenticated               UNAUTHENTICATED   no token, a malformed one, or one no
    │                                                   entry of the tokens file matches
    ├── PermissionDenied              PERMISSION_DENIED a valid token without the scope
    └── StorageError                  INTERNAL          the environment failed (fsync, EIO)
        └── FlushFailed               a flush failed: writes stop, nothing is acknowledged

Expected domain errors are these types. A broken invariant is a bug: it raises
`InvariantViolation` (not an MqstoreError) and the process restarts into recovery.
The gRPC layer maps an error to its status with `grpc_code_name(err)`; nothing else decides codes.
"""

from __future__ import annotations


class MqstoreError(Exception):
    """Base of every expected error. `grpc_code` names a `grpc.StatusCode` member."""

    grpc_code = "UNKNOWN"


class InvalidArgument(MqstoreError):
    grpc_code = "INVALID_ARGUMENT"

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class MessageIllegal(InvalidArgument):
    pass


class PropertiesTooLarge(InvalidArgument):
    pass


class MalformedRequest(InvalidArgument):
    """Request bytes that are not the method's protobuf message (mqstore/rpc/admission.py)."""


class OutOfRange(MqstoreError):
    grpc_code = "OUT_OF_RANGE"


class NotCommitted(OutOfRange):
    """A record this replica holds past the broker group's commit offset: no reader is served
    it until every in-sync replica holds it, so nothing a reader saw can vanish in a failover."""


class NotFound(MqstoreError):
    grpc_code = "NOT_FOUND"


class FailedPrecondition(MqstoreError):
    grpc_code = "FAILED_PRECONDITION"


class NotEligible(FailedPrecondition):
    """A candidate for leadership outside the in-sync set, unclean election not allowed."""


class NotFollower(FailedPrecondition):
    """Replicated bytes, a truncation or a start sent to a replica that leads."""


class ReplicaOffsetMismatch(FailedPrecondition):
    """Replicated bytes for `offset` reached a replica whose log ends at `end_offset`: the
    stream and the replica disagree (re-handshake)."""

    def __init__(self, offset: int, end_offset: int) -> None:
        super().__init__(
            f"replicated bytes start at {offset} but this replica's log ends at {end_offset}"
        )
        self.offset = offset
        self.end_offset = end_offset


class HistoryMismatch(FailedPrecondition):
    """The leader's epochs for some bytes contradict this replica's history (it was not
    truncated at the agreed offset first)."""


class StaleEpoch(FailedPrecondition):
    """An epoch to begin that is not newer than the replica's last."""


class StoreIdMismatch(FailedPrecondition):
    """A replica holding bytes of another log than its group's."""


class ResourceExhausted(MqstoreError):
    grpc_code = "RESOURCE_EXHAUSTED"


class DiskFull(ResourceExhausted):
    pass


class StoreBusy(ResourceExhausted):
    pass


class Unavailable(MqstoreError):
    grpc_code = "UNAVAILABLE"


class StoreLocked(Unavailable):
    pass


class CoordinatorUnavailable(Unavailable):
    """The coordinator did not answer within its bound (refused, timed out, or an error of its
    own); `operation` names the call. Nothing is known about whether a write took effect."""

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"coordinator unavailable during {operation}: {reason}")
        self.operation = operation
        self.reason = reason


class LeadershipLost(Unavailable):
    """This replica's leadership term is over; it must not acknowledge and must step down."""


class NotEnoughReplicas(Unavailable):
    """A leader under sync replication with fewer replicas in its in-sync set than min
    in-sync: it takes no append (nothing stored) until a follower catches up (RocketMQ's
    SLAVE_NOT_AVAILABLE, Kafka's NOT_ENOUGH_REPLICAS). A request-level error, so that the
    producer sends the request again rather than failing its messages."""


class Aborted(MqstoreError):
    grpc_code = "ABORTED"


class InSyncSetConflict(Aborted):
    """The in-sync set changed since it was read: read it again and decide anew."""


class NotLeader(Unavailable):
    """This replica follows: producers append to the leader (`leader`: its name or address as
    the service knows it, "" when it does not know one yet)."""

    def __init__(self, message: str, *, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


class DataLoss(MqstoreError):
    grpc_code = "DATA_LOSS"


class CorruptRecord(DataLoss):
    """A commit-log record at `offset` fails its checks; `reason` says which."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class ChunkRefused(DataLoss):
    """Bytes sent to a follower fail the checks recovery makes, at `offset`; none of the chunk
    was stored."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"replicated bytes refused at offset {offset}: {reason}; none stored")
        self.offset = offset
        self.reason = reason


class CorruptFile(DataLoss):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"corrupt file {path}: {reason}")
        self.path = path
        self.reason = reason


class Unauthenticated(MqstoreError):
    """The caller did not prove who it is. The message never echoes what it presented."""

    grpc_code = "UNAUTHENTICATED"


class PermissionDenied(MqstoreError):
    grpc_code = "PERMISSION_DENIED"


class MalformedFrame(DataLoss):
    """A dispatch frame from the commit log that cannot be applied as it is."""


class CorruptCoordinatorValue(DataLoss):
    """A value under a broker group's coordinator keys that is not what mqstore writes."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"corrupt coordinator value at {key}: {reason}")
        self.key = key
        self.reason = reason


class StorageError(MqstoreError):
    grpc_code = "INTERNAL"


class FlushFailed(StorageError):
    pass


class InvariantViolation(AssertionError):
    """A bug: state that must never exist. Not caught; the process restarts into recovery."""


def check(condition: bool, message: str) -> None:
    """An invariant check that survives `python -O` (unlike `assert`)."""
    if not condition:
        raise InvariantViolation(message)


def grpc_code_name(err: BaseException) -> str:
    """The `grpc.StatusCode` member name for an error; INTERNAL for anything unexpected."""
    if isinstance(err, MqstoreError):
        return err.grpc_code
    return "INTERNAL"
