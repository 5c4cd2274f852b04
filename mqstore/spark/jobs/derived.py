"""The derived files of a commit log, built as cq_svc and index_svc build them. No Spark here:
the jobs (rebuild.py, audit.py) run these functions inside Spark tasks, one consume queue or one
index file per call.

    consume queue (cq_svc's FILE store)          index (index_svc)
    {cq}/consumequeue/{topic}/{qid}/{20 digits}  {index}/index/{yyyyMMddHHmmssSSS}
    {cq}/consumequeue_time/{topic}/{qid}/...     {index}/index/{name}.hash64      (exact mode)
    {cq}/cq_checkpoint                           {index}/index/checkpoint

The rules are the services' own, step for step (cq_svc/file_store.py `_apply`, cq_svc/
queue_files.py `append`/`start_at`/`fill_blanks_to`; index_svc/engine.py `apply`/`_put`), over
the layouts in mqstore.formats (cq_unit, cq_time, cq_checkpoint, index_file, index_hash64,
index_checkpoint, keyhash), so that the bytes come out the same:

- a queue's units in commit-log order, skipping an entry already covered (its end at or below
  the last unit's, or its queue offset below the next one); a queue whose first offset is not
  at a file boundary starts with blank units, as does a gap (at most a file of them);
- the time companion holds the running maximum of store times (clamped to 48 bits);
- index keys per message: `topic#UNIQ_KEY`, then `topic#token` for every non-empty token of
  KEYS split on " "; rolled-back transactions are not indexed; with shards, only the keys of
  this shard. File k holds keys k*(N-1) .. (k+1)*(N-1)-1 in that order (N = entry_num), which
  is where the service rolls over whatever its batches were.

What is not the services': index file names. The service names a file by the wall clock at its
creation; here a file is named by the store time of its first key (made strictly increasing),
so a rebuild is reproducible. Names and the checkpoints' `written_at_ms` are the only fields
that hold wall-clock times.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from mqstore.errors import InvalidArgument, check
from mqstore.formats import _core, cq_checkpoint, index_checkpoint, index_hash64, keyhash
from mqstore.formats import index_file as ifmt
from mqstore.formats.commitlog_checkpoint import decode_meta
from mqstore.formats.cq_time import TIME_BYTES, TIME_MAX_MS, clamp_time
from mqstore.formats.cq_unit import BLANK_SIZE, UNIT_BYTES
from mqstore.storage.disk import OsDisk, write_atomic
from mqstore.storage.logreader import STORE_META_FILE
from mqstore.storage.mapped_file import offset_to_file_name

CQ_UNITS_TREE = "consumequeue"
CQ_TIMES_TREE = "consumequeue_time"
CQ_ROCKSDB_DIR = "cq_rocksdb"  # cq_svc's RocksDB store (not read here)
INDEX_SUBDIR = "index"
INDEX_CHECKPOINT = "checkpoint"
# cq_svc's default (RocketMQ's mappedFileSizeConsumeQueue / 20).
UNITS_PER_FILE_DEFAULT = 300_000
# Files are written through the services' Disk seam (write_file).
_DISK = OsDisk()


# ---------------------------------------------------------------------------------------------
# Consume queues


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One dispatch entry of a queue, as much of it as a unit needs."""

    queue_offset: int
    commit_log_offset: int
    size: int
    tags_code: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class QueueUnits:
    """A consume queue in memory as columns: the unit (phy, size, tags code) and the indexed
    time of every queue offset from `first_file_offset` (a file boundary) to `max_offset`,
    blanks included; `min_offset` is the first offset that holds a message."""

    units_per_file: int
    first_file_offset: int
    min_offset: int
    phy: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    tags: npt.NDArray[np.int64]
    time: npt.NDArray[np.int64]

    @property
    def max_offset(self) -> int:
        return self.first_file_offset + len(self.phy)

    def files(self) -> Iterable[tuple[int, bytes, bytes]]:
        """(first queue offset of the file, unit file bytes, time file bytes) of every file
        that holds a unit, each whole (zeros after the last unit, as preallocated). The times
        are already a running maximum, so pack_units (which takes one from 0) keeps them."""
        per = self.units_per_file
        for first in range(self.first_file_offset, self.max_offset, per):
            lo = first - self.first_file_offset
            hi = min(lo + per, len(self.phy))
            rows = np.arange(lo, hi, dtype=np.int64)
            units, times, _ = _core.pack_units(
                rows, 0, self.phy, self.size, self.tags, self.time, 0
            )
            units += bytes((per - (hi - lo)) * UNIT_BYTES)
            times += bytes((per - (hi - lo)) * TIME_BYTES)
            yield first, units, times


