"""The layout lives in mqstore.formats.index_hash64
(pure code shared with mqstore.spark's rebuild and
audit jobs); re-exported here so that the service's imports stay as they were."""

from __future__ import annotations

from mqstore.formats.index_hash64 import (
    HASH,
    HASH_BYTES,
    HASH_DTYPE,
    HEADER_BYTES,
    MAGIC,
    SUFFIX,
    VERSION,
    decode_header,
    encode_header,
    file_bytes,
    hash_pos,
)

__all__ = [
    "decode_header",
    "encode_header",
    "file_bytes",
    "HASH",
    "HASH_BYTES",
    "HASH_DTYPE",
    "hash_pos",
    "HEADER_BYTES",
    "MAGIC",
    "SUFFIX",
    "VERSION",
]
