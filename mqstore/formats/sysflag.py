"""SYSFLAG bits of a commit-log record (RocketMQ's MessageSysFlag)."""

from __future__ import annotations

COMPRESSED = 0x1
MULTI_TAGS = 0x2

TRANSACTION_MASK = 0xC
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC

BORNHOST_V6 = 0x10
STOREHOST_V6 = 0x20
NEED_UNWRAP = 0x40
INNER_BATCH = 0x80

COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300


def transaction_type(sys_flag: int) -> int:
    return sys_flag & TRANSACTION_MASK


def gets_queue_offset(sys_flag: int) -> bool:
    """Only NOT and COMMIT messages take a consume-queue offset and are dispatched to a queue."""
    return transaction_type(sys_flag) in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