def _no_units(units_per_file: int) -> QueueUnits:
    empty = np.zeros(0, dtype=np.int64)
    return QueueUnits(units_per_file, 0, 0, empty, empty, empty, empty)


def build_queue_columns(
    queue_offsets: npt.ArrayLike,
    phys: npt.ArrayLike,
    sizes: npt.ArrayLike,
    tags_codes: npt.ArrayLike,
    store_ts_ms: npt.ArrayLike,
    units_per_file: int,
    where: str = "",
) -> QueueUnits:
    """A queue's units from its dispatch entries (in any order), as QueueImage.apply builds
    them entry by entry (the reference tests pin this to), with numpy over the columns.

    In commit-log order an entry is applied when its queue offset is above the last applied
    one's and its end above the last applied one's. Records of a log do not overlap, so their
    ends rise with their offsets and the second test always holds (checked: an overlap is a
    bug of the reader). The first test then needs no loop: an entry skipped has a queue offset
    at or below the last applied, so the running maximum over all earlier entries is the one
    over the applied ones."""
    order = np.argsort(np.asarray(phys, dtype=np.int64), kind="stable")
    qo = np.asarray(queue_offsets, dtype=np.int64)[order]
    phy = np.asarray(phys, dtype=np.int64)[order]
    size = np.asarray(sizes, dtype=np.int64)[order]
    if not len(qo):
        return _no_units(units_per_file)
    ends = phy + size
    check(bool(np.all(ends[1:] > ends[:-1])) and int(ends[0]) > -1, f"{where}: overlapping records")
    before = np.empty_like(qo)
    before[0] = -1  # an empty queue's next offset is 0
    np.maximum.accumulate(qo[:-1], out=before[1:])
    np.maximum(before, -1, out=before)
    kept = np.flatnonzero(qo > before)
    if not len(kept):
        return _no_units(units_per_file)
    offsets = qo[kept]
    gaps = offsets[1:] - offsets[:-1] - 1
    too_far = np.flatnonzero(gaps > units_per_file)
    if len(too_far):
        at = int(too_far[0])
        raise InvalidArgument(
            f"{where}: entry at queue offset {int(offsets[at + 1])} leaves a gap of "
            f"{int(gaps[at])} units; cq_svc refuses more than a file of blanks too"
        )
    start = int(offsets[0])
    first = start - start % units_per_file
    n = int(offsets[-1]) + 1 - first
    slots = offsets - first
    out_phy = np.zeros(n, dtype=np.int64)
    out_size = np.full(n, BLANK_SIZE, dtype=np.int64)
    out_tags = np.zeros(n, dtype=np.int64)
    out_time = np.zeros(n, dtype=np.int64)
    out_phy[slots] = phy[kept]
    out_size[slots] = size[kept]
    out_tags[slots] = np.asarray(tags_codes, dtype=np.int64)[order][kept]
    # Running maximum of the clamped times; a blank holds the time before it (0 at the start).
    out_time[slots] = np.clip(np.asarray(store_ts_ms, dtype=np.int64)[order][kept], 0, TIME_MAX_MS)
    np.maximum.accumulate(out_time, out=out_time)
    return QueueUnits(units_per_file, first, start, out_phy, out_size, out_tags, out_time)


