"""Key-query throughput of the index tier with 1 and with 2 shards (one replica each).

    python -m bench.index_scale_bench [--quick] [--keys N] [--seconds S] [--clients P]
                                      [--threads T] [--dir DIR]

For each shard count: commitlog_svc and one index_svc per shard, as real processes on loopback
(mqstore.testing.cluster, ports 0, data in a temporary directory removed at the end), replicas named
index-0, index-1 with `--shard-from-ordinal` as the StatefulSet runs them. N messages, each
with its own key, are appended through the SDK's Producer and every replica is waited for until
it has applied the log's end. Then P client processes (spawned, so that no client shares a GIL
with another or with the orchestrator) of T threads each ask Admin.query_by_key for random keys
of the loaded set for S seconds; every answer is checked (the one message with that key). The
same key sequence, seeded, is asked of both shard counts.

Printed: queries/s (all clients together), the median latency of one query, and the CPU cores
each index process, the commit log (a query reads its matches from the log to confirm them)
and the clients used over the measured window (bench/meters.py: /proc and the clients' own
clocks), and what everything else on the machine used meanwhile (a noisy neighbour).
The machine is a shared 2-core VM: with 2 shards, two index processes, the commit log and the
clients share those two cores, so the ratio shows what a second shard gives when CPU is the
bound, not what it gives on a cluster where each replica has its own cores. Each index
replica answers only its shard's keys, so a query costs a replica the same in both set-ups: a
second shard spreads the queries (and the index's memory and disk) over two processes.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.meters import CpuMeter, Stopwatch
from bench.processes import by_name, pids, wait_caught_up
from mqstore.client import Admin, ClientSettings, Producer
from mqstore.testing.cluster import Cluster

TOPIC = "IndexScale"
SHARD_COUNTS = (1, 2)
# Index files sized for the run (RocketMQ's 420 MB default file per replica is not needed).
INDEX_ARGS = ["--slot-num", "200000", "--entry-num", "800000"]
CATCH_UP_TIMEOUT_S = 300.0
PRODUCE_RESULT_TIMEOUT_S = 60.0
SEED = 20_261_121


@dataclass(frozen=True)
class Plan:
    keys: int
    seconds: float
    clients: int
    threads: int


FULL = Plan(keys=50_000, seconds=10.0, clients=2, threads=4)
QUICK = Plan(keys=2_000, seconds=1.0, clients=1, threads=2)


@dataclass(frozen=True)
class Result:
    shards: int
    queries: int
    seconds: float
    p50_ms: float
    index_cores: tuple[float, ...]
    commitlog_cores: float  # every query reads its matches from the log to confirm them
    client_cores: float
    # Everything else on the machine meanwhile: a noisy neighbour shows here.
    other_cores: float

    @property
    def per_s(self) -> float:
        return self.queries / self.seconds


def load(settings: ClientSettings, keys: int) -> None:
    with Producer(settings, producer_id="index-scale-bench") as producer:
        futures = [producer.send(TOPIC, f"k{i}".encode(), key=f"k{i}") for i in range(keys)]
        producer.flush()
        for f in futures:
            f.result(timeout=PRODUCE_RESULT_TIMEOUT_S)


def client(
    settings: ClientSettings, keys: int, seconds: float, threads: int, seed: int, start_at: float
) -> tuple[int, list[float], float]:
    """One client process: `threads` threads querying random keys until the window closes.
    Returns (queries answered, latencies in ms, CPU seconds this process spent meanwhile)."""
    import threading  # noqa: PLC0415 - a spawned worker imports what it uses

    admin = Admin(settings)
    admin.query_by_key(TOPIC, "k0")  # discover the shards before the window opens
    counts: list[int] = []
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        rng = random.Random(seed * 1_000 + n)
        done, mine = 0, []
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        while time.time() < end:
            key = f"k{rng.randrange(keys)}"
            t = time.perf_counter()
            found = admin.query_by_key(TOPIC, key, max_messages=4)
            mine.append((time.perf_counter() - t) * 1e3)
            if [m.body for m in found] != [key.encode()]:
                with lock:
                    errors.append(f"query for {key} answered {[m.body for m in found]}")
                return
            done += 1
        with lock:
            counts.append(done)
            latencies.extend(mine)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    while time.time() < start_at:
        time.sleep(0.001)
    with Stopwatch() as clock:
        for t in pool:
            t.join()
    admin.close()
    if errors:
        raise RuntimeError("; ".join(errors[:5]))
    return sum(counts), latencies, clock.cpu_s


def measure(shards: int, plan: Plan, base: Path, ctx: mp.context.SpawnContext) -> Result:
    root = Path(tempfile.mkdtemp(prefix=f"index-scale-{shards}-", dir=base))
    cluster = Cluster(root, flush="async", extra={"index_svc": INDEX_ARGS}, segment_bytes=None)
    try:
        cluster.start_commitlog()
        names = [f"index-{n}" for n in range(shards)]
        for name in names:
            cluster.add(
                "index_svc", name, "--shard-count", str(shards), "--shard-from-ordinal", "true"
            )
            cluster.start(name)
        settings = ClientSettings(
            commitlog=cluster.commitlog.target,
            cq=(),
            index=tuple(cluster.followers[name].target for name in names),
        )
        load(settings, plan.keys)
        wait_caught_up(settings, CATCH_UP_TIMEOUT_S)
        start_at = time.time() + 1.0 + 0.5 * plan.clients  # every client connected by then
        with ctx.Pool(plan.clients) as pool:
            jobs = [
                pool.apply_async(
                    client, (settings, plan.keys, plan.seconds, plan.threads, SEED + c, start_at)
                )
                for c in range(plan.clients)
            ]
            while time.time() < start_at:
                time.sleep(0.001)
            with CpuMeter(pids(by_name(cluster))) as meter:
                answers = [j.get(timeout=plan.seconds + 120) for j in jobs]
        queries = sum(a[0] for a in answers)
        latencies = [x for a in answers for x in a[1]]
        clients_cpu_s = sum(a[2] for a in answers)
        cores = meter.process_cores
        return Result(
            shards=shards,
            queries=queries,
            seconds=plan.seconds,
            p50_ms=statistics.median(latencies) if latencies else float("nan"),
            index_cores=tuple(cores[name] for name in names),
            commitlog_cores=cores["commitlog"],
            client_cores=clients_cpu_s / meter.wall_s,
            other_cores=meter.other_cores(clients_cpu_s),
        )
    finally:
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def table(results: list[Result], plan: Plan) -> str:
    base = results[0].per_s
    lines = [
        f"Key queries through Admin.query_by_key: {plan.keys:,} keys, {plan.clients} client "
        f"process(es) x {plan.threads} threads, {plan.seconds:g} s per shard count "
        f"(python {sys.version.split()[0]}, {os.cpu_count()} cores)",
        "",
        "| shards (1 replica each) | queries/s | vs 1 shard | p50 ms | index cores "
        "| commit-log cores | client cores | other cores |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cores = " + ".join(f"{c:.2f}" for c in r.index_cores)
        lines.append(
            f"| {r.shards} | {r.per_s:,.0f} | {r.per_s / base:.2f}x | {r.p50_ms:.2f} | {cores} "
            f"| {r.commitlog_cores:.2f} | {r.client_cores:.2f} | {r.other_cores:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (small and short)")
    parser.add_argument("--keys", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    plan = Plan(
        keys=args.keys or plan.keys,
        seconds=args.seconds or plan.seconds,
        clients=args.clients or plan.clients,
        threads=args.threads or plan.threads,
    )
    if plan.keys < 1 or plan.seconds <= 0 or plan.clients < 1 or plan.threads < 1:
        parser.error("keys, seconds, clients and threads must be positive")
    base = Path(tempfile.mkdtemp(prefix="index-scale-bench-", dir=args.dir))
    ctx = mp.get_context("spawn")
    try:
        results = [measure(shards, plan, base, ctx) for shards in SHARD_COUNTS]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(table(results, plan), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
