"""The small files beside the commit log: checkpoint, store meta, abort marker, lock.

    {data_dir}/commitlog/…      segments (mapped_file_queue.py)
    {data_dir}/checkpoint       flushed offset + queue-offset table (commitlog_checkpoint.py)
    {data_dir}/store.meta       store id, written once
    {data_dir}/epochs           the log's history: an epoch begins at every start
                                (mqstore/formats/epoch_file.py, mqstore/history.py)
    {data_dir}/abort            exists while the store is open: its presence at start-up means
                                the last exit was not clean (holds the PID, as RocketMQ's)
    {data_dir}/lock             flock'ed while open: two processes never open one store

Formats live in mqstore.formats.commitlog_checkpoint; this module only does the I/O, through the
Disk seam, so that the simulated disk sees every step.
"""

from __future__ import annotations

import logging
import os
import uuid

from mqstore.errors import CorruptFile
from mqstore.formats.commitlog_checkpoint import (
    Checkpoint,
    StoreMeta,
    decode_checkpoint,
    decode_meta,
    encode_checkpoint,
    encode_meta,
)
from mqstore.history import LEGACY_EPOCH, LogHistory
from mqstore.storage import failpoints
from mqstore.storage.disk import Disk, write_atomic
from mqstore.storage.epoch_store import EpochStore
from mqstore.storage.logreader import STORE_LOCK_FILE, STORE_META_FILE

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
META_FILE = STORE_META_FILE
ABORT_FILE = "abort"
LOCK_FILE = STORE_LOCK_FILE


class StoreFiles:
    def __init__(self, disk: Disk, data_dir: str) -> None:
        self.disk = disk
        self.data_dir = data_dir
        self.epochs = EpochStore(disk, data_dir)

    def _path(self, name: str) -> str:
        return os.path.join(self.data_dir, name)

    # -- checkpoint -----------------------------------------------------------------------------

    def load_checkpoint(self) -> Checkpoint | None:
        """The checkpoint, or None when missing or corrupt (recovery then checks everything)."""
        path = self._path(CHECKPOINT_FILE)
        if not self.disk.exists(path):
            return None
        try:
            return decode_checkpoint(self.disk.read(path), path=path)
        except CorruptFile as exc:
            log.error("ignoring a corrupt checkpoint: %s", exc)
            return None

    def save_checkpoint(self, ckpt: Checkpoint) -> None:
        failpoints.hit("checkpoint.before_write")
        write_atomic(self.disk, self._path(CHECKPOINT_FILE), encode_checkpoint(ckpt))
        failpoints.hit("checkpoint.after_write")

    # -- store meta -----------------------------------------------------------------------------

    def load_or_create_meta(self, *, has_data: bool, now_ms: int, file_bytes: int) -> StoreMeta:
        """The store's identity. A lost or corrupt meta file gets a fresh store id, which makes
        every subscriber rebuild from the log: slow, but always correct."""
        path = self._path(META_FILE)
        if self.disk.exists(path):
            try:
                return decode_meta(self.disk.read(path), path=path)
            except CorruptFile as exc:
                log.error("store meta is corrupt (%s); issuing a new store id", exc)
        elif has_data:
            log.error("store meta is missing beside existing data; issuing a new store id")
        meta = StoreMeta(uuid.uuid4().bytes, now_ms, file_bytes)
        write_atomic(self.disk, path, encode_meta(meta))
        return meta

    def reissue_meta(self, meta: StoreMeta) -> StoreMeta:
        """The same store under a new id: every subscriber rebuilds from the log."""
        fresh = StoreMeta(uuid.uuid4().bytes, meta.created_at_ms, meta.file_bytes)
        write_atomic(self.disk, self._path(META_FILE), encode_meta(fresh))
        return fresh

    def adopt_meta(self, meta: StoreMeta, store_id: bytes) -> StoreMeta:
        """The store under the id `store_id` (an empty replica joining its broker group)."""
        adopted = StoreMeta(store_id, meta.created_at_ms, meta.file_bytes)
        write_atomic(self.disk, self._path(META_FILE), encode_meta(adopted))
        return adopted

    # -- history --------------------------------------------------------------------------------

    def load_history(
        self, store_id: bytes, *, min_offset: int, has_data: bool
    ) -> LogHistory | None:
        """The log's history as kept, None when it cannot be trusted (a damaged file).

        no file, no data        an empty history (a new store)
        no file, data           the data so far is epoch 0 (a store from before histories)
        the file of another id  an empty history (the meta was reissued; all rebuild)
        """
        try:
            found = self.epochs.load()
        except CorruptFile as exc:
            log.error("the epoch file is damaged (%s)", exc)
            return None
        if found is None:
            if not has_data:
                return LogHistory()
            log.warning("no epoch file beside existing data: the log so far is epoch 0")
            return LogHistory([(LEGACY_EPOCH, min_offset)])
        kept_id, history = found
        if kept_id != store_id:
            log.warning("the epoch file belongs to another store id; starting a new history")
            return LogHistory()
        return history

    def save_history(self, store_id: bytes, history: LogHistory) -> None:
        failpoints.hit("epochs.before_write")
        self.epochs.save(store_id, history)

    # -- abort marker ---------------------------------------------------------------------------

    def abort_exists(self) -> bool:
        return self.disk.exists(self._path(ABORT_FILE))

    def create_abort(self) -> None:
        self.disk.write(self._path(ABORT_FILE), str(os.getpid()).encode())
        self.disk.fsync_dir(self.data_dir)

    def remove_abort(self) -> None:
        failpoints.hit("commitlog.before_remove_abort")
        self.disk.remove(self._path(ABORT_FILE))
        self.disk.fsync_dir(self.data_dir)

    # -- lock -----------------------------------------------------------------------------------

    def lock_path(self) -> str:
        return self._path(LOCK_FILE)
