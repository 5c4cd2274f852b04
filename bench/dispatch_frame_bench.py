"""What a 1,000-entry dispatch frame costs, built and ready to send (its wire bytes).

    python -m bench.dispatch_frame_bench [--entries 1000]

Paths, each the median of 15 timeit runs (us), with keys (index_svc) and without (cq_svc):

- held:     frame_of_runs over one appended run, as the stream sends it;
- scan:     scan_dispatch over a commit log of those messages, then the frame's bytes;
- cached:   the bytes of a frame the frame cache holds (scanned with keys), as each
            subscriber gets it.

The figures and the machine go in the commit that changes these paths, old against new,
alternated (old, new, old, new) on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import timeit
from collections.abc import Callable
from functools import partial

from commitlog_svc.append_frames import AppendedRun, DispatchProperties, RunSlice
from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from commitlog_svc.dispatch_scan import frame_of_runs, scan_dispatch
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import pack_host
from mqstore.formats.record_batch import MessageBatch

RECORD_BYTES = 200  # about what a message of a 100-byte body and three properties takes
RUNS = 15


def _held(n: int) -> list[RunSlice]:
    run = AppendedRun(
        offsets=[i * RECORD_BYTES for i in range(n)],
        end=n * RECORD_BYTES,
        topics=["topic-a"],
        topic_indexes=None,
        queue_ids=[i % 8 for i in range(n)],
        queue_offsets=list(range(n)),
        sizes=[RECORD_BYTES] * n,
        store_timestamp_ms=1_700_000_000_000,
        sys_flags=[0] * n,
        props=DispatchProperties(
            [12345678] * n, [f"order-{i:08d}" for i in range(n)], [f"{i:032X}" for i in range(n)]
        ),
    )
    return [RunSlice(run, 0, n)]


def _log(n: int) -> CommitLog:
    log = CommitLog(CommitLogConfig.for_tests(tempfile.mkdtemp(), file_bytes=1 << 24))
    log.open()
    messages = [
        MessageBatch(
            topic="topic-a",
            queue_ids=[i % 8],
            bodies=[b"x" * 100],
            properties=[
                encode_properties(
                    {"TAGS": "tagA", "KEYS": f"order-{i:08d}", "UNIQ_KEY": f"{i:032X}"}
                )
            ],
            born_host=pack_host("10.0.0.1", 4242),
            born_timestamp_ms=i,
        )
        for i in range(n)
    ]
    for i in range(0, n, 100):
        if not log.append_batch(messages[i : i + 100]).ok:
            raise RuntimeError("the append failed")
    return log


def _median_us(fn: Callable[[], object]) -> float:
    timer = timeit.Timer(fn)
    calls = max(1, timer.autorange()[0] // 4)
    return statistics.median(timer.timeit(calls) / calls * 1e6 for _ in range(RUNS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1000)
    n = parser.parse_args().entries
    slices = _held(n)
    log = _log(n)

    def scan(keys: bool) -> bytes:
        found = scan_dispatch(log, 0, max_records=n, max_bytes=1 << 30, include_keys=keys)
        if found.entries != n:
            raise RuntimeError(f"scanned {found.entries} of {n} entries")
        return found.wire(keys)

    def held(keys: bool) -> bytes:
        return frame_of_runs(slices, keys).wire

    cached = scan_dispatch(log, 0, max_records=n, max_bytes=1 << 30, include_keys=True)
    for keys in (True, False):
        paths = {"held": held, "scan": scan, "cached": cached.wire}
        for name, path in paths.items():
            label = f"{name}, {'keys' if keys else 'no keys'}"
            fn = partial(path, keys)
            print(f"{label:16} {_median_us(fn):8.1f} us  {len(fn()):7d} bytes")
    log.close()


if __name__ == "__main__":
    main()
