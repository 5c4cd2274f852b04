"""Where each service spends its time under a workload: CPU per message, and py-spy profiles.

    python -m bench.profile_services produce|send|consume|poll [--size 100] [--messages 200000]
                                     [--flush async|sync] [--profile commitlog,cq,index,client]
                                     [--out DIR] [--top 25]

Starts the three services (mqstore/testing/cluster.py, the same settings as `make bench-peers`),
runs one workload from this process through the SDK, and prints the rate and the CPU seconds
each process used (bench/meters.py, from /proc, so the figures are per message and hold on a
noisy machine better than rates do). With --profile, py-spy (`--gil`: samples only the thread
holding the GIL, i.e. Python work) records the named processes during the workload; each
profile is written to DIR/<workload>-<process>.txt (py-spy's raw format) and summarised: the
frames with the most samples, inclusive and self. Every issue 8 change started from such a profile.

- produce: `Producer.send_batch` of 1,000 messages (4 queues round robin), then flush.
- send: `Producer.send` of each message (what append-to-visible's producer does), then flush.
- consume: the topic produced first (off the clock), then read back from offset 0 with
  `Consumer.messages(follow=False)`, every body touched.
- poll: the same read with `Consumer.poll_batch()` (columns, no Message made).

py-spy comes with the bench extra (`pip install -e '.[bench]'`, or `make bench-peers` once).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.meters import CpuMeter, context_switches, proc_split_s
from bench.processes import INDEX_DEFAULT_ARGS, by_name, pids, settings_of, wait_caught_up
from mqstore.client import ClientSettings, Consumer, Producer
from mqstore.testing.cluster import start_store

BATCH = 1_000
PROFILE_RATE_HZ = 250
PY_SPY_START_S = 0.5  # py-spy attaches before the clock starts
WARM_UP_MESSAGES = 20_000


def _produce(settings: ClientSettings, topic: str, size: int, n: int) -> None:
    bodies = [os.urandom(size)] * BATCH
    with Producer(settings, batch_messages=BATCH, batch_bytes=4 << 20) as producer:
        futures = [
            producer.send_batch(topic, bodies[: min(BATCH, n - i)]) for i in range(0, n, BATCH)
        ]
        producer.flush()
    for f in futures:
        f.result()


def _send(settings: ClientSettings, topic: str, size: int, n: int) -> None:
    body = os.urandom(size)
    with Producer(settings, batch_messages=BATCH, batch_bytes=4 << 20) as producer:
        futures = [producer.send(topic, body) for _ in range(n)]
        producer.flush()
    for f in futures:
        f.result()


def _consume(settings: ClientSettings, topic: str, n: int) -> None:
    count = 0
    with Consumer(settings, topic, start="earliest", max_messages=BATCH, long_poll_ms=0) as c:
        for message in c.messages(follow=False):
            count += len(message.body) > -1
    if count != n:
        raise RuntimeError(f"consumed {count} of {n}")


def _poll(settings: ClientSettings, topic: str, n: int) -> None:
    count = 0
    with Consumer(settings, topic, start="earliest", max_messages=BATCH, long_poll_ms=0) as c:
        while count < n:
            bodies = c.poll_batch(timeout_s=0).bodies
            if not bodies:
                break
            count += len(bodies)
            sum(map(len, bodies))
    if count != n:
        raise RuntimeError(f"polled {count} of {n}")


def summarize(path: Path, top: int) -> str:
    """The frames of a py-spy raw profile with the most samples: inclusive and self."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [
            re.sub(r" \((?:/[^)]*/site-packages/|[^)]*?/(?=[a-z_]+/))?", " (", f)
            for f in stack.split(";")
        ]
        for frame in set(frames):
            inclusive[frame] += n
        own[frames[-1]] += n
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} samples", "  inclusive:"]
    lines += [f"    {100 * n / total:5.1f}% {f}" for f, n in inclusive.most_common(top)]
    lines.append("  self:")
    lines += [f"    {100 * n / total:5.1f}% {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("produce", "send", "consume", "poll"))
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    parser.add_argument("--profile", default="", help="processes to profile, comma separated")
    parser.add_argument("--out", type=Path, default=Path("bench/results/profiles"))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--no-local-reads",
        action="store_true",
        help="cq_svc fetches records with the commit log's Read, not from the segment files",
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mqstore-profile-"))
    cluster = start_store(
        root,
        flush=args.flush,
        extra={"index_svc": INDEX_DEFAULT_ARGS},
        local_reads=not args.no_local_reads,
        segment_bytes=None,
    )
    profilers: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        settings = settings_of(cluster)
        topic = f"profile-{args.size}"
        # Off the clock: the first segment's pages and every connection warmed up.
        _produce(settings, f"{topic}-warm-up", args.size, WARM_UP_MESSAGES)
        reads = args.workload in ("consume", "poll")
        if reads:
            _produce(settings, topic, args.size, args.messages)
        wait_caught_up(settings)
        processes = {**pids(by_name(cluster)), "client": os.getpid()}
        spy = Path(sys.executable).with_name("py-spy")
        for name in filter(None, args.profile.split(",")):
            if name not in processes:
                parser.error(f"--profile: {name!r} is not one of {', '.join(processes)}")
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"{args.workload}-{name}.txt"
            cmd = [str(spy), "record", "--gil", "-r", str(PROFILE_RATE_HZ), "--format", "raw"]
            cmd += ["-o", str(path), "-p", str(processes[name])]
            profilers.append(
                (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), path)
            )
        if profilers:
            time.sleep(PY_SPY_START_S)
        switches = {name: context_switches(pid) for name, pid in processes.items()}
        kernel_s = {name: proc_split_s(pid)[1] for name, pid in processes.items()}
        with CpuMeter(processes) as meter:
            began = time.perf_counter()
            if args.workload == "produce":
                _produce(settings, topic, args.size, args.messages)
            elif args.workload == "send":
                _send(settings, topic, args.size, args.messages)
            elif args.workload == "poll":
                _poll(settings, topic, args.messages)
            else:
                _consume(settings, topic, args.messages)
            took = time.perf_counter() - began
            if not reads:
                wait_caught_up(settings)  # the followers' share of the work counts too
        used = meter.process_s
        switches = {name: context_switches(pid) - switches[name] for name, pid in processes.items()}
        kernel_s = {name: proc_split_s(pid)[1] - kernel_s[name] for name, pid in processes.items()}
    finally:
        for proc, _ in profilers:
            proc.send_signal(signal.SIGINT)
        for proc, _ in profilers:
            proc.wait()
        cluster.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    n = args.messages
    print(f"{args.workload}, {args.size} B, flush {args.flush}: {n / took:,.0f} msg/s")
    for name, seconds in used.items():
        print(
            f"  {name:10} {seconds:6.2f} CPU-s  {seconds / n * 1e6:5.2f} us a message"
            f"  ({kernel_s[name] / n * 1e6:4.2f} in the kernel)"
            f"  {switches[name] / n * BATCH:6.1f} context switches per {BATCH:,} messages"
        )
    for _, path in profilers:
        if path.exists():
            print(summarize(path, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
