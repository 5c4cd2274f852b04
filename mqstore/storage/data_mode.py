"""Who may read a data directory: the service's own user only, unless told otherwise.

    data_mode   directories   files   process umask
    private     0700          0600    077             the default
    group       0750          0640    027             a group reads too (a Kubernetes fsGroup
                                                      shared with a Spark job, a backup agent)

A store's files hold every message it keeps, so they are private whether or not the API is
secured (`--secure` protects the wire; this protects the disk from the machine's other users).
`apply` runs first thing in each service's main and in `mqstore up`, before anything is
created:

- the process umask, so that every file and directory the process makes (segments,
  checkpoints, queue and index files, RocksDB's, journals, lock and ports files, the logs `up`
  opens, the secrets) is born with the mode, whatever the umask of the shell that started it;
- the data directory itself is created with the mode, or tightened to it;
- when the data directory was looser (made by an earlier version, or copied in), one walk takes
  the bits the mode does not allow from everything under it. Bits are only ever taken away;
  symbolic links are not followed. A data directory that is already tight is not walked: what
  is under it is out of other users' reach whatever its own mode (a start with a million
  consume-queue files costs nothing).
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Final, Literal

log = logging.getLogger(__name__)

DataMode = Literal["private", "group"]
DATA_MODES: Final[tuple[DataMode, ...]] = ("private", "group")
# The permission bits each mode takes away (a umask).
_UMASKS: Final[dict[str, int]] = {"private": 0o077, "group": 0o027}
_PERMISSION_BITS: Final = 0o7777


def umask_of(mode: DataMode) -> int:
    return _UMASKS[mode]


def apply(data_dir: str, mode: DataMode = "private") -> int:
    """Set the process umask for `mode`, create `data_dir` (and its parents) if missing, and
    tighten what is there if the directory was looser. Returns how many entries were
    tightened."""
    umask = umask_of(mode)
    os.umask(umask)
    os.makedirs(data_dir, exist_ok=True)
    top = os.path.realpath(data_dir)  # a data dir that is a link: the directory it names
    if os.stat(top).st_mode & umask == 0:
        return 0
    tightened = _tighten_tree(top, umask)
    log.warning(
        "data directory %s was readable beyond its owner: took away %03o from %d files and "
        "directories (data_mode %s)",
        data_dir,
        umask,
        tightened,
        mode,
    )
    return tightened


def _tighten_tree(top: str, umask: int) -> int:
    tightened = 0
    # Top-down: a directory before its entries, so that nothing is reachable while they are
    # still being tightened. Each directory is tightened when the walk reaches it.
    for root, _dirs, files in os.walk(top, followlinks=False):
        tightened += _tighten(root, umask)
        for name in files:
            tightened += _tighten(os.path.join(root, name), umask)
    return tightened


def _tighten(path: str, umask: int) -> int:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0  # removed meanwhile
    if stat.S_ISLNK(st.st_mode) or st.st_mode & umask == 0:
        return 0
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~umask & _PERMISSION_BITS)
    return 1
