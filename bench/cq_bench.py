"""Consume-queue engine benchmark: file store vs RocksDB store.

    python -m bench.cq_bench                 # 1, 1,000 and 100,000 queues
    python -m bench.cq_bench --quick         # 1, 100 and 2,000 queues, fewer units
    python -m bench.cq_bench --million       # also: RocksDB with 1,000,000 queues, memory
    python -m bench.cq_bench --queues 1,2000 --units 20000 --apply-only   # docs/cq.md's A/B

What is measured, per store and queue count (real files under a temporary directory):
- apply: units applied per second, dispatch batches of 1,024 entries spread over the queues,
  each given to put_columns as columns built before the clock starts (what the sink hands it);
- pull32 / pull1000: pull decisions per second (the engine's part of a pull: range checks and
  the unit scan; message bytes are the commit log's) of up to 32 and 1,000 units;
- time: offset-for-timestamp lookups per second (LOWER and UPPER alternately);
- the million-queue run: RocksDB with 1,000,000 queues of 3 entries each, with resident memory
  (VmRSS) before and after, showing that per-queue state stays bounded.

The file store runs with 1,000-unit files here (RocketMQ's 300,000 would preallocate 6 MB per
queue: 600 GB at 100,000 queues). Figures are single-threaded, on whatever this machine is.
"""

from __future__ import annotations

import argparse
import gc
import math
import pathlib
import random
import shutil
import tempfile
import time
from collections.abc import Callable

from bench.meters import status_kib
from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import make_store
from cq_svc.store import CqStore, put_entries
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.formats.cq_time import Boundary

BATCH = 1024
UNITS_PER_FILE = 1000


def rss_mb() -> float:
    return status_kib("self").get("VmRSS", math.nan) / 1024


def make_entries(
    queues: int, units: int, *, time_base: int = 1_700_000_000_000
) -> list[DispatchEntry]:
    """`units` entries round-robin over `queues` queues of 8 topics, in commit-log order."""
    out = []
    next_qo = [0] * queues
    phy = 0
    for i in range(units):
        q = i % queues
        out.append(
            DispatchEntry(
                topic=f"Topic{q % 8}",
                queue_id=q,
                queue_offset=next_qo[q],
                commit_log_offset=phy,
                size=200,
                tags_code=q % 5,
                store_timestamp_ms=time_base + i // 10,
            )
        )
        next_qo[q] += 1
        phy += 200
    return out


def timed(fn: Callable[[], int]) -> float:
    """Operations per second of one call of `fn` that returns its operation count."""
    start = time.perf_counter()
    ops = fn()
    return ops / max(time.perf_counter() - start, 1e-9)


