"""Message properties as RocketMQ serialises them inside a commit-log record.

    key 0x01 value 0x02  key 0x01 value 0x02  ...        UTF-8; every pair ends with 0x02

Entries with an empty value are skipped on encode (RocketMQ skips null values). The parser
follows `MessageDecoder.string2messageProperties`: split on 0x02, ignore segments shorter than
3 characters, and require the first 0x01 to lie strictly inside the segment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Property keys the store itself reads (RocketMQ's MessageConst).
KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
WAIT = "WAIT"
INNER_NUM = "INNER_NUM"
INNER_BASE = "INNER_BASE"
# mqstore's own: producer idempotence, on the first record of an idempotent append:
# "<producer id>:<sequence>:<message count>:<refused count>" (commitlog_svc/producers.py).
PRODUCER_SEQ = "MQS_PSEQ"
# RocketMQ's MessageConst.PROPERTY_CRC32: the whole-record CRC the store appends as the last
# property of every record it writes (layout in record.py). The store's, never a producer's:
# appends naming it are refused, and a decoded record's properties do not include it.
RECORD_CRC = "__CRC32#"

KEY_SEPARATOR = " "


def encode_properties(props: Mapping[str, str] | None) -> bytes:
    """Serialise properties; the order is the mapping's order (RocketMQ's is HashMap order)."""
    if not props:
        return b""
    parts = []
    for key, value in props.items():
        if not key:
            raise ValueError("a property needs a non-empty name (the parser would drop it)")
        if not value:
            continue
        if _has_separator(key) or _has_separator(value):
            raise ValueError(f"property {key!r} contains a 0x01 or 0x02 separator byte")
        parts.append(f"{key}\x01{value}\x02")
    return "".join(parts).encode("utf-8")


def decode_properties(raw: bytes | memoryview | str) -> dict[str, str]:
    """Parse a properties string; malformed segments are skipped, never raised on."""
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
    out: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        if len(segment) < 3:
            continue
        sep = segment.find(NAME_VALUE_SEPARATOR)
        if 0 < sep < len(segment) - 1:
            out[segment[:sep]] = segment[sep + 1 :]
    return out


def property_value(raw: bytes, name: str) -> str:
    """decode_properties(raw).get(name, "") without parsing the rest: the value of the last
    segment that starts with `name` 0x01 and has a non-empty value, found by one regex match
    (C speed). 0x01 and 0x02 never occur inside a multi-byte UTF-8 sequence, so decoding the
    value alone gives what decoding the whole string would. The specification of the compiled
    core's lookup (dispatch_columns, property_columns), which the tests pin to it."""
    found = _value_pattern(name).match(raw)
    return "" if found is None else found[1].decode("utf-8", "replace")


@cache
def _value_pattern(name: str) -> re.Pattern[bytes]:
    # Greedy: the longest prefix ending in 0x02 after which the name, 0x01 and a non-empty value
    # follow, i.e. the last such segment; or the first segment when no later one qualifies.
    return re.compile(rb"\A(?:.*\x02)?" + re.escape(name.encode()) + rb"\x01([^\x02]+)", re.S)


def split_keys(keys: str | None) -> list[str]:
    """The non-empty tokens of a KEYS property (space separated)."""
    if not keys:
        return []
    return [k for k in keys.split(KEY_SEPARATOR) if k]


def _has_separator(text: str) -> bool:
    return NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text
