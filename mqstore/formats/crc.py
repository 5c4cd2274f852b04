"""The body CRC of RocketMQ's record format (pure: no I/O).

BODYCRC is CRC-32 with zlib's polynomial, top bit cleared (record.py). Every record is checked
by it several times in its life: when it is encoded, on every Read, by the SDK on every pull,
and on recovery. ISA-L's `crc32` (the `isal` package) computes the same value as `zlib.crc32`
and faster at every size, the more so the longer the body (figures in docs/bench.md); at
100 B most of what is left is the call itself. tests/formats/test_crc.py pins the two
together.
"""

from __future__ import annotations

from isal.isal_zlib import crc32

__all__ = ["crc32"]
