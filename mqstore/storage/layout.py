"""Where a store's parts are on disk, found from one directory a user names.

`mqstore up --data-dir DATA` lays a store out as (mqstore/cli/up.py):

    DATA/commitlog_svc/commitlog/00000000000000000000   the segments (commitlog_svc's data dir
    DATA/commitlog_svc/store.meta                       is DATA/commitlog_svc)
    DATA/commitlog_svc-0/ ...  DATA/commitlog_svc-2/    instead, with --replicas 3
    DATA/cq_svc/consumequeue/...  DATA/cq_svc/cq_checkpoint   cq_svc's data dir
    DATA/index_svc/index/...      DATA/index_svc/index/checkpoint   index_svc's data dir

The tools that read a store's files (`mqstore log ...`, `mqstore spark ...`, the `mqstore-log`
source) take DATA itself, a service's data dir, or the exact directory of a part, and call
`store_parts` to find what they read. `data/commitlog`, `data/cq` and `data/index` (the names of
a test cluster's parts, mqstore/testing/cluster.py) are found too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mqstore.errors import InvalidArgument
from mqstore.formats import cq_checkpoint
from mqstore.storage.logreader import COMMITLOG_SUBDIR, segment_files

# The services' data dirs under `mqstore up`'s DATA_DIR; replica i of the commit log is
# UP_COMMITLOG_DIR-i.
UP_COMMITLOG_DIR: Final = "commitlog_svc"
UP_CQ_DIR: Final = "cq_svc"
UP_INDEX_DIR: Final = "index_svc"
# What marks a cq_svc data dir (FILE store: the unit tree; RocksDB store: its directory) and an
# index_svc data dir (its index/ tree).
_CQ_MARKS: Final = ("consumequeue", "cq_rocksdb", cq_checkpoint.FILE_NAME)
_INDEX_SUBDIR: Final = "index"
# The other names a part is found under (a test cluster's root: commitlog/, cq/, index/).
_CQ_NAMES: Final = (UP_CQ_DIR, "cq")
_INDEX_NAMES: Final = (UP_INDEX_DIR, "index")


@dataclass(frozen=True, slots=True)
class StoreParts:
    """The parts found under a directory; None where none is.

    commitlog           the directory that holds the segment files
    cq                  cq_svc's data dir
    index               index_svc's data dir
    commitlog_replicas  with `mqstore up --replicas N`: each replica's segment directory (then
                        `commitlog` is None: which replica to read is the caller's choice)
    """

    commitlog: str | None
    cq: str | None
    index: str | None
    commitlog_replicas: tuple[str, ...] = ()

    def require_commitlog(self, named: str) -> str:
        """The segment directory, or InvalidArgument saying what `named` holds instead."""
        if self.commitlog is not None:
            return self.commitlog
        if not os.path.isdir(named):
            raise InvalidArgument(f"{named} is not a directory")
        if self.commitlog_replicas:
            listed = ", ".join(self.commitlog_replicas)
            raise InvalidArgument(
                f"{named} holds {len(self.commitlog_replicas)} commit-log replicas ({listed}): "
                "name the one to read"
            )
        raise InvalidArgument(
            f"no commit log in {named}: give the data dir `mqstore up` made, commitlog_svc's "
            "data dir, or the directory of the segment files"
        )


def store_parts(directory: str) -> StoreParts:
    """The parts of a store found from `directory`: DATA of `mqstore up`, a service's data dir,
    or the directory of a part itself. Paths are absolute."""
    root = os.path.abspath(directory)
    if not os.path.isdir(root):
        return StoreParts(None, None, None)
    commitlog = next(
        (d for d in (root, os.path.join(root, COMMITLOG_SUBDIR)) if _has_segments(d)), None
    )
    replicas: tuple[str, ...] = ()
    if commitlog is None:
        found = _commitlog_data_dirs(root)
        dirs = tuple(os.path.join(f, COMMITLOG_SUBDIR) for f in found)
        if len(dirs) == 1:
            commitlog = dirs[0]
        else:
            replicas = dirs
    return StoreParts(
        commitlog=commitlog,
        cq=_first(root, _CQ_NAMES, _is_cq_dir),
        index=_first(root, _INDEX_NAMES, _is_index_dir),
        commitlog_replicas=replicas,
    )


def _has_segments(directory: str) -> bool:
    return os.path.isdir(directory) and bool(segment_files(directory))


def _commitlog_data_dirs(root: str) -> list[str]:
    """commitlog_svc's data dirs under `root`: commitlog_svc/, commitlog/ (a test cluster's),
    or the replicas commitlog_svc-0, -1, ... (in replica order)."""
    for name in (UP_COMMITLOG_DIR, COMMITLOG_SUBDIR):
        if os.path.isdir(os.path.join(root, name, COMMITLOG_SUBDIR)):
            return [os.path.join(root, name)]
    prefix = UP_COMMITLOG_DIR + "-"
    numbered = []
    for name in os.listdir(root):
        suffix = name.removeprefix(prefix)
        if name.startswith(prefix) and suffix.isdigit():
            numbered.append((int(suffix), os.path.join(root, name)))
    return [path for _, path in sorted(numbered)]


def _first(root: str, names: tuple[str, ...], test: Callable[[str], bool]) -> str | None:
    for name in names:
        candidate = os.path.join(root, name)
        if test(candidate):
            return candidate
    return root if test(root) else None


def _is_cq_dir(directory: str) -> bool:
    return any(os.path.exists(os.path.join(directory, m)) for m in _CQ_MARKS)


def _is_index_dir(directory: str) -> bool:
    return os.path.isdir(os.path.join(directory, _INDEX_SUBDIR))