def run_case(
    kind: StoreKind,
    queues: int,
    units: int,
    probes: int,
    *,
    apply_only: bool = False,
    warm: bool = False,
) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="cq_bench_")
    try:
        config = CqConfig(
            data_dir=root,
            cq_store=kind,
            units_per_file=UNITS_PER_FILE,
            max_filter_bytes=1000 * 20,
        )
        store: CqStore = make_store(config)
        store.open()
        batch = make_entries(queues, units)
        first = queues if warm else 0
        if warm:  # every queue made (its files created) before the clock starts
            store.put_columns(DispatchColumns.from_entries(batch[:first]))
        frames = [
            DispatchColumns.from_entries(batch[i : i + BATCH]) for i in range(first, units, BATCH)
        ]

        def apply() -> int:
            for frame in frames:
                store.put_columns(frame)
            store.flush()
            return sum(len(frame) for frame in frames)

        result = {"apply": timed(apply)}
        if apply_only:
            store.close()
            return result | {"pull32": math.nan, "pull1000": math.nan, "time": math.nan}
        rng = random.Random(1)
        per_queue = max(1, units // queues)
        keys = [(f"Topic{q % 8}", q) for q in range(queues)]

        def pulls(n: int) -> Callable[[], int]:
            def go() -> int:
                for _ in range(probes):
                    topic, q = rng.choice(keys)
                    store.pull(topic, q, rng.randrange(per_queue), n, 1 << 30)
                return probes

            return go

        result["pull32"] = timed(pulls(32))
        result["pull1000"] = timed(pulls(1000))
        t0 = batch[0].store_timestamp_ms
        t1 = batch[-1].store_timestamp_ms

        def lookups() -> int:
            for i in range(probes):
                topic, q = rng.choice(keys)
                b = Boundary.LOWER if i % 2 else Boundary.UPPER
                store.get_offset_by_time(topic, q, rng.randint(t0, t1), b)
            return probes

        result["time"] = timed(lookups)
        store.close()
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def million(queues: int, per_queue: int) -> None:
    root = tempfile.mkdtemp(prefix="cq_bench_million_")
    try:
        config = CqConfig(data_dir=root, cq_store=StoreKind.ROCKSDB)
        store = make_store(config)
        store.open()
        gc.collect()
        before = rss_mb()
        started = time.perf_counter()
        phy = 0
        chunk_queues = 20_000
        checkpoints: list[str] = []
        for q0 in range(0, queues, chunk_queues):
            entries = []
            for r in range(per_queue):
                for q in range(q0, min(queues, q0 + chunk_queues)):
                    entries.append(
                        DispatchEntry(f"T{q % 64}", q, r, phy, 100, 0, 1_700_000_000_000 + r)
                    )
                    phy += 100
            for i in range(0, len(entries), 4096):
                put_entries(store, entries[i : i + 4096])
            done = min(queues, q0 + chunk_queues)
            if done % (queues // 5) == 0:
                checkpoints.append(f"{done:,} queues: {rss_mb():.0f} MB")
        store.flush()
        elapsed = time.perf_counter() - started
        gc.collect()
        after = rss_mb()
        rng = random.Random(2)
        sample = [rng.randrange(queues) for _ in range(2000)]
        ok = all(store.max_offset(f"T{q % 64}", q) == per_queue for q in sample)
        store.close()
        du = sum(f.stat().st_size for f in pathlib.Path(root).rglob("*") if f.is_file())
        print(
            f"\nRocksDB, {queues:,} queues x {per_queue} units: applied in {elapsed:.1f} s "
            f"({queues * per_queue / elapsed:,.0f} units/s); RSS {before:.0f} MB -> {after:.0f} MB "
            f"(+{after - before:.0f} MB); on disk {du / 1e6:.0f} MB; sample max offsets ok: {ok}"
        )
        print("RSS while applying: " + ", ".join(checkpoints))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scaled down (seconds, not minutes)")
    parser.add_argument("--million", action="store_true", help="RocksDB with 1,000,000 queues")
    parser.add_argument("--stores", default="file,rocksdb")
    parser.add_argument("--queues", help="queue counts, e.g. 1,2000 (instead of the presets)")
    parser.add_argument("--units", type=int, default=20_000, help="units per case with --queues")
    parser.add_argument("--apply-only", action="store_true", help="measure applying only")
    parser.add_argument("--warm", action="store_true", help="create the queues before timing")
    args = parser.parse_args()
    if args.queues:
        cases = [(int(q), args.units) for q in args.queues.split(",")]
        probes = 2_000
    elif args.quick:
        cases = [(1, 20_000), (100, 20_000), (2_000, 20_000)]
        probes = 2_000
    else:
        cases = [(1, 200_000), (1_000, 200_000), (100_000, 200_000)]
        probes = 10_000
    kinds = [StoreKind(k) for k in args.stores.split(",")]
    print(
        f"{'store':8} {'queues':>8} {'units':>8} {'apply/s':>10} {'pull32/s':>10} "
        f"{'pull1000/s':>11} {'time/s':>9}"
    )
    for queues, units in cases:
        for kind in kinds:
            r = run_case(kind, queues, units, probes, apply_only=args.apply_only, warm=args.warm)
            print(
                f"{kind.value:8} {queues:>8,} {units:>8,} {r['apply']:>10,.0f} "
                f"{r['pull32']:>10,.0f} {r['pull1000']:>11,.0f} {r['time']:>9,.0f}",
                flush=True,
            )
    if args.million:
        million(1_000_000 if not args.quick else 100_000, 3)


if __name__ == "__main__":
    main()
