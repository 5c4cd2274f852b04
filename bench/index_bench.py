"""Index engine throughput: keys indexed per second, key queries per second (hit and miss).

    python -m bench.index_bench [--big] [--quick] [--runs R] [--dir DIR]

Workload: dispatch batches of 1,000 messages of one topic, each message with a UNIQ_KEY (a
32-hex-digit id, as producers make them) and one KEYS token ("order-<n>"): two index keys a
message. Sizes: 100,000 keys, and 10,000,000 with --big (--quick divides both by 10: a smoke
run, dominated by creating the first 420 MB file and flushing its slots). Index
files have RocketMQ's default geometry (5,000,000 slots, 20,000,000 entries: 420 MB) on real
files, flushed on the engine's 1 s interval.

- index keys/s: keys / wall time spent in IndexEngine.apply (the batches are built before each
  call's clock starts, as the dispatch stream hands them over), including flushes;
- hit q/s: IndexEngine.query of a random indexed KEYS token over all time, max 32;
- miss q/s: the same for keys never indexed;
- modes: plain, and exact (64-bit hash companion, BLAKE2b per key).

For scale, the same run measures the per-key loop the engine's numpy batch path replaces:
Java hashCode in Python plus RocketMQ's putKey with struct, one key at a time, into a bytearray
(no flush). The machine is shared and noisy: each cell is the median of --runs runs.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from index_svc.config import IndexConfig
from index_svc.engine import TIME_MAX_MS, IndexEngine
from mqstore.dispatch import DispatchEntry
from mqstore.formats.javahash import index_key_hash

BATCH_MESSAGES = 1_000
KEYS_PER_MESSAGE = 2
TOPIC = "bench"
RECORD_BYTES = 200  # a commit-log record's size; only offsets depend on it
QUERY_MAX = 32


def batches(keys: int, seed: int) -> Iterator[list[DispatchEntry]]:
    rng = random.Random(seed)
    messages = keys // KEYS_PER_MESSAGE
    ts = 1_700_000_000_000
    for start in range(0, messages, BATCH_MESSAGES):
        out = []
        for i in range(start, min(messages, start + BATCH_MESSAGES)):
            ts += rng.randint(0, 2)
            out.append(
                DispatchEntry(
                    topic=TOPIC,
                    queue_id=i % 8,
                    queue_offset=i // 8,
                    commit_log_offset=i * RECORD_BYTES,
                    size=RECORD_BYTES,
                    tags_code=0,
                    store_timestamp_ms=ts,
                    keys=f"order-{i}",
                    uniq_key=f"{rng.getrandbits(128):032X}",
                )
            )
        yield out


@dataclass
class Result:
    keys_per_s: float
    hit_per_s: float
    miss_per_s: float
    disk_mb: float


def run_engine(keys: int, *, exact: bool, queries: int, base_dir: str, seed: int) -> Result:
    data_dir = tempfile.mkdtemp(prefix="index-bench-", dir=base_dir)
    try:
        engine = IndexEngine(IndexConfig(data_dir=data_dir, exact=exact))
        engine.open()
        spent = 0.0
        for batch in batches(keys, seed):
            t = time.perf_counter()
            engine.apply(batch)
            spent += time.perf_counter() - t
        t = time.perf_counter()
        engine.flush()
        spent += time.perf_counter() - t
        check = engine.entry_count
        if check != keys:
            raise SystemExit(f"indexed {check} keys, expected {keys}")
        rng = random.Random(seed + 1)
        messages = keys // KEYS_PER_MESSAGE
        hit_keys = [f"order-{rng.randrange(messages)}" for _ in range(queries)]
        miss_keys = [f"absent-{rng.getrandbits(64)}" for _ in range(queries)]

        def timed(keys_to_ask: list[str], expect_hit: bool) -> float:
            t0 = time.perf_counter()
            for k in keys_to_ask:
                found = engine.query(TOPIC, k, 0, TIME_MAX_MS, QUERY_MAX)
                if expect_hit and not found:
                    raise SystemExit(f"indexed key {k} not found")
            return len(keys_to_ask) / (time.perf_counter() - t0)

        hit = timed(hit_keys, True)
        miss = timed(miss_keys, False)
        engine.close()
        index_dir = os.path.join(data_dir, "index")
        disk_bytes = sum(
            os.stat(os.path.join(index_dir, n)).st_blocks * 512 for n in os.listdir(index_dir)
        )
        return Result(keys / spent, hit, miss, disk_bytes / 1e6)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def run_scalar_loop(keys: int, seed: int) -> float:
    """RocketMQ's putKey one key at a time (Python hashCode + struct), for scale."""
    slot_num, entry_num = 5_000_000, keys + 1
    header = struct.Struct(">qqqqii")
    entry = struct.Struct(">iqii")
    slot = struct.Struct(">i")
    buf = bytearray(40 + 4 * slot_num + 20 * entry_num)
    spent = 0.0
    count, used, begin_ts, begin_phy = 1, 0, 0, 0
    for batch in batches(keys, seed):
        t = time.perf_counter()
        for e in batch:
            prefix = e.topic + "#"
            for k in (e.uniq_key, *e.keys.split(" ")):
                h = index_key_hash(prefix + k)
                pos = 40 + (h % slot_num) * 4
                (prev,) = slot.unpack_from(buf, pos)
                if prev <= 0 or prev > count:
                    prev = 0
                    used += 1
                ts = e.store_timestamp_ms
                if count == 1:
                    begin_ts, begin_phy = ts, e.commit_log_offset
                diff = max(0, (ts - begin_ts) // 1000)
                entry.pack_into(
                    buf, 40 + 4 * slot_num + 20 * count, h, e.commit_log_offset, diff, prev
                )
                slot.pack_into(buf, pos, count)
                count += 1
                header.pack_into(buf, 0, begin_ts, ts, begin_phy, e.commit_log_offset, used, count)
        spent += time.perf_counter() - t
    return keys / spent


def _engine_run(seed: int, *, keys: int, exact: bool, queries: int, base_dir: str) -> Result:
    return run_engine(keys, exact=exact, queries=queries, base_dir=base_dir, seed=seed)


def median_of(runs: int, fn: Callable[[int], Result]) -> Result:
    results = [fn(i) for i in range(runs)]
    return Result(
        statistics.median(r.keys_per_s for r in results),
        statistics.median(r.hit_per_s for r in results),
        statistics.median(r.miss_per_s for r in results),
        statistics.median(r.disk_mb for r in results),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", action="store_true", help="also run 10,000,000 keys")
    parser.add_argument("--quick", action="store_true", help="a tenth of every size")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell (the big one: 1)")
    parser.add_argument("--dir", default=None, help="where to put the index files")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    sizes = [100_000 // scale] + ([10_000_000 // scale] if args.big else [])
    queries = 20_000 // scale
    base_dir = args.dir or tempfile.gettempdir()

    rows = []
    for keys in sizes:
        runs = args.runs if keys <= 1_000_000 else 1
        for exact in (False, True):
            result = median_of(
                runs,
                functools.partial(
                    _engine_run, keys=keys, exact=exact, queries=queries, base_dir=base_dir
                ),
            )
            rows.append(("exact" if exact else "plain", keys, result))
        loop_keys = min(keys, 200_000 // scale)
        loop = statistics.median(run_scalar_loop(loop_keys, i) for i in range(runs))
        rows.append(("per-key loop", loop_keys, Result(loop, 0.0, 0.0, 0.0)))

    print(f"index engine, batches of {BATCH_MESSAGES} messages x {KEYS_PER_MESSAGE} keys")
    print(f"{'mode':<14}{'keys':>12}{'index keys/s':>15}{'hit q/s':>11}{'miss q/s':>11}{'MB':>8}")
    for mode, keys, r in rows:
        hit = f"{r.hit_per_s:,.0f}" if r.hit_per_s else "-"
        miss = f"{r.miss_per_s:,.0f}" if r.miss_per_s else "-"
        mb = f"{r.disk_mb:,.0f}" if r.disk_mb else "-"
        print(f"{mode:<14}{keys:>12,}{r.keys_per_s:>15,.0f}{hit:>11}{miss:>11}{mb:>8}")


if __name__ == "__main__":
    main()
