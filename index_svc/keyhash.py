"""The layout lives in mqstore.formats.keyhash (pure code shared with mqstore.spark's rebuild and
audit jobs); re-exported here so that the service's imports stay as they were."""

from __future__ import annotations

from mqstore.formats.keyhash import (
    hashes64,
    index_hashes,
    java_hashes,
    jump_shards,
)

__all__ = [
    "hashes64",
    "index_hashes",
    "java_hashes",
    "jump_shards",
]
