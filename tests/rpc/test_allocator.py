"""mqstore.rpc.allocator: after keep_large_blocks a megabyte buffer comes from the heap, not
from an mmap of its own (glibc's mallinfo2 counts those as hblks). Each case runs in a fresh
interpreter: the thresholds are process-wide and glibc moves its own as blocks are freed."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

_PROBE = """
import ctypes, sys
from mqstore.rpc.allocator import keep_large_blocks

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert keep_large_blocks() is True
    assert keep_large_blocks() is True  # once a process; asking again is harmless
elif sys.argv[1].startswith("client"):  # the SDK sets them for the process it runs in
    from mqstore.client import ClientSettings
    from mqstore.client.connection import Connection
    Connection(ClientSettings("127.0.0.1:1", (), (), keep_large_blocks=sys.argv[1] == "client"))
before = libc.mallinfo2().hblks
buffer = bytearray(4 << 20)  # a fresh 4 MiB block, as a serialized answer is
print(libc.mallinfo2().hblks - before)
"""


def _mmapped_blocks_while_held(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def test_a_large_block_comes_from_the_heap_once_kept() -> None:
    assert ctypes.util.find_library("c")
    assert _mmapped_blocks_while_held("default") == 1  # glibc's default: an mmap of its own
    assert _mmapped_blocks_while_held("keep") == 0


def test_a_client_keeps_large_blocks_unless_told_not_to() -> None:
    assert _mmapped_blocks_while_held("client") == 0
    assert _mmapped_blocks_while_held("client-off") == 1
