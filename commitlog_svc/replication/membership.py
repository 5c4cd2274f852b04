"""A replica's memory that it belonged to a broker group: `{data_dir}/group.json`.

    {"group": "mqstore", "store_id": "9f2c...", "epoch": 3}   UTF-8 JSON, written atomically

Written once, the first time the replica sees its group's coordinator state with an epoch
(some replica led). Its use: etcd that lost its data (not restored from a snapshot) forgets the
in-sync set, and its next election would count as the group's first, which any replica may
win, even one that missed acknowledged appends. A replica that remembers the group refuses to
take part in such an election (docs/replication.md, "Failure cases") unless the operator
allows an unclean one; a fresh replica, or a single store being made a group's first replica,
has no such file and elects as before.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mqstore.errors import CorruptFile
from mqstore.storage.disk import Disk, write_atomic

FILE_NAME = "group.json"


@dataclass(frozen=True, slots=True)
class Membership:
    group: str
    store_id: str
    epoch: int  # the group epoch when it was first seen


def path_in(data_dir: str) -> str:
    return os.path.join(data_dir, FILE_NAME)


def load(disk: Disk, data_dir: str) -> Membership | None:
    """The membership this replica remembers, or None (never in a group)."""
    path = path_in(data_dir)
    if not disk.exists(path):
        return None
    raw = disk.read(path)
    try:
        data = json.loads(raw)
        return Membership(str(data["group"]), str(data["store_id"]), int(data["epoch"]))
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptFile(path, f"not a group membership record: {raw[:100]!r}") from err


def save(disk: Disk, data_dir: str, membership: Membership) -> None:
    record = {"group": membership.group, "store_id": membership.store_id, "epoch": membership.epoch}
    write_atomic(disk, path_in(data_dir), json.dumps(record).encode())
