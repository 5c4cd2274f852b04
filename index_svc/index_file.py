"""One index file on disk, with its exact-mode companion: batch puts, chain walks, flush, cut.

The byte layouts are in mqstore.formats (index_file, index_hash64). This class does the I/O,
through the Disk seam, and keeps the header's in-memory copy and the file's checkpoint record
(`rec`) current. It is not thread-safe: the engine serialises every call.

Batch put. A dispatch batch's keys are written in one compiled call, not a Python step per key
(mqstore.formats.index_file.put_keys, shared with the Spark rebuild job). The bytes are
exactly those of RocketMQ's putKey called once per key in the same order.

Cut. `cut(k)` keeps entries 1 .. k-1 and makes the file what a writer that stopped there would
have left: later entries zeroed, every slot rebuilt as the highest surviving number that hashes
to it, the header restored. Entries are never rewritten, so the survivors' `prev` links stay
valid. Recovery cuts the active file back to what the checkpoint vouches for; the start-up
handshake cuts off what the commit log lost.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np

from mqstore.errors import CorruptFile, check
from mqstore.formats import index_file as fmt
from mqstore.formats import index_hash64 as h64fmt
from mqstore.formats.index_checkpoint import (
    FILE_HAS_COMPANION,
    FILE_HEAD_CRC,
    FILE_SEALED,
    FileRecord,
    region_crc,
)
from mqstore.storage.disk import Disk, Region

log = logging.getLogger(__name__)


class IndexFile:
    def __init__(
        self,
        disk: Disk,
        index_dir: str,
        rec: FileRecord,
        region: Region,
        companion: Region | None,
        header: fmt.IndexHeader,
    ) -> None:
        self.disk = disk
        self.rec = rec
        self.name = fmt.name_of(rec.name_ms)
        self.path = os.path.join(index_dir, self.name)
        self.companion_path = self.path + h64fmt.SUFFIX
        self.header = header
        self._region = region
        self._companion = companion
        self.slot_num = rec.slot_num
        self.entry_num = rec.entry_num
        # Entries below this number are durable and counted in rec's running CRCs.
        self.flushed_count = rec.index_count
        self._head_dirty = False

    # -- life cycle -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        disk: Disk,
        index_dir: str,
        *,
        name_ms: int,
        slot_num: int,
        entry_num: int,
        start_offset: int,
        exact: bool,
    ) -> IndexFile:
        """A new, preallocated file, empty until its first put. (RocketMQ pre-sets a new file's
        header to the previous file's end values; the engine puts the keys that made it create
        the file in the same batch, whose first put overwrites all four, so nobody could ever
        read them.) `start_offset` is the commit-log offset of the first key it will hold."""
        path = os.path.join(index_dir, fmt.name_of(name_ms))
        disk.create(path, fmt.file_bytes(slot_num, entry_num))
        companion = None
        try:
            region = disk.map(path, fmt.file_bytes(slot_num, entry_num))
            if exact:
                cpath = path + h64fmt.SUFFIX
                disk.create(cpath, h64fmt.file_bytes(entry_num))
                companion = disk.map(cpath, h64fmt.file_bytes(entry_num))
                companion.buf[0 : h64fmt.HEADER_BYTES] = h64fmt.encode_header(entry_num)
        except BaseException:
            disk.remove(path)
            disk.remove(path + h64fmt.SUFFIX)
            raise
        header = fmt.IndexHeader()
        rec = FileRecord(
            name_ms=name_ms,
            slot_num=slot_num,
            entry_num=entry_num,
            start_offset=start_offset,
            end_offset=start_offset,
            flags=FILE_HAS_COMPANION if exact else 0,
        )
        f = cls(disk, index_dir, rec, region, companion, header)
        f._sync_rec_header()
        f._write_header()
        # The new header (and companion header) reach the disk with the next flush; until a
        # checkpoint names this file, recovery deletes it anyway.
        f.flushed_count = 1
        return f

    @classmethod
    def open(cls, disk: Disk, index_dir: str, rec: FileRecord) -> IndexFile:
        """Map an existing file described by its checkpoint record. Checks size and, when the
        record says it has one, the companion's header; CorruptFile if either is wrong."""
        path = os.path.join(index_dir, fmt.name_of(rec.name_ms))
        size = fmt.file_bytes(rec.slot_num, rec.entry_num)
        if not disk.exists(path):
            raise CorruptFile(path, "index file named by the checkpoint is missing")
        if disk.size(path) != size:
            raise CorruptFile(path, f"{disk.size(path)} bytes, expected {size}")
        region = disk.map(path, size)
        header = fmt.decode_header(region.buf)
        f = cls(disk, index_dir, rec, region, None, header)
        if rec.has_companion:
            f._companion = f._open_companion()
        return f

    def _open_companion(self) -> Region | None:
        path = self.companion_path
        size = h64fmt.file_bytes(self.entry_num)
        try:
            if not self.disk.exists(path) or self.disk.size(path) != size:
                raise CorruptFile(path, "missing or of the wrong size")
            region = self.disk.map(path, size)
            entry_num = h64fmt.decode_header(bytes(region.buf[0 : h64fmt.HEADER_BYTES]), path=path)
            if entry_num != self.entry_num:
                region.close()
                raise CorruptFile(path, f"made for {entry_num} entries, not {self.entry_num}")
        except CorruptFile as exc:
            log.warning("exact-mode companion of %s unusable: %s", self.name, exc)
            return None
        return region

    def close(self) -> None:
        self._region.close()
        if self._companion is not None:
            self._companion.close()
            self._companion = None

    def destroy(self) -> None:
        """Close and remove both files (the caller fsyncs the directory)."""
        self.close()
        self.disk.remove(self.path)
        self.disk.remove(self.companion_path)

    # -- state ----------------------------------------------------------------------------------

    @property
    def has_companion(self) -> bool:
        return self._companion is not None

    @property
    def capacity_left(self) -> int:
        return self.entry_num - self.header.index_count

    @property
    def is_full(self) -> bool:
        return self.header.index_count >= self.entry_num

    @property
    def sealed(self) -> bool:
        return self.rec.sealed

    def _write_header(self) -> None:
        self._region.buf[0 : fmt.HEADER_BYTES] = fmt.encode_header(self.header)
        self._head_dirty = True

    def _sync_rec_header(self) -> None:
        h, rec = self.header, self.rec
        rec.begin_ts_ms, rec.end_ts_ms = h.begin_ts_ms, h.end_ts_ms
        rec.begin_phy, rec.end_phy = h.begin_phy, h.end_phy

    def _entries_view(self) -> np.ndarray:
        return np.frombuffer(
            self._region.buf,
            dtype=fmt.ENTRY_DTYPE,
            count=self.entry_num,
            offset=fmt.entries_pos(self.slot_num),
        )

    def _slots_view(self) -> np.ndarray:
        return np.frombuffer(
            self._region.buf, dtype=fmt.SLOT_DTYPE, count=self.slot_num, offset=fmt.HEADER_BYTES
        )

    # -- writes ---------------------------------------------------------------------------------

    def put(
        self,
        key_hashes: np.ndarray,
        phys: np.ndarray,
        store_ts_ms: np.ndarray,
        hashes64: np.ndarray | None,
    ) -> None:
        """Append keys (int64 index hashes, commit-log offsets, store times; uint64 64-bit
        hashes in exact mode) as entries c, c+1, ... in order. They must fit."""
        m = len(key_hashes)
        c = self.header.index_count
        check(0 < m <= self.entry_num - c, f"{m} keys do not fit in {self.name} at {c}")
        check(not self.sealed, f"put into sealed index file {self.name}")
        fmt.put_keys(self._region.buf, self.slot_num, self.header, key_hashes, phys, store_ts_ms)
        if self._companion is not None and hashes64 is not None:
            a = h64fmt.hash_pos(c)
            self._companion.buf[a : a + m * h64fmt.HASH_BYTES] = hashes64.astype(
                h64fmt.HASH_DTYPE
            ).tobytes()
        self._write_header()

    def flush(self) -> None:
        """Make everything written durable and fold the new entries into the running CRCs."""
        c = self.header.index_count
        s = self.slot_num
        if self._head_dirty:
            self._region.flush(0, fmt.entries_pos(s))
            if self._companion is not None:
                self._companion.flush(0, h64fmt.HEADER_BYTES)
        done = self.flushed_count
        if c > done:
            a, b = fmt.entry_pos(s, done), fmt.entry_pos(s, c)
            self._region.flush(a, b)
            self.rec.entries_crc = region_crc(self._region.buf, a, b, self.rec.entries_crc)
            if self._companion is not None:
                ha, hb = h64fmt.hash_pos(done), h64fmt.hash_pos(c)
                self._companion.flush(ha, hb)
                self.rec.hash64_crc = region_crc(self._companion.buf, ha, hb, self.rec.hash64_crc)
        self._head_dirty = False
        self.flushed_count = c
        self.rec.index_count = c
        self._sync_rec_header()

    def seal(self, *, full: bool = True) -> None:
        """Flush and record the CRC of header and slots. `full` marks the file as never to be
        written again; a clean close seals the active file with full=False."""
        self.flush()
        self.rec.head_crc = region_crc(self._region.buf, 0, fmt.entries_pos(self.slot_num))
        self.rec.flags |= FILE_HEAD_CRC | (FILE_SEALED if full else 0)

    def unseal(self) -> None:
        self.rec.flags &= ~(FILE_HEAD_CRC | FILE_SEALED)

    def cut(self, keep_count: int, restore: FileRecord | None = None) -> None:
        """Keep entries 1 .. keep_count-1 (see the module doc). With `restore`, the header's
        times and offsets come from that checkpoint record (the header page may be garbage);
        without, they are derived from the survivors. Flushes before returning."""
        k = keep_count
        check(1 <= k <= self.entry_num, f"cut of {self.name} at {k}")
        s = self.slot_num
        self._region.zero(fmt.entry_pos(s, k), fmt.file_bytes(s, self.entry_num))
        if self._companion is not None:
            self._companion.zero(h64fmt.hash_pos(k), h64fmt.file_bytes(self.entry_num))
        entries = self._entries_view()
        slots, used = fmt.rebuild_slots(entries, s, k)
        h = self.header
        if restore is not None:
            h.begin_ts_ms, h.end_ts_ms = restore.begin_ts_ms, restore.end_ts_ms
            h.begin_phy, h.end_phy = restore.begin_phy, restore.end_phy
        elif k > 1:
            h.begin_phy = int(entries["phy"][1])
            h.end_phy = int(entries["phy"][k - 1])
            # Store times are kept in whole seconds past begin: the survivors' latest time is
            # below begin + (max diff + 1) s, and never above the old end time.
            latest = h.begin_ts_ms + int(entries["tdiff"][1:k].max()) * 1000 + 999
            h.end_ts_ms = min(h.end_ts_ms, latest)
        del entries
        self._region.buf[fmt.HEADER_BYTES : fmt.entries_pos(s)] = slots.astype(
            fmt.SLOT_DTYPE
        ).tobytes()
        h.slots_used = used
        h.index_count = k
        self._write_header()
        self._region.flush(0, fmt.file_bytes(s, self.entry_num))
        self.rec.entries_crc = region_crc(
            self._region.buf, fmt.entry_pos(s, 1), fmt.entry_pos(s, k)
        )
        if self._companion is not None:
            self._companion.flush(0, h64fmt.file_bytes(self.entry_num))
            self.rec.hash64_crc = region_crc(
                self._companion.buf, h64fmt.hash_pos(1), h64fmt.hash_pos(k)
            )
        self._head_dirty = False
        self.flushed_count = k
        self.rec.index_count = k
        self._sync_rec_header()
        self.unseal()

    # -- checks ---------------------------------------------------------------------------------

    def entries_crc_matches(self, count: int, expected: int) -> bool:
        s = self.slot_num
        return (
            region_crc(self._region.buf, fmt.entry_pos(s, 1), fmt.entry_pos(s, count)) == expected
        )

    def head_crc_matches(self, expected: int) -> bool:
        return region_crc(self._region.buf, 0, fmt.entries_pos(self.slot_num)) == expected

    def hash64_crc_matches(self, count: int, expected: int) -> bool:
        if self._companion is None:
            return False
        got = region_crc(self._companion.buf, h64fmt.hash_pos(1), h64fmt.hash_pos(count))
        return got == expected

    def drop_companion(self) -> None:
        """Stop filtering by 64-bit hash (the companion failed a check)."""
        if self._companion is not None:
            self._companion.close()
            self._companion = None

    # -- reads ----------------------------------------------------------------------------------

    def select(
        self, key_hash: int, key_hash64: int | None, begin_ms: int, end_ms: int
    ) -> Iterator[int]:
        """Commit-log offsets of the chain's matches, newest first (fmt.chain_matches), minus
        those whose 64-bit hash differs when the file has a companion and one is given."""
        companion = self._companion if key_hash64 is not None else None
        matches = fmt.chain_matches(
            self._region.buf, self.slot_num, self.header, key_hash, begin_ms, end_ms
        )
        if companion is None:
            for _number, phy in matches:
                yield phy
            return
        hbuf = companion.buf
        unpack = h64fmt.HASH.unpack_from
        for number, phy in matches:
            (stored,) = unpack(hbuf, h64fmt.hash_pos(number))
            if stored == key_hash64:
                yield phy

    def read_entry(self, number: int) -> tuple[int, int, int, int]:
        """(key hash, commit-log offset, time diff s, prev) of entry `number` (for tools)."""
        h, phy, diff, prev = fmt.ENTRY.unpack_from(
            self._region.buf, fmt.entry_pos(self.slot_num, number)
        )
        return int(h), int(phy), int(diff), int(prev)

    def first_entry_at_or_after(self, offset: int) -> int:
        """The number of the first entry whose commit-log offset is >= offset, or the index
        count if there is none (entries are in commit-log order)."""
        count = self.header.index_count
        if count <= 1:
            return count
        phys = self._entries_view()["phy"][1:count]
        found = 1 + int(np.searchsorted(phys, offset, side="left"))
        del phys
        return found