@dataclass(slots=True)
class QueueImage:
    """A consume queue built entry by entry, as cq_svc applies them: the plain reference
    build_queue_columns is pinned to (tests/spark/test_derived_queue.py). Units and time
    entries from `first_file_offset` (a queue offset at a file boundary) to `max_offset`."""

    units_per_file: int
    min_offset: int = 0
    max_offset: int = 0
    first_file_offset: int = 0
    rows: list[tuple[int, int, int, int]] = field(default_factory=list)  # phy, size, tags, time
    last_phy_end: int = -1
    last_time_ms: int = 0

    def _append(self, rows: Sequence[tuple[int, int, int, int]]) -> None:
        self.rows.extend(rows)
        self.max_offset += len(rows)
        if rows:
            last = rows[-1]
            if not (last[0] == 0 and last[1] == BLANK_SIZE):
                self.last_phy_end = last[0] + last[1]
            self.last_time_ms = last[3]

    def _fill_blanks_to(self, offset: int) -> None:
        last_end, last_time = self.last_phy_end, self.last_time_ms
        self._append([(0, BLANK_SIZE, 0, self.last_time_ms)] * (offset - self.max_offset))
        self.last_phy_end, self.last_time_ms = last_end, last_time

    def _start_at(self, offset: int) -> None:
        file_start = offset - offset % self.units_per_file
        self.min_offset = self.max_offset = self.first_file_offset = file_start
        self._fill_blanks_to(offset)
        self.min_offset = offset

    def apply(self, entries: Iterable[QueueEntry], where: str = "") -> None:
        """Entries in commit-log order (cq_svc's FileCqStore._apply)."""
        for e in entries:
            end = e.commit_log_offset + e.size
            if end <= self.last_phy_end or e.queue_offset < self.max_offset:
                continue  # applied before
            if e.queue_offset > self.max_offset:
                if not self.rows:
                    self._start_at(e.queue_offset)
                else:
                    gap = e.queue_offset - self.max_offset
                    if gap > self.units_per_file:
                        raise InvalidArgument(
                            f"{where}: entry at queue offset {e.queue_offset} leaves a gap of "
                            f"{gap} units; cq_svc refuses more than a file of blanks too"
                        )
                    self._fill_blanks_to(e.queue_offset)
            time_ms = max(self.last_time_ms, clamp_time(e.store_timestamp_ms))
            self._append([(e.commit_log_offset, e.size, e.tags_code, time_ms)])

    def units(self) -> QueueUnits:
        if not self.rows:
            return _no_units(self.units_per_file)
        cols = np.asarray(self.rows, dtype=np.int64).reshape(-1, 4).T.copy()
        return QueueUnits(self.units_per_file, self.first_file_offset, self.min_offset, *cols)


def build_queue(entries: Iterable[QueueEntry], units_per_file: int, where: str = "") -> QueueImage:
    image = QueueImage(units_per_file)
    image.apply(sorted(entries, key=lambda e: e.commit_log_offset), where)
    return image


def write_queue(cq_dir: str, topic: str, queue_id: int, image: QueueUnits) -> int:
    """Write a queue's files under a cq_svc data dir; returns the number of files."""
    udir = os.path.join(cq_dir, CQ_UNITS_TREE, topic, str(queue_id))
    tdir = os.path.join(cq_dir, CQ_TIMES_TREE, topic, str(queue_id))
    os.makedirs(udir, exist_ok=True)
    os.makedirs(tdir, exist_ok=True)
    n = 0
    for first, units, times in image.files():
        write_file(os.path.join(udir, offset_to_file_name(first * UNIT_BYTES)), units)
        write_file(os.path.join(tdir, offset_to_file_name(first * TIME_BYTES)), times)
        n += 1
    return n


def check_cq_data_dir(cq_dir: str) -> None:
    """InvalidArgument unless `cq_dir` is a cq_svc data dir of the FILE store (what the audit
    reads): a wrong path must not read as a store whose every unit is missing."""
    if not os.path.isdir(cq_dir):
        raise InvalidArgument(f"{cq_dir} is not a directory")
    units = os.path.isdir(os.path.join(cq_dir, CQ_UNITS_TREE))
    if not units and os.path.isdir(os.path.join(cq_dir, CQ_ROCKSDB_DIR)):
        raise InvalidArgument(
            f"{cq_dir} holds a RocksDB consume-queue store ({CQ_ROCKSDB_DIR}/): the audit reads "
            "the FILE store's files"
        )
    if not units and not os.path.exists(os.path.join(cq_dir, cq_checkpoint.FILE_NAME)):
        raise InvalidArgument(
            f"{cq_dir} is not a cq_svc data dir: it holds neither {CQ_UNITS_TREE}/ nor "
            f"{cq_checkpoint.FILE_NAME}"
        )


