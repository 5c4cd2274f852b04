"""What goes into the commit log and what comes back from an append."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mqstore.formats.msgid import offset_msg_id


class PutStatus(enum.IntEnum):
    """RocketMQ's PutMessageStatus, plus FLUSH_DISK_FAILED (a flush failed: not durable).
    SLAVE_NOT_AVAILABLE keeps its number but is not answered: a leader with too few replicas
    in sync refuses the whole request (NotEnoughReplicas, UNAVAILABLE), which producers retry."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPPED_FILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGE_CACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    FLUSH_DISK_FAILED = 100

    @property
    def stored(self) -> bool:
        """The bytes were written (though maybe not durably): the offsets are real."""
        return self in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_DISK_FAILED)


@dataclass(slots=True)
class AppendResult:
    """The outcome of one append call, one column entry per message, in order.

    `statuses[i]` is PUT_OK, a refusal of that message alone (MESSAGE_ILLEGAL, ...), or the
    store-level outcome shared by the batch. For a message not stored, its offsets are -1.
    """

    statuses: list[PutStatus]
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    store_timestamp_ms: int = 0
    # Why the batch (or a message) was refused, for logs and error details.
    reasons: list[str] = field(default_factory=list)
    # The request field a refusal is about ("body", "topic", ...), "" when none; may be empty
    # (no refusal named a field).
    fields: list[str] = field(default_factory=list)
    # The packed store host the offsets belong to ("" until the store fills it in).
    store_host: bytes = b""
    # An idempotent retry: this is the result of the request first stored with this
    # (producer id, sequence); nothing was stored this time.
    duplicate: bool = False

    @property
    def ok(self) -> bool:
        return self.statuses.count(PutStatus.PUT_OK) == len(self.statuses)

    @property
    def status(self) -> PutStatus:
        """The first status that is not PUT_OK, else PUT_OK."""
        for s in self.statuses:
            if s is not PutStatus.PUT_OK:
                return s
        return PutStatus.PUT_OK

    def msg_id(self, i: int, store_host: bytes | None = None) -> str:
        return offset_msg_id(
            store_host if store_host is not None else self.store_host, self.offsets[i]
        )

    def field_of(self, i: int) -> str:
        return self.fields[i] if i < len(self.fields) else ""

    @property
    def end_offset(self) -> int:
        """End of the last stored record (-1 when nothing was stored)."""
        ends = [o + s for o, s in zip(self.offsets, self.sizes, strict=True) if o >= 0]
        return max(ends) if ends else -1

    @classmethod
    def refused(cls, count: int, status: PutStatus, reason: str) -> AppendResult:
        return cls(
            statuses=[status] * count,
            offsets=[-1] * count,
            sizes=[0] * count,
            queue_offsets=[-1] * count,
            reasons=[reason] * count,
        )


@dataclass(slots=True)
class PendingAppend:
    """An append written (or refused, or found to be a duplicate) but not yet answered: under
    sync flush, `CommitLog.finish_append` waits until `end_offset` is durable. Splitting the two
    lets a pipelined stream write request N+1 while request N waits for its flush."""

    result: AppendResult
    end_offset: int  # end of what this request stored; -1 when it stored nothing
