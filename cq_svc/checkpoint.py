"""cq_svc's checkpoint: which commit log it follows and how far it is durably applied.

    {data_dir}/cq_checkpoint   layout in mqstore.formats.cq_checkpoint (shared with the Spark
                               rebuild job); this module reads and writes the file.

Written with write_atomic (tmp + fsync + rename + fsync dir), so a crash leaves the old one or
the new one. A missing or corrupt checkpoint reads as confirmed offset 0: recovery then trusts
no unit, and the subscriber rebuilds from the log's minimum (slow, always correct).
"""

from __future__ import annotations

import logging
import os

from mqstore.errors import CorruptFile
from mqstore.formats.cq_checkpoint import FILE_NAME, CqCheckpoint, decode, encode
from mqstore.storage import failpoints
from mqstore.storage.disk import Disk, write_atomic

log = logging.getLogger(__name__)


def load(disk: Disk, data_dir: str) -> CqCheckpoint:
    path = os.path.join(data_dir, FILE_NAME)
    if not disk.exists(path):
        return CqCheckpoint()
    try:
        return decode(disk.read(path), path=path)
    except CorruptFile as exc:
        log.error("ignoring a corrupt checkpoint, every queue will be rebuilt: %s", exc)
        return CqCheckpoint()


def save(disk: Disk, data_dir: str, ckpt: CqCheckpoint) -> None:
    failpoints.hit("cq.checkpoint.before_write")
    write_atomic(disk, os.path.join(data_dir, FILE_NAME), encode(ckpt))
    failpoints.hit("cq.checkpoint.after_write")
