"""The layout lives in mqstore.formats.cq_unit (pure code shared with mqstore.spark's rebuild and
audit jobs); re-exported here so that the service's imports stay as they were."""

from __future__ import annotations

from mqstore.formats.cq_unit import (
    BLANK_SIZE,
    BLANK_UNIT,
    UNIT,
    UNIT_BYTES,
    Buffer,
    Unit,
    count_valid,
    decode_unit,
    encode_units,
    is_valid,
)

__all__ = [
    "BLANK_SIZE",
    "BLANK_UNIT",
    "Buffer",
    "count_valid",
    "decode_unit",
    "encode_units",
    "is_valid",
    "UNIT",
    "Unit",
    "UNIT_BYTES",
]
