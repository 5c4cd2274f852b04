"""The layout lives in mqstore.formats.index_checkpoint
(pure code shared with mqstore.spark's rebuild and
audit jobs); re-exported here so that the service's imports stay as they were."""

from __future__ import annotations

from mqstore.formats.index_checkpoint import (
    FILE_HAS_COMPANION,
    FILE_HEAD_CRC,
    FILE_RECORD_BYTES,
    FILE_SEALED,
    FLAG_CLEAN_CLOSE,
    FLAG_EXACT,
    MAGIC,
    NO_STORE_ID,
    STORE_ID_BYTES,
    VERSION,
    FileRecord,
    IndexCheckpoint,
    decode_checkpoint,
    encode_checkpoint,
)

__all__ = [
    "decode_checkpoint",
    "encode_checkpoint",
    "FILE_HAS_COMPANION",
    "FILE_HEAD_CRC",
    "FILE_RECORD_BYTES",
    "FILE_SEALED",
    "FileRecord",
    "FLAG_CLEAN_CLOSE",
    "FLAG_EXACT",
    "IndexCheckpoint",
    "MAGIC",
    "NO_STORE_ID",
    "STORE_ID_BYTES",
    "VERSION",
]
