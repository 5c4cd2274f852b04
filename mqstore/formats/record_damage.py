"""Which byte of a record with the whole-record CRC was changed, when one was (pure: no I/O).

`mqstore log verify` names the field a damaged record lost, not only its offset. A record that
carries the whole-record CRC (record.py) can say where one changed byte sits: CRC-32 is linear,
so the CRC of the damaged bytes differs from the stored one by the CRC of the change alone, and
a change of one byte e at position p of an L-byte range contributes

    F(e, n) = the CRC register after the byte e then n = L - 1 - p zero bytes (from 0, no final
              inversion): table[e], then n steps r -> table[r & 0xFF] ^ (r >> 8)

Each step is invertible (the top byte of table[i] is different for every i), so the search
runs backwards from the difference: n inverse steps, checking at each whether the register is
some table[e]. One pass over the range (a Python step per byte: ~0.2 s for a MiB), two starting
points (the stored CRC has its top bit cleared: the difference is known but for that bit). A
change inside the CRC property's ten digits is found by trying each digit. An answer is given
only when exactly one (position, byte) explains the difference; a random difference has about
L * 255 / 2**31 spurious explanations (1 in 30,000 for a 250-byte record).

A changed length field is found the same way. TOTALSIZE is what places the CRC property, so a
change to it is found otherwise: the size the other lengths add up to puts a well-formed
property at its end, and with that size the CRC matches.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from mqstore.formats.crc import crc32
from mqstore.formats.record import (
    DAMAGED_RECORD_CRC,
    HEADERS,
    MAGIC_POS,
    MAGIC_V2,
    RECORD_BYTES_MIN,
    RECORD_CRC_BYTES,
    RECORD_CRC_DIGITS,
    RECORD_CRC_HEAD,
    RECORD_CRC_PLACEHOLDER,
    SYSFLAG_POS,
    Buffer,
    field_spans,
    host_bytes_for_flag,
    record_crc,
    record_length,
    stored_record_crc,
)

# Records longer than this are not searched (the pass is a Python step a byte); a 4 MiB body
# would take seconds per damaged record.
SEARCH_BYTES_MAX: Final = 1 << 20
_I32: Final = struct.Struct(">i")
_MASK: Final = 0x7FFFFFFF
_TOP_BIT: Final = 0x80000000
_SMALLEST_WITH_CRC: Final = RECORD_BYTES_MIN + RECORD_CRC_BYTES


def _crc_table() -> list[int]:
    """zlib's CRC-32 table (reflected polynomial 0xEDB88320)."""
    table = []
    for i in range(256):
        r = i
        for _ in range(8):
            r = (r >> 1) ^ 0xEDB88320 if r & 1 else r >> 1
        table.append(r)
    return table


_TABLE: Final = _crc_table()
_BYTE_OF: Final = {value: i for i, value in enumerate(_TABLE)}
_INDEX_OF_TOP: Final = {value >> 24: i for i, value in enumerate(_TABLE)}
assert len(_INDEX_OF_TOP) == 256  # what makes a step invertible


@dataclass(frozen=True, slots=True)
class DamageSite:
    """One changed byte: where in the record, in which field, what it is, and what it was."""

    position: int
    field: str
    found: int
    written: int


def locate_damage(buf: Buffer, pos: int, end: int) -> DamageSite | None:
    """The one changed byte that makes the record at buf[pos:end] (its TOTALSIZE as read) fail
    its whole-record CRC, if exactly one byte explains it; None otherwise (no CRC property
    where TOTALSIZE puts it, the CRC matches, the record is too long to search, or no single
    byte, or more than one, explains the difference)."""
    if end - pos < 8:
        return None
    (total,) = _I32.unpack_from(buf, pos)
    if not _SMALLEST_WITH_CRC <= total <= min(end - pos, SEARCH_BYTES_MAX):
        return _changed_total(buf, pos, end)
    raw = bytes(buf[pos : pos + total])
    stored = stored_record_crc(raw, total, total)
    if stored == DAMAGED_RECORD_CRC:
        return _in_property(raw)
    if stored < 0:
        return _changed_total(buf, pos, end)
    covered = total - RECORD_CRC_BYTES
    actual = crc32(memoryview(raw)[:covered])
    difference = (actual ^ stored) & _MASK
    if not difference:
        return None
    found = _changed_bytes(difference, covered)
    found += _changed_digits(raw, actual & _MASK)
    if len(found) != 1:
        return None
    position, change = found[0]
    repaired = bytearray(raw)
    repaired[position] ^= change
    return DamageSite(
        position, _field_at(bytes(repaired), position), raw[position], repaired[position]
    )


