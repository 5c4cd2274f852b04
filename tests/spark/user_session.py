"""A user's program, as README.md's Spark snippet writes it, run by test_jobs_ux.py with the
venv's python by its full path and PATH=/usr/bin:/bin (no venv activated).

    python user_session.py DATA_DIR

Prints one JSON line on stdout after the table of `show()`: the session's settings and the
addresses its JVM listens on (from /proc: the JVM's socket inodes matched in its net/tcp*).
"""

from __future__ import annotations

import json
import os
import sys

import mqstore.spark

CONF_KEYS = (
    "spark.master",
    "spark.driver.host",
    "spark.driver.bindAddress",
    "spark.ui.enabled",
    "spark.python.daemon.module",
)
TCP_LISTEN = "0A"


def listening_addresses(pid: int) -> list[str]:
    """Local addresses (hex, as /proc writes them) of the sockets `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[3] == TCP_LISTEN and fields[9] in inodes:
                    found.append(fields[1])
    return found


def main() -> None:
    spark = mqstore.spark.session()
    raw = spark.read.format("mqstore-log").load(sys.argv[1])
    raw.select("topic", "queueId", "queueOffset").show(3)
    pid = spark.sparkContext._gateway.proc.pid
    conf = {key: spark.conf.get(key, None) for key in CONF_KEYS}
    print(json.dumps({"conf": conf, "listening": listening_addresses(pid)}))
    spark.stop()


if __name__ == "__main__":
    main()
