"""glibc malloc settings for processes that move megabyte messages.

A pull's answer, a Read's, an append batch: each is serialized (protobuf) and copied (gRPC)
into buffers of a megabyte or more, allocated and freed for every message. glibc serves an
allocation above its mmap threshold (128 KiB at start, raised as such blocks are freed) with a
fresh mmap, and gives freed memory at the heap's top back to the kernel past its trim threshold;
either way the next message's buffer is new pages, each one a page fault and zeroing by the
kernel. With the settings below, serializing a megabyte answer costs about twice a plain copy
instead of about ten times (figures in docs/bench.md).

`keep_large_blocks` sets both thresholds once, so that such buffers come from the heap and
stay there between messages. The price is memory: each malloc arena may keep up to
TRIM_THRESHOLD_BYTES free at its top (it is anonymous memory, counted in RSS).
Elsewhere than glibc (or where the call fails) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Final

log = logging.getLogger(__name__)

# mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
# glibc's ceiling for the mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): blocks up to
# 32 MiB (pull_bytes_max, the largest answer we build) come from the heap.
MMAP_THRESHOLD_BYTES: Final = 32 << 20
# Free memory an arena keeps at its top: a few answers' worth.
TRIM_THRESHOLD_BYTES: Final = 64 << 20


@functools.cache
def keep_large_blocks() -> bool:
    """Set the thresholds (once a process); True when glibc took them."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not ok:
        log.info("malloc thresholds not set: this libc refused them")
    return ok
