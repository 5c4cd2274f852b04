"""Whether encoded properties are key 0x01 value 0x02 pairs: what an append must hand the store.

    properties = *( key 0x01 value 0x02 )        every pair ends with 0x02, the last one too
    key        = 1*( a byte but 0x01, 0x02 )
    value      = *( a byte but 0x02 )            may be empty; may hold 0x01

The grammar is what RocketMQ's writer makes and its parser reads back whole (properties.py,
reference/rocketmq-store.md §1.5): `messageProperties2String` writes name 0x01 value 0x02 for
every non-null value, so an empty value is written (and skipped when read); the parser takes
the key up to the first 0x01, so a value holding 0x01 reads back as it was. Anything else --
a segment without 0x01, an empty key, an empty segment, bytes after the last 0x02 -- the
parser skips or cuts silently: the message would not read back as it was sent, so commitlog_svc
refuses it (commitlog_svc/append_checks.py).

Every append runs the compiled core's check (`_core.malformed_properties`, _core_dispatch.pxi:
the indices of the blobs that are not well formed), pinned to `well_formed`, the grammar as a
regex; `malformed_reason` says what is wrong with a blob.
"""

from __future__ import annotations

import re

# The grammar above as one regex: the reference the fast check is pinned to (tests).
_PAIRS = re.compile(rb"(?:[^\x01\x02]+\x01[^\x02]*\x02)*")


def well_formed(blob: bytes) -> bool:
    """The reference: `blob` is pairs as the grammar says."""
    return _PAIRS.fullmatch(blob) is not None


def malformed_reason(blob: bytes) -> str:
    """What is wrong with a blob `well_formed` refuses, naming the first bad pair."""
    at = 0
    for k, segment in enumerate(blob.split(b"\x02")):
        last = at + len(segment) >= len(blob)
        if last:
            if segment:
                return f"the bytes after the last 0x02 ({_shown(segment)}) are not a pair"
            break
        sep = segment.find(b"\x01")
        if sep < 0:
            return f"pair {k} ({_shown(segment)}) has no 0x01 between its key and value"
        if sep == 0:
            return f"pair {k} ({_shown(segment)}) has an empty key"
        at += len(segment) + 1
    return "the properties are not key 0x01 value 0x02 pairs"


def _shown(segment: bytes) -> str:
    text = segment[:32].decode("utf-8", "replace")
    return repr(text + ("..." if len(segment) > 32 else ""))
