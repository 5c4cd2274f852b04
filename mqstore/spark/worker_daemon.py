"""PySpark's worker daemon, without a traceback when Spark ends a task's socket early.

Spark starts its Python workers through a daemon (`python -m pyspark.daemon`). When a query
needs fewer rows than a Python task makes (`show()`, `take()`, `limit()`), the JVM takes what it
needs and closes the task's socket while the worker is still writing batches. PySpark 4.3's
daemon then prints `BrokenPipeError: [Errno 32] Broken pipe` with a traceback, one per such
task, though the query succeeded and nothing is lost. This module is that daemon with one
change: a worker whose socket the JVM has closed ends quietly and is not reused (as the daemon
does with a worker that failed). Any other error is printed as before.

Used through `spark.python.daemon.module` (mqstore.spark.sessions sets it in local mode); the
workers' interpreter must import mqstore, which the same module sees to.
"""

from __future__ import annotations

import socket
from typing import Any, Final

from pyspark import daemon

# A socket the peer closed: what writing to, or flushing towards, a finished task raises.
PEER_CLOSED: Final = (BrokenPipeError, ConnectionResetError)
# The daemon's own code for "do not reuse this worker" (non-zero: its manager breaks its loop).
_NOT_REUSED: Final = 1

_worker = daemon.worker


def worker(sock: socket.socket, authenticated: bool) -> Any:
    try:
        return _worker(sock, authenticated)
    except PEER_CLOSED:
        return _NOT_REUSED


def main() -> None:
    daemon.worker = worker  # the manager looks the name up at each fork
    daemon.manager()


if __name__ == "__main__":
    main()
