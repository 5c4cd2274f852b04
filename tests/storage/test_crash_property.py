"""Property: whatever the appends and flushes, a crash leaves exactly the flushed prefix.

For random sequences of appends and flushes (with random least_pages) on a SimDisk, crash, then
reload a MappedFileQueue on the same SimDisk:
- crash(drop): the recovered bytes are the flushed prefix followed by zeros;
- crash(random): the flushed prefix survives up to the last 512-byte sector boundary below it
  (a garbled sector may be rewritten whole, including flushed bytes that share it);
- every file that was created is there (create() makes names durable).
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore.storage.mapped_file_queue import MappedFileQueue
from mqstore.storage.simdisk import SECTOR_BYTES, SimDisk

from .helpers import PAGE, append_stream, pattern, queue_bytes

DIR = "/store/q"

# Sizes around page and sector boundaries as well as arbitrary ones; hypothesis alone favours
# tiny values, which would rarely cross a file.
append_sizes = st.one_of(
    st.integers(min_value=1, max_value=64),
    st.integers(min_value=PAGE - 64, max_value=PAGE + 64),
    st.integers(min_value=1, max_value=3 * PAGE),
)
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("append"), append_sizes),
        st.tuples(st.just("flush"), st.integers(min_value=0, max_value=3)),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=100,
    deadline=None,
    database=None,  # keep the run free of files outside tmp dirs
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    file_size=st.sampled_from([1024, PAGE, 3 * PAGE]),
    ops=ops_strategy,
    mode=st.sampled_from(["drop", "random"]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_recovered_bytes_are_the_flushed_prefix(
    file_size: int, ops: list[tuple[str, int]], mode: str, seed: int
) -> None:
    disk = SimDisk()
    queue = MappedFileQueue(disk, DIR, file_size)
    queue.load()
    written = b""
    for i, (op, arg) in enumerate(ops):
        if op == "append":
            chunk = pattern(arg, seed=i)
            append_stream(queue, chunk)
            written += chunk
        else:
            queue.flush(arg)
    flushed = queue.flushed_where
    assert flushed <= len(written)
    files_created = len(queue.files)

    disk.crash(random.Random(seed), mode="drop" if mode == "drop" else "random")
    after = MappedFileQueue(disk, DIR, file_size)
    after.load()
    assert len(after.files) == files_created
    recovered = queue_bytes(after)
    assert len(recovered) == files_created * file_size
    if mode == "drop":
        assert recovered == written[:flushed] + bytes(len(recovered) - flushed)
    else:
        safe = flushed - flushed % SECTOR_BYTES
        assert recovered[:safe] == written[:safe]
