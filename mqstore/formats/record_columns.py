"""Checks of many whole records at once (pure: no I/O), each one compiled loop: `check_records`
(_core_check.pxi) and the recovery walk `scan_run_fast` (_core_walk.pxi).

Records laid end to end in one blob, `sizes[i]` bytes each (a Pull's answer, a Read's run of
ranges), in record.py's layout. `check_records` makes every check `read_record` makes of each,
in its order: the magic (V1 or V2), TOTALSIZE fitting its slot, the header (IPv4 or IPv6
hosts), body, topic and properties lengths adding up to it, a non-empty UTF-8 topic without
NUL, properties ending in 0x02, the CRC (the whole-record CRC property's form and value where
the record carries it, else the body CRC) and, when asked, PHYSICALOFFSET equal to where the
record was read from; and the record must fill its slot. It returns the records' fields as
columns, their bodies when asked, and for each record that fails read_record's verdict (its
reason), so that no caller checks a record twice. tests/formats/test_record_columns.py pins
it to read_record, verdict for verdict, damaged records included.

`scan_run_fast` has `record.scan_run`'s contract to the letter (same arguments, result and
queue-table updates), pinned to it by tests/formats/test_record_walk.py: it makes read_record's
checks on each record of a run and stops at the first that fails one, which read_record then
names (the Blank or the Bad), once per walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from mqstore.formats import _core
from mqstore.formats.record import (
    BODY_CRC_MISMATCH,
    RECORD_CRC_DAMAGED,
    RECORD_CRC_MISMATCH,
    Buffer,
    ReadResult,
    Record,
    read_record,
)

IntArray = npt.NDArray[np.int64]

# Why a record fails, by the compiled check's code, as read_record words it (a, b: the numbers
# the check gives beside the code). A record read_record takes that does not fill its slot, or
# an end-of-file blank, is not one whole record.
NOT_WHOLE: Final = "not one whole record"
_REASONS: Final = {
    1: "fewer than 8 bytes left",
    2: NOT_WHOLE,
    3: "illegal magic code {a:#010x}",
    4: "total size {a} does not fit the {b} bytes left",
    5: "total size {a} shorter than the header",
    6: "body length {a} runs past the record",
    7: "topic length runs past the record",
    8: "topic length {a} runs past the record",
    9: "negative properties length {a}",
    10: "total size {a} but the fields add up to {b}",
    11: "topic is not UTF-8",
    12: "topic is empty or holds a NUL byte (a torn write)",
    13: "properties do not end with 0x02 (a torn write)",
    14: RECORD_CRC_DAMAGED,
    15: RECORD_CRC_MISMATCH,
    16: BODY_CRC_MISMATCH,
    17: "physical offset field {a} != position {b}",
    18: NOT_WHOLE,
}
_MAGIC_FAIL: Final = 3


class Failure(NamedTuple):
    """A record that fails its checks: its index in the blob and read_record's reason."""

    record_index: int
    reason: str


def _failure(index: int, code: int, a: int, b: int) -> Failure:
    if code == _MAGIC_FAIL:
        a &= 0xFFFFFFFF
    return Failure(index, _REASONS[code].format(a=a, b=b))


# The rows of CheckedRecords.columns.
START, END, QUEUE_ID, QUEUE_OFFSET, PHYSICAL_OFFSET, SYS_FLAG = range(6)


class CheckedRecords:
    """What check_records found: the records that fail (`failed`, in order; `ok`: none did),
    each record's body (`bodies`: b"" where it failed; empty when not asked for), the OR of
    the passed records' sysflags (`flags_any`), and per record its START, END (where it lies
    in the blob: every record) and, zero where it failed, QUEUE_ID, QUEUE_OFFSET,
    PHYSICAL_OFFSET, SYS_FLAG: as int64 memoryviews by those names in lower case and plural
    (`starts`, ...: `.tolist()`, indexing), or as the rows of one numpy array (`columns`)."""

    __slots__ = ("_columns", "_n", "_view", "bodies", "failed", "flags_any")

    def __init__(
        self, n: int, columns: bytearray, bodies: list[bytes], failed: list[Failure], flags: int
    ) -> None:
        self._n = n
        self._columns = columns
        self.bodies = bodies
        self.failed = failed
        self.flags_any = flags
        self._view: memoryview | None = None

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def columns(self) -> IntArray:
        return np.frombuffer(self._columns, dtype=np.int64).reshape(_core.CHECK_COLUMNS, self._n)

    def _row(self, k: int) -> memoryview:
        view = self._view
        if view is None:
            view = self._view = memoryview(self._columns).cast("q")
        return view[k * self._n : (k + 1) * self._n]

    starts = property(lambda self: self._row(START))
    ends = property(lambda self: self._row(END))
    queue_ids = property(lambda self: self._row(QUEUE_ID))
    queue_offsets = property(lambda self: self._row(QUEUE_OFFSET))
    physical_offsets = property(lambda self: self._row(PHYSICAL_OFFSET))
    sys_flags = property(lambda self: self._row(SYS_FLAG))


def check_records(
    blob: Buffer,
    sizes: Sequence[int] | IntArray,
    expected_offsets: Sequence[int] | IntArray | None = None,
    *,
    bodies: bool = True,
    check_crc: bool = True,
) -> CheckedRecords:
    """Check the records of `blob` (their sizes must add up to its length: ValueError
    otherwise), each as read_record(check_crc=check_crc) does. `expected_offsets`: each
    record's commit-log offset, checked against its PHYSICALOFFSET. `bodies=False`: no bodies
    copied out (a caller that only wants the verdict). Sizes and offsets may come as lists or
    as int64 arrays."""
    columns, body_list, failed, flags = _core.check(
        blob, sizes, expected_offsets, bodies, check_crc
    )
    return CheckedRecords(
        len(sizes),
        columns,
        body_list if body_list is not None else [],
        [_failure(*f) for f in failed] if failed else [],
        flags,
    )


def split_records(blob: bytes, sizes: Sequence[int] | IntArray) -> list[bytes]:
    """The records laid end to end in `blob`, `sizes[i]` bytes each, as one bytes each (a
    comprehension of slices: faster than mapping slice objects)."""
    bounds = [0, *accumulate(sizes)]
    return [blob[a:b] for a, b in pairwise(bounds)]


def scan_run_fast(
    buf: Buffer,
    pos: int,
    end: int,
    base_offset: int,
    *,
    check_crc: bool = True,
    queue_table: dict[str, dict[int, int]] | None = None,
    apply_from: int = 0,
) -> tuple[int, int, ReadResult | None]:
    """`record.scan_run`, compiled: walk the valid records of buf[pos:end] and return (position
    after the last valid record, records walked, what stopped the walk: None at `end`, a Blank
    or a Bad), updating `queue_table` for records at or after `apply_from` exactly as scan_run
    does."""
    pos, count = _core.walk(buf, pos, end, base_offset, check_crc, queue_table, apply_from)
    if pos >= end:
        return pos, count, None
    stop = read_record(buf, pos, end, check_crc=check_crc, expected_offset=base_offset + pos)
    if isinstance(stop, Record):
        # The compiled checks refused a record read_record takes: a bug, never a verdict (the
        # tests pin the two together). Stop loudly rather than cut a valid log here.
        raise AssertionError(f"the compiled walk refused a valid record at {base_offset + pos}")
    return pos, count, stop
