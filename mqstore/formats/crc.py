"""The body CRC of RocketMQ's record format (pure: no I/O).

BODYCRC is CRC-32 with zlib's polynomial, top bit cleared (record.py). Every record is checked
by it several times in its life: when it is encoded, on every Read, by the SDK on every pull,
and on recovery. ISA-L's `crc32` (the `isal` package) computes the same value as `zlib.crc32`
and faster at every size, the more so the longer the body (figures in docs/bench.md); at
100 B most of what is left is the call itself. tests/formats/test_crc.py pins the two
together.

The compiled core's `_core.crc32` (the same values; what its own loops use) is not used here:
called from Python it is slower at record sizes (2-core VM, one buffer a call: 100 B 163-256
against 124-131 ns, 1 KiB 355-420 against 210-236 ns; level at 1 MiB: 87-139 against 88-123 us).
"""

from __future__ import annotations

from isal.isal_zlib import crc32

__all__ = ["crc32"]