def _changed_total(buf: Buffer, pos: int, end: int) -> DamageSite | None:
    """A changed byte of TOTALSIZE: the size the other lengths add up to puts a well-formed CRC
    property at its end, and with that size in TOTALSIZE the CRC matches."""
    if end - pos < _SMALLEST_WITH_CRC:
        return None
    head = bytes(buf[pos : pos + 40])
    (sys_flag,) = _I32.unpack_from(head, SYSFLAG_POS)
    born, store = host_bytes_for_flag(sys_flag)
    body_at = HEADERS[(born, store)].size
    (body_len,) = _I32.unpack_from(buf, pos + body_at - 4)
    v2 = _I32.unpack_from(head, MAGIC_POS)[0] == MAGIC_V2
    topic_at = pos + body_at + body_len
    if body_len < 0 or topic_at + 4 > end:
        return None
    topic_len = struct.unpack_from(">h", buf, topic_at)[0] if v2 else buf[topic_at]
    props_at = topic_at + (2 if v2 else 1) + topic_len
    if topic_len < 0 or props_at + 2 > end:
        return None
    (props_len,) = struct.unpack_from(">h", buf, props_at)
    total = record_length(
        body_len, topic_len, props_len, born_host_bytes=born, store_host_bytes=store, v2=v2
    )
    if props_len < RECORD_CRC_BYTES or not total <= min(end - pos, SEARCH_BYTES_MAX):
        return None
    repaired = bytearray(buf[pos : pos + total])
    _I32.pack_into(repaired, 0, total)
    stored = stored_record_crc(repaired, total, props_len)
    if stored < 0 or record_crc(repaired, 0, total) != stored:
        return None
    changed = [i for i in range(4) if repaired[i] != buf[pos + i]]
    if len(changed) != 1:
        return None
    i = changed[0]
    return DamageSite(i, "TOTALSIZE", buf[pos + i], repaired[i])


def _changed_bytes(difference: int, length: int) -> list[tuple[int, int]]:
    """(position, xor) of every one-byte change in a `length`-byte range whose CRC
    contribution is `difference` in its low 31 bits."""
    out = []
    table, byte_of, index_of_top = _TABLE, _BYTE_OF, _INDEX_OF_TOP
    for target in (difference, difference | _TOP_BIT):
        r = target
        for n in range(length):
            e = byte_of.get(r)
            if e is not None and e:
                out.append((length - 1 - n, e))
            i = index_of_top[r >> 24]
            r = (((r ^ table[i]) << 8) | i) & 0xFFFFFFFF
    return out


def _changed_digits(raw: bytes, actual: int) -> list[tuple[int, int]]:
    """(position, xor) of every change of one of the CRC property's digits that would make it
    hold `actual`."""
    digits_at = len(raw) - RECORD_CRC_BYTES + len(RECORD_CRC_HEAD)
    want = (b"%010d" % actual)[::-1]
    have = raw[digits_at : digits_at + RECORD_CRC_DIGITS]
    differ = [i for i in range(RECORD_CRC_DIGITS) if want[i] != have[i]]
    if len(differ) != 1:
        return []
    i = differ[0]
    return [(digits_at + i, want[i] ^ have[i])]


def _in_property(raw: bytes) -> DamageSite | None:
    """The one byte of a damaged CRC property that is not what the property's form needs."""
    at = len(raw) - RECORD_CRC_BYTES
    tail = raw[at:]
    wrong = []
    for i, (got, form) in enumerate(zip(tail, RECORD_CRC_PLACEHOLDER, strict=True)):
        is_digit = len(RECORD_CRC_HEAD) <= i < RECORD_CRC_BYTES - 1
        if (is_digit and not 0x30 <= got <= 0x39) or (not is_digit and got != form):
            wrong.append(i)
    if len(wrong) != 1:
        return None
    i = wrong[0]
    first_digit = len(RECORD_CRC_HEAD)
    if first_digit <= i < first_digit + RECORD_CRC_DIGITS:
        # A digit: what it was is the record's CRC's digit there (the rest is intact).
        digits = (b"%010d" % (crc32(memoryview(raw)[:at]) & _MASK))[::-1]
        written = digits[i - first_digit]
    else:
        written = RECORD_CRC_PLACEHOLDER[i]
    return DamageSite(at + i, _field_at(raw, at + i), tail[i], written)


def _field_at(raw: bytes, position: int) -> str:
    for name, start, stop in field_spans(raw):
        if start <= position < stop:
            return name
    return "TOTALSIZE"  # not reached for a position inside the record
