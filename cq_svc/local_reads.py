"""Pulls answered from the commit log's segment files, when cq_svc can see them
(`--commitlog-dir`: commitlog_svc's data dir, on the same host or in the same pod).

A pull's records otherwise cross two gRPC hops: commitlog_svc's Read to cq_svc, then cq_svc's
answer to the consumer. Sending bytes costs Python gRPC about 2.3 ns a byte on each side, and
the Read is a call on both services; reading the mapped segments here removes that hop
(mqstore.storage.segment_reads.LiveLog does the file work).

What is served is checked as a Read checks it (formats/record_columns.check_records: every
record whole, read_record's checks, its CRC, its PHYSICALOFFSET where the unit points), and
the servicer checks that each is the record its unit names (from the fields the check read);
a group of ranges is answered all or nothing, and anything
not answered here (a file missing or of the wrong size, a record failing a check, ranges below
the log's minimum) goes to the commit log's Read as before, whose verdict stands.

Trusted only while the directory is the log followed: at every handshake the mappings are
dropped and store.meta's store id must equal the handshake's (another directory, or none,
turns these reads off until the next handshake, with a warning).
"""

from __future__ import annotations

import logging

import numpy as np
import numpy.typing as npt

from cq_svc import metrics
from mqstore.formats.record_columns import CheckedRecords, check_records
from mqstore.storage.segment_reads import LiveLog

log = logging.getLogger(__name__)

_HIT = metrics.LOCAL_READS.labels("hit")  # looked up once, not once a read

IntArray = npt.NDArray[np.int64]


class LocalReads:
    def __init__(self, commitlog_dir: str) -> None:
        self.log = LiveLog(commitlog_dir)
        self.active = False  # the directory holds the log followed (checked at each handshake)
        self._missed = False  # the last read could not be answered from the files

    def on_handshake(self, store_id: bytes, min_offset: int) -> None:
        """The log may be another one now: forget every mapping and check the directory's
        store id against the one the handshake gave."""
        self.log.forget(min_offset)
        self._missed = False
        found = self.log.store_id()
        self.active = found == store_id
        if not self.active:
            log.warning(
                "%s holds %s, not the commit log followed (%s): pulls read through the "
                "commit log's Read",
                self.log.data_dir,
                f"store {found.hex()}" if found else "no store.meta",
                store_id.hex(),
            )

    def drop_below(self, min_offset: int) -> None:
        self.log.drop_below(min_offset)

    @property
    def serving(self) -> bool:
        """Active, and the last read was answered from the files (or none came yet): the
        dispatch frames need not bring records. A store.meta that matches beside segment files
        that cannot be read (a volume half shared) misses, and the tail records take over."""
        return self.active and not self._missed

    def copy(self, offsets: IntArray, sizes: IntArray) -> bytes | None:
        """A read's first half: the records at (offsets[i], sizes[i]) copied out of the segments
        back to back, unchecked (a page not in memory makes it wait for the disk: the servicer
        calls it outside its CPU section); None when inactive or not answerable here. Nothing
        is counted or noted until `check`, so that several copies then several checks note
        their outcomes in the checks' order."""
        if not self.active:
            return None
        return self.log.read(offsets, sizes)

    def check(
        self, offsets: IntArray, sizes: IntArray, blob: bytes | None
    ) -> tuple[bytes, CheckedRecords] | None:
        """A read's second half: `copy`'s bytes checked record by record (a copy that failed
        is a miss), and their fields as the check read them; None: read them through the
        commit log."""
        if not self.active:
            return None
        if blob is None or len(blob) != int(sizes.sum()):
            metrics.LOCAL_READS.labels("miss").inc(len(offsets))
            self._missed = True
            return None
        checked = check_records(blob, sizes, offsets, bodies=False)
        if not checked.ok:
            metrics.LOCAL_READS.labels("failed_check").inc(len(offsets))
            return None
        _HIT.inc(len(offsets))
        self._missed = False
        return blob, checked
