"""Where append-to-visible time goes, by stage: a paced Producer in one process, a long-polling
Consumer in another, against the three real services (mqstore.testing.cluster.start_store).

Each body starts with time.time_ns() at send; the record's store timestamp (ms, stamped by
commitlog_svc at append) splits the latency into send -> stored (the producer's linger and the
Append) and stored -> visible (dispatch, cq_svc's apply and wake-up, the Pull, its Read, the
client's decode). Figures are ms, p50 / p99 over the run. The consumer reads as bench-peers'
does (poll_batch, bodies only) and takes the stages of one message in STAGE_SAMPLE.

    python -m bench.visible_probe [--rate 2000] [--seconds 5] [--size 100] [--runs 1]
                                  [--per-message] [--profile commitlog|cq|index|consumer|producer]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

from bench.meters import CpuMeter, Stopwatch
from bench.peers import pacing
from bench.peers.mqstore_bench import LONG_POLL_MS, prime, scrape, visible_producer
from bench.processes import by_name, pids, settings_of, touch, wait_caught_up, wait_for_file
from bench.profile_services import summarize
from bench.report import percentile
from mqstore.client import ClientSettings, Consumer, Message, Offset
from mqstore.formats.record import fields_without_body
from mqstore.testing.cluster import start_store

GC_PAUSE = "mqstore_gc_pause_seconds"
STAGE_SAMPLE = 8  # one message in 8 has its stages taken
PROFILES_DIR = Path("bench/results/profiles")  # py-spy's raw profiles, kept for a closer look


def _stored_ms(m: Message) -> int:
    """The record's store time, read from the record with the layout's check-free reader (the
    whole field decode of a Message costs the consumer more than the bench's does)."""
    assert m._rest is not None
    return fields_without_body(m._rest).store_timestamp_ms


def _consume(settings: ClientSettings, topic: str, n: int, ready: str) -> dict[str, Any]:
    # Two float arrays, not a list of tuples: objects the collector walks (pacing.Arrivals).
    to_store, to_visible, sent_at = array("d"), array("d"), array("d")
    with Consumer(
        settings, topic, start=Offset(1), max_messages=1000, long_poll_ms=LONG_POLL_MS
    ) as c:
        c.poll(timeout_s=0)
        tmp = f"{ready}.tmp"
        Path(tmp).write_text(str(os.getpid()), encoding="ascii")
        os.replace(tmp, ready)  # ready, and which process to watch
        deadline = time.monotonic() + pacing.READY_TIMEOUT_S + n / 100
        got = 0
        while got < n and time.monotonic() < deadline:
            # As bench-peers' visible consumer reads (poll_batch, bodies only); the store time
            # that splits the stages from one message in STAGE_SAMPLE (a Message made costs
            # the consumer more than the bench's reading does).
            batch = c.poll_batch()
            now_ms = time.time_ns() / 1e6
            for i in range(-got % STAGE_SAMPLE, len(batch), STAGE_SAMPLE):
                sent_ms = pacing.sent_ns(batch.bodies[i]) / 1e6
                stored_ms = _stored_ms(batch[i])
                sent_at.append(sent_ms)
                to_store.append(stored_ms - sent_ms)
                to_visible.append(now_ms - stored_ms)
            got += len(batch)
        pulls = c.stats.pulls
    return {
        "stages": list(zip(to_store, to_visible, strict=True)),
        "sent_ms": list(sent_at),
        "pulls": pulls,
        "received": got,
    }


def _produce(
    settings: ClientSettings,
    topic: str,
    size: int,
    rate: float,
    n: int,
    per_message: bool,
    go: str,
) -> dict[str, Any]:
    """visible_producer once `go` exists (the probe may attach py-spy first), and the CPU its
    process spent (every thread of it)."""
    wait_for_file(go)
    with Stopwatch() as clock:
        sent = visible_producer(settings, topic, size, rate, n, per_message)
    return {**sent, "cpu_s": clock.cpu_s}


def _spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    spy = Path(sys.executable).with_name("py-spy")
    cmd = [str(spy), "record", "--gil", "-r", "200", "--format", "raw", "-o", str(out)]
    proc = subprocess.Popen(
        [*cmd, "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    time.sleep(1.0)  # py-spy attaches
    return proc


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples, every label set."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


def _bucket(text: str, name: str, le: str) -> float:
    """A histogram's count at or under `le`, every other label summed."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and f'le="{le}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _counts(cluster: Any) -> dict[str, float]:
    """Counters that tell the per-message costs from the per-frame and per-request ones, and
    each service's collector pauses (mqstore_gc_pause_seconds): in all, and those over 5 ms."""
    cq = scrape(cluster.followers["cq"].ports["metrics_port"])
    log = scrape(cluster.commitlog.ports["metrics_port"])
    index = scrape(cluster.followers["index"].ports["metrics_port"])
    pauses: dict[str, float] = {}
    for name, text in (("commitlog", log), ("cq", cq), ("index", index)):
        pauses[f"{name} gc ms"] = 1000 * _metric(text, f"{GC_PAUSE}_sum")
        over = _bucket(text, GC_PAUSE, "+Inf") - _bucket(text, GC_PAUSE, "0.005")
        pauses[f"{name} gc pauses > 5 ms"] = over
    return {
        "appended": _metric(log, "mqstore_commitlog_appended_messages_total"),
        "dispatch frames": _metric(log, "mqstore_commitlog_dispatch_frames_total"),
        "cq pulls": _metric(cq, "mqstore_cq_pulls_total"),
        **pauses,
    }


def _other_worker(pool: Any, consumer_pid: int) -> int:
    """The pool's worker that is not the consumer's: the producer's (a pool of two)."""
    (pid,) = [p.pid for p in pool._pool if p.pid != consumer_pid]
    return int(pid)


def _write_series(path: str, sent_ms: list[float], stages: list[tuple[float, float]]) -> None:
    """One line a message: when it was sent (epoch ms), send->stored, stored->visible."""
    with open(path, "w", encoding="ascii") as f:
        f.write("sent_ms,to_store_ms,to_visible_ms\n")
        for at, (a, b) in zip(sent_ms, stages, strict=True):
            f.write(f"{at:.3f},{a:.3f},{b:.3f}\n")


def _show(name: str, values: list[float]) -> str:
    values = sorted(values)
    return f"{name} p50 {percentile(values, 0.5):7.1f}  p99 {percentile(values, 0.99):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--per-message",
        action="store_true",
        help="the producer calls send() for each message, not send_batch() for each tick's",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="a process (commitlog, cq, index, consumer, producer) to record with py-spy --gil",
    )
    parser.add_argument(
        "--no-local-reads",
        action="store_true",
        help="cq_svc without --commitlog-dir: the frames bring records, the tail serves them",
    )
    parser.add_argument(
        "--series",
        default="",
        help="write each message's sent time and its two stages (ms) to this CSV, run by run",
    )
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_store(
            Path(tmp) / "store",
            flush="async",
            local_reads=not args.no_local_reads,
            segment_bytes=None,
        )
        try:
            settings = settings_of(cluster)
            with ctx.Pool(2) as pool:
                for run in range(args.runs):
                    topic = f"probe-{run}"
                    pool.apply(prime, (settings, topic))
                    wait_caught_up(settings)
                    n = int(args.rate * args.seconds)
                    ready = str(Path(tmp) / f"{topic}.ready")
                    got = pool.apply_async(_consume, (settings, topic, n, ready))
                    wait_for_file(ready)
                    go = str(Path(tmp) / f"{topic}.go")
                    sent_async = pool.apply_async(
                        _produce,
                        (settings, topic, args.size, args.rate, n, args.per_message, go),
                    )
                    consumer = int(Path(ready).read_text(encoding="ascii"))
                    processes = {
                        **pids(by_name(cluster)),
                        "consumer": consumer,
                        "producer": _other_worker(pool, consumer),
                    }
                    PROFILES_DIR.mkdir(parents=True, exist_ok=True)
                    spy_out = PROFILES_DIR / f"visible-{args.profile}-{run}.txt"
                    spy = _spy(processes[args.profile], spy_out) if args.profile else None
                    counts_before = _counts(cluster)
                    with CpuMeter(processes) as meter:
                        touch(go)
                        sent = sent_async.get()
                        out = got.get()
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        spy.wait()
                        print(summarize(spy_out, 30))
                    cpu = {
                        k: s / sent["seconds"]
                        for k, s in meter.process_s.items()
                        if k != "producer"
                    }
                    counts = {k: v - counts_before[k] for k, v in _counts(cluster).items()}
                    stages = out["stages"]
                    if args.series:
                        _write_series(f"{args.series}.{run}.csv", out["sent_ms"], stages)
                    total = [a + b for a, b in stages]
                    print(
                        f"rate {args.rate:,.0f} (achieved {sent['achieved']:,.0f}), "
                        f"{out['received']} msgs ({len(stages)} sampled), {out['pulls']} pulls | "
                        + " | ".join(
                            (
                                _show("send->stored", [a for a, _ in stages]),
                                _show("stored->visible", [b for _, b in stages]),
                                _show("total", total),
                            )
                        ),
                        f"mean total {statistics.fmean(total):.1f}",
                    )
                    print(
                        "  cores busy: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
                        + f", producer {sent['cpu_s'] / sent['seconds']:.2f}"
                    )
                    print("  counts: " + ", ".join(f"{k} {v:,.0f}" for k, v in counts.items()))
        finally:
            cluster.stop_all()


if __name__ == "__main__":
    main()
