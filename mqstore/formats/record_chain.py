"""Where the records of a run start: the chain of TOTALSIZE fields, followed without a Python
step per record (pure: no I/O).

    pos                                                              end
    | record 0 | record 1 | record 2 | ...             | record k-1 | rec|ord k (past end)
    ^ a record boundary                                             ^ where the chain stops

From a known record boundary `pos`, record i + 1 starts where record i ends (TOTALSIZE). Only
the framing is followed: TOTALSIZE, the magic code and the PHYSICALOFFSET field, which must
equal the record's own commit-log offset (record.py). Nothing else of a record is checked here
(no CRC): this finds boundaries, `read_record` / `record_walk.scan_run_fast` judge records.

One compiled loop (_core_check.pxi's `chain`): a few ns a record, no Python step.

The chain stops at `end`, at the end-of-file blank (not a record: the caller decides), or where
the bytes do not frame a record (a damaged record: the caller's own check names it).

Used by the leader of a replicated log to cut a chunk at a record boundary, and by a follower
to find the records of a chunk whose properties it must read (commitlog_svc/replica_chunk.py).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mqstore.errors import check
from mqstore.formats import _core
from mqstore.formats.record import Buffer

IntArray = npt.NDArray[np.int64]


def record_starts(buf: Buffer, pos: int, end: int, base_offset: int) -> tuple[IntArray, int]:
    """(the starts of the chain of records from `pos` (a record boundary) whose records end by
    `end`, where the chain stops: the end of its last record, or `pos` when none fits).
    `buf[0]` sits at commit-log offset `base_offset`; `end` <= len(buf)."""
    check(0 <= pos <= end <= len(buf), f"range [{pos}, {end}) outside a {len(buf)}-byte buffer")
    starts, stop = _core.chain(buf, pos, end, base_offset)
    return np.frombuffer(starts, dtype=np.int64), stop
