"""One thread at a time in a process's numpy-heavy sections: a lock above the GIL.

numpy lets go of the GIL inside each ufunc, gather or copy over a few hundred elements. One
thread loses nothing by that; several threads in such code at once (a service's gRPC handlers
and its dispatch thread) hand the GIL to one another at every release, and every hand-off is a
context switch: several threads checking pulls (check_records) at once use several times the
CPU of one thread making the same calls. With this lock around the calls, a call costs about
one switch and the threads together one thread's CPU (figures in docs/bench.md).

Python runs one thread at a time anyway: what the lock takes away is the hand-offs alone
(numpy's parallelism over arrays this small is nil). Hold it around computation only, never
across a gRPC call, a disk sync or a wait for another thread, and take it before any other
lock (it is the outermost):

    with CPU_SECTION:
        ...

Reentrant, so that a section calling into another costs nothing and cannot deadlock itself.

Known wait inside it: cq_svc's pull decision takes the consume-queue store's lock, which its
flush thread holds while it flushes (a few pages, a millisecond or so); the other pulls'
checks and the frame applies wait that long too (the applies waited for that lock anyway).
"""

from __future__ import annotations

import threading
from typing import Final

CPU_SECTION: Final = threading.RLock()
