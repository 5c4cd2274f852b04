"""The epoch file on disk, through the Disk seam (layout: mqstore/formats/epoch_file.py).

One file per data directory, `{data_dir}/epochs`, replaced with write_atomic (temporary file,
fsync, rename, fsync of the directory): a crash leaves the old history or the new one, whole,
and `save` returns only once the new one is durable. The commit log keeps its own history
there; each follower keeps the history of what it holds.
"""

from __future__ import annotations

import logging
import os

from mqstore.errors import CorruptFile
from mqstore.formats.epoch_file import decode_epochs, encode_epochs
from mqstore.history import LogHistory
from mqstore.storage.disk import Disk, write_atomic

log = logging.getLogger(__name__)

EPOCHS_FILE = "epochs"


class EpochStore:
    def __init__(self, disk: Disk, data_dir: str) -> None:
        self.disk = disk
        self.path = os.path.join(data_dir, EPOCHS_FILE)

    def load(self) -> tuple[bytes, LogHistory] | None:
        """(store id, history), None when there is no file; CorruptFile when it is damaged."""
        if not self.disk.exists(self.path):
            return None
        return decode_epochs(self.disk.read(self.path), path=self.path)

    def save(self, store_id: bytes, history: LogHistory) -> None:
        write_atomic(self.disk, self.path, encode_epochs(store_id, history))

    def load_follower(self, store_id: bytes) -> LogHistory:
        """The history of what a follower (cq_svc, index_svc) holds of the log `store_id`.
        Empty when there is none to trust (no file, a damaged one, another log's): the
        handshake then takes the follower to hold epoch 0 from offset 0, which can only make
        it replay more, never keep a byte the log no longer has."""
        try:
            found = self.load()
        except CorruptFile as exc:
            log.error("ignoring a damaged epoch file (%s): the handshake replays more", exc)
            return LogHistory()
        if found is None or found[0] != store_id:
            return LogHistory()
        return found[1]
