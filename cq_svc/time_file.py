"""The layout lives in mqstore.formats.cq_time (pure code shared with mqstore.spark's rebuild and
audit jobs); re-exported here so that the service's imports stay as they were."""

from __future__ import annotations

from mqstore.formats.cq_time import (
    TIME_BYTES,
    TIME_MAX_MS,
    TIME_STORED_BYTES,
    Boundary,
    clamp_time,
    clamp_times,
    decode_time,
    encode_time,
    search_offset_by_time,
)

__all__ = [
    "Boundary",
    "clamp_time",
    "clamp_times",
    "decode_time",
    "encode_time",
    "search_offset_by_time",
    "TIME_BYTES",
    "TIME_MAX_MS",
    "TIME_STORED_BYTES",
]
