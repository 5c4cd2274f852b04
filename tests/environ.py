"""The environment of the processes tests start.

Tests share a host disk whose usage they do not control: CI's is shared with other machines
and has been seen past the commit log's warning ratio (90 %), where every append is refused
and readiness fails. With the disk-pressure ratios at 1 (df's Use% never exceeds it) no store a
test starts refuses appends or deletes segments early because of that shared disk. Tests of disk
pressure drive it through SimDisk's usage with ratios of their own.
"""

from __future__ import annotations

import os

DISK_PRESSURE_OFF = {
    "MQSTORE_COMMITLOG_DISK_MAX_USED_RATIO": "1",
    "MQSTORE_COMMITLOG_DISK_WARNING_RATIO": "1",
}


def environ_without(*prefixes: str) -> dict[str, str]:
    """os.environ without the variables that start with `prefixes` (a clean client
    environment), keeping DISK_PRESSURE_OFF for any store a command starts."""
    return {k: v for k, v in os.environ.items() if not k.startswith(prefixes)} | DISK_PRESSURE_OFF