def list_queues(cq_dir: str) -> list[tuple[str, int]]:
    root = os.path.join(cq_dir, CQ_UNITS_TREE)
    if not os.path.isdir(root):
        return []
    out = []
    for topic in sorted(os.listdir(root)):
        for qid in sorted(os.listdir(os.path.join(root, topic))):
            if qid.lstrip("-").isdigit():
                out.append((topic, int(qid)))
    return out


def write_cq_checkpoint(
    cq_dir: str, store_id: bytes, confirmed_offset: int, min_offset: int, now_ms: int
) -> None:
    ckpt = cq_checkpoint.CqCheckpoint(store_id, confirmed_offset, min_offset, now_ms)
    write_file(os.path.join(cq_dir, cq_checkpoint.FILE_NAME), cq_checkpoint.encode(ckpt))


# ---------------------------------------------------------------------------------------------
# Index


@dataclass(frozen=True, slots=True)
class IndexGeometry:
    slot_num: int = ifmt.DEFAULT_SLOT_NUM
    entry_num: int = ifmt.DEFAULT_ENTRY_NUM
    exact: bool = False
    shard_count: int = 1
    shard_index: int = 0

    def __post_init__(self) -> None:
        if self.slot_num < 1 or self.entry_num < 2:
            raise InvalidArgument("an index needs slot_num >= 1 and entry_num >= 2")
        if ifmt.file_bytes(self.slot_num, self.entry_num) > ifmt.FILE_BYTES_MAX:
            raise InvalidArgument("an index file must stay below 2 GiB (Java int positions)")
        if not 0 <= self.shard_index < self.shard_count:
            raise InvalidArgument("shards need 0 <= shard_index < shard_count")

    @property
    def keys_per_file(self) -> int:
        return self.entry_num - 1


def shard_mask(keys: Sequence[str], geometry: IndexGeometry) -> np.ndarray:
    """Which keys this shard indexes (all when unsharded)."""
    if geometry.shard_count == 1:
        return np.ones(len(keys), dtype=bool)
    shards = keyhash.jump_shards(keyhash.hashes64(keys), geometry.shard_count)
    return np.asarray(shards == geometry.shard_index)


@dataclass(slots=True)
class IndexImage:
    """One index file in memory, with its exact-mode companion."""

    data: bytearray
    header: ifmt.IndexHeader
    companion: bytearray | None
    start_offset: int  # commit-log offset of its first key
    first_store_ts_ms: int


@dataclass(frozen=True, slots=True)
class Utf8Keys:
    """Index keys as an Arrow string column holds them: UTF-8 bytes back to back (`data`) and
    one more offset than keys into them, so that a task hashes them without a Python string
    per key (keyhash.index_hashes_utf8)."""

    data: npt.NDArray[np.uint8]
    offsets: npt.NDArray[np.int64]

    @classmethod
    def of(cls, keys: Sequence[str]) -> Utf8Keys:
        parts = [k.encode("utf-8") for k in keys]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return cls(np.frombuffer(b"".join(parts), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def strings(self) -> list[str]:
        raw = self.data.tobytes()
        return [raw[a:b].decode("utf-8") for a, b in itertools.pairwise(self.offsets.tolist())]


def build_index_file(
    geometry: IndexGeometry, keys: Utf8Keys, phys: np.ndarray, store_ts_ms: np.ndarray
) -> IndexImage:
    """One file holding `keys` (at most keys_per_file, in order) as the engine writes them."""
    m = len(keys)
    if not 0 < m <= geometry.keys_per_file:
        raise InvalidArgument(f"{m} keys do not fit an index file of {geometry.entry_num}")
    data = bytearray(ifmt.file_bytes(geometry.slot_num, geometry.entry_num))
    header = ifmt.IndexHeader()
    phys = np.asarray(phys, dtype=np.int64)
    times = np.asarray(store_ts_ms, dtype=np.int64)
    hashes = keyhash.index_hashes_utf8(keys.data, keys.offsets)
    ifmt.put_keys(data, geometry.slot_num, header, hashes, phys, times)
    data[0 : ifmt.HEADER_BYTES] = ifmt.encode_header(header)
    companion = None
    if geometry.exact:
        companion = bytearray(index_hash64.file_bytes(geometry.entry_num))
        companion[0 : index_hash64.HEADER_BYTES] = index_hash64.encode_header(geometry.entry_num)
        at = index_hash64.hash_pos(1)
        wide = keyhash.hashes64(keys.strings()).astype(index_hash64.HASH_DTYPE).tobytes()
        companion[at : at + len(wide)] = wide
    return IndexImage(data, header, companion, int(phys[0]), int(times[0]))


def file_record(
    geometry: IndexGeometry, image: IndexImage, name_ms: int, end_offset: int, *, sealed: bool
) -> index_checkpoint.FileRecord:
    """The checkpoint's record of a file as the engine leaves it: sealed when it filled up, the
    active one as a clean close leaves it (flushed, header CRC set, not sealed)."""
    s, h = geometry.slot_num, image.header
    count = h.index_count
    flags = index_checkpoint.FILE_HEAD_CRC
    if sealed:
        flags |= index_checkpoint.FILE_SEALED
    hash64_crc = 0
    if image.companion is not None:
        flags |= index_checkpoint.FILE_HAS_COMPANION
        hash64_crc = index_checkpoint.region_crc(
            image.companion, index_hash64.hash_pos(1), index_hash64.hash_pos(count)
        )
    return index_checkpoint.FileRecord(
        name_ms=name_ms,
        slot_num=s,
        entry_num=geometry.entry_num,
        start_offset=image.start_offset,
        end_offset=end_offset,
        begin_ts_ms=h.begin_ts_ms,
        end_ts_ms=h.end_ts_ms,
        begin_phy=h.begin_phy,
        end_phy=h.end_phy,
        index_count=count,
        flags=flags,
        entries_crc=index_checkpoint.region_crc(
            image.data, ifmt.entry_pos(s, 1), ifmt.entry_pos(s, count)
        ),
        head_crc=index_checkpoint.region_crc(image.data, 0, ifmt.entries_pos(s)),
        hash64_crc=hash64_crc,
    )


def file_names_ms(first_store_ts_ms: Sequence[int]) -> list[int]:
    """Names for files in order: the first key's store time, strictly increasing (the engine's
    rule for its wall-clock names: at least the previous name + 1 ms)."""
    out: list[int] = []
    for ts in first_store_ts_ms:
        out.append(max(ts, out[-1] + 1) if out else max(ts, 0))
    return out


def write_index_checkpoint(
    index_dir: str,
    geometry: IndexGeometry,
    records: list[index_checkpoint.FileRecord],
    store_id: bytes,
    confirmed_offset: int,
    min_offset: int,
    now_ms: int,
) -> None:
    ckpt = index_checkpoint.IndexCheckpoint(
        store_id=store_id,
        confirmed_offset=confirmed_offset,
        min_offset=min_offset,
        written_at_ms=now_ms,
        shard_count=geometry.shard_count,
        shard_index=geometry.shard_index,
        exact=geometry.exact,
        clean_close=True,
        files=records,
    )
    path = os.path.join(index_dir, INDEX_SUBDIR, INDEX_CHECKPOINT)
    write_file(path, index_checkpoint.encode_checkpoint(ckpt))


def read_index_checkpoint(index_data_dir: str) -> index_checkpoint.IndexCheckpoint | None:
    path = os.path.join(index_data_dir, INDEX_SUBDIR, INDEX_CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return index_checkpoint.decode_checkpoint(f.read(), path=path)


# ---------------------------------------------------------------------------------------------
# Helpers


def store_id_of(commitlog_dir: str) -> bytes:
    """The commit log's store id from commitlog_svc's store.meta, found beside the segments or
    one level up (DATA_DIR/store.meta for DATA_DIR/commitlog); zeros when there is none (a
    RocketMQ log): a service opening the rebuilt files then re-reads the log from its start."""
    here = os.path.abspath(commitlog_dir)
    for base in (here, os.path.dirname(here)):
        path = os.path.join(base, STORE_META_FILE)
        if os.path.exists(path):
            with open(path, "rb") as f:
                return decode_meta(f.read(), path=path).store_id
    return cq_checkpoint.NO_STORE_ID


def write_file(path: str, data: bytes | bytearray) -> None:
    """Write a whole file as the services write theirs (storage/disk.py write_atomic): a reader
    or a crash sees the old content or the new, never half of it. Creates its directory."""
    _DISK.makedirs(os.path.dirname(path))
    write_atomic(_DISK, path, data)
