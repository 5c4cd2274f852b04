"""End-to-end benchmark over gRPC: the three services as real processes, clients in their own.

    python -m bench.e2e_bench [--quick] [--runs N] [--flush sync|async|both] [--dir DIR]
                              [--doc PATH | --no-doc] [--samples-dir DIR]

For each flush mode (sync, then async): first commitlog_svc alone (no subscribers), for the
produce reference; then a fresh store of commitlog_svc with `--flush`, one cq_svc and one
index_svc following it (mqstore.testing.cluster.Cluster, ports 0, data in a temporary
directory, logs to files there), each with its default settings, as `make run` starts them.
Every service is stopped with SIGTERM at the end, whatever happened. The clients run in the
worker processes of a spawn-based pool, never in a service's or the orchestrator's process.

What is measured, per flush mode, in this order:
- produce: columnar batches (one topic, 1,000 messages a batch, queue ids over 8 queues, bodies
  of 100 B and 1 KiB, properties holding a UNIQ_KEY made by the producer), built before the
  clock starts, sent with unary Append (UNARY_IN_FLIGHT calls in flight through futures) and
  with AppendStream (STREAM_WINDOW requests in flight). msg/s, median (min-max) of --runs runs,
  the runs of every variant interleaved, each run starting with the followers caught up; next
  to the same with the commit log alone, measured just before (the cost of dispatch shows).
- consume by offset: every queue of a produced topic pulled from offset 0 with max_messages
  1,000 to its end, each record decoded as a consumer must (read_record with its CRC check,
  then the properties map); one Pull in flight, and one per queue (8 threads).
- peak load and dispatch lag: AppendStream of 100 B batches at full speed for a while, the
  orchestrator sampling every SAMPLE_INTERVAL_S the commit log's GetStatus (each subscriber's
  lag_bytes / lag_ms, measured to its *confirmed* offset: applied, flushed and reported) and
  each follower's GetStatus (applied_offset: what a Pull or a query can already see). Reported:
  the rate sustained; per follower the max and final (when the producer stops) of both lags;
  whether the applied lag is bounded (its least-squares slope over the second half of the
  phase, against the write rate); how long the followers take to apply everything after.
- append-to-visible: 8 consumer threads long-poll (Pull with long_poll_ms) at the end of the 8
  queues of a fresh topic while a producer sends unary Append batches of 100 B paced at half,
  and then a quarter, of the rate the peak-load phase sustained. Each body starts with
  time.time_ns() read just before its Append; a message's latency is its arrival at the
  consumer minus that (both clients on this machine, one clock). p50 / p99 / max over every
  message, and the p50 of the first and last fifth sent: a load the system cannot sustain
  shows as latency growing through the run (flagged SATURATED).
- time lookup: GetOffsetByTime at random timestamps within the peak phase's topic (LOWER and
  UPPER alternately), interleaved with the bare round trips it is to be read against:
  GetQueueInfo on the same server and channel, and the health Check on the health port.

CPU: for every phase, the cores used by the client process(es), each service, and everything
else on the machine (from /proc: total busy time minus ours), so that a saturated process shows
at ~1.0 and "other" flags a noisy neighbour. The meter starts when the client is connected with
its requests built (Gate), so it covers the measured window.

The machine is a shared 2-core VM: clients and the three services share those 2 cores, so the
figures are whole-system ones, and only ratios within one run mean much. The markdown table
goes into --doc (default docs/bench.md, between the DOC_BEGIN / DOC_END markers; not with
--quick unless --doc is given); the prose around it is kept.

This module is the orchestration: the store, the phases in order, the table's rows. The clients
are in bench/e2e_clients.py, the dispatch-lag sampler in bench/lag.py, the CPU meter in
bench/meters.py, the table and doc forms in bench/report.py, the handshakes with the clients
and the disk guard in bench/processes.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import grpc

from bench.e2e_clients import (
    BATCH,
    CALL_TIMEOUT_S,
    PULL_MAX,
    QUEUES,
    STREAM_WINDOW,
    UNARY_IN_FLIGHT,
    consume,
    lookups,
    paced_producer,
    produce,
    produce_for,
    visible_consumer,
)
from bench.lag import LagSample, Sampler, applied_lag, mean_between, slope, write_samples
from bench.meters import CpuMeter
from bench.processes import (
    Gate,
    allocated_bytes,
    by_package,
    disk_guard,
    pids,
    wait_for_client,
)
from bench.report import (
    markdown_table,
    median_range,
    size_name,
    text_table,
    versions,
    versions_markdown,
    write_doc_block,
)
from mqstore.launcher import ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as cl_grpc
from mqstore.testing.cluster import Cluster

# Append-to-visible load, as shares of the rate the peak-load phase sustained: half (the issue's
# figure) and a quarter, in case half is more than producer and consumers sustain at once.
VISIBLE_SHARES = (0.5, 0.25)
READY_TIMEOUT_S = 120.0
GATE_TIMEOUT_S = 300.0
BODIES = (100, 1024)
DOC_BEGIN = "<!-- e2e_bench:begin (generated by python -m bench.e2e_bench) -->"
DOC_END = "<!-- e2e_bench:end -->"


@dataclass(frozen=True)
class Scale:
    produce_messages: int  # per produce run
    runs: int
    visible_s: float  # append-to-visible phase
    peak_s: float  # dispatch lag phase
    lookups: int  # of each kind (time lookup, GetQueueInfo, health Check)


FULL = Scale(produce_messages=100_000, runs=3, visible_s=10.0, peak_s=20.0, lookups=2000)
QUICK = Scale(produce_messages=20_000, runs=1, visible_s=2.0, peak_s=3.0, lookups=200)


# -- the store ---------------------------------------------------------------------------------

# The followers' names in the Cluster (data directory and subscriber id), by package.
FOLLOWERS = {"cq_svc": "cq", "index_svc": "index"}


class Store:
    """commitlog_svc, cq_svc and index_svc as processes under `root` (a Cluster), default
    settings (but for `log_args`, see disk_guard); cq_svc reads records through the commit
    log's Read."""

    def __init__(self, root: Path, flush: str, log_args: list[str] | None = None) -> None:
        self.root = root
        self.cluster = Cluster(
            root,
            flush=flush,
            extra={"commitlog_svc": list(log_args or [])},
            local_reads=False,
            ready_timeout_s=READY_TIMEOUT_S,
            segment_bytes=None,
        )
        self.log = self.cluster.commitlog
        self.channels: list[grpc.Channel] = []

    def start(self, *, followers: bool = True) -> None:
        self.cluster.start_commitlog()
        for package, name in FOLLOWERS.items() if followers else ():
            self.cluster.add(package, name)
            self.cluster.start(name)

    def stop(self) -> dict[str, int]:
        for channel in self.channels:
            channel.close()
        return self.cluster.stop_all()

    @property
    def services(self) -> dict[str, ServiceProcess]:
        """By package: commitlog_svc, and cq_svc and index_svc once started."""
        return by_package(self.cluster)

    @property
    def followers(self) -> dict[str, ServiceProcess]:
        return {k: v for k, v in self.services.items() if k != "commitlog_svc"}

    @property
    def pids(self) -> dict[str, int]:
        return pids(self.services)

    def check_running(self) -> None:
        for name, service in self.services.items():
            if not service.running:
                raise RuntimeError(f"{name} exited; see {service.log_path}")

    def channel(self, target: str) -> grpc.Channel:
        channel = make_channel(target)
        self.channels.append(channel)
        return channel

    def sampler(self) -> Sampler:
        """A dispatch-lag sampler of this store (its followers started)."""
        followers = self.followers
        return Sampler(
            self.channel(self.log.target),
            self.channel(followers["cq_svc"].target),
            self.channel(followers["index_svc"].target),
        )


# -- the table ---------------------------------------------------------------------------------


@dataclass
class Row:
    flush: str
    what: str
    body: str
    figure: str
    note: str
    cores: dict[str, float] = field(default_factory=dict)


def _cores_text(cores: dict[str, float]) -> str:
    if not cores:
        return ""
    order = ("client", "commitlog_svc", "cq_svc", "index_svc", "other")
    return " · ".join(f"{cores.get(k, 0):.2f}" for k in order)


def _median_cores(all_cores: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(c[k] for c in all_cores) for k in all_cores[0]}


HEADERS = ("flush", "measurement", "body", "result", "reads against / detail", "cores")
CORES_NOTE = "cores: client · commitlog_svc · cq_svc · index_svc · other processes"


def _cells(rows: list[Row]) -> list[tuple[str, ...]]:
    return [(r.flush, r.what, r.body, r.figure, r.note, _cores_text(r.cores)) for r in rows]


def render_text(rows: list[Row]) -> str:
    return text_table(HEADERS, _cells(rows)) + f"\n{CORES_NOTE}"


def render_markdown(rows: list[Row]) -> str:
    table = markdown_table(HEADERS, _cells(rows))
    return f"{table}\n\n{CORES_NOTE} (each in cores of the 2, over the phase)."


# -- the phases --------------------------------------------------------------------------------


@contextmanager
def _progress(flush: str, phase: str) -> Iterator[None]:
    began = time.perf_counter()
    yield
    print(f"   {flush}: {phase} took {time.perf_counter() - began:.1f} s", flush=True)


# (body bytes, method) -> (msg/s, cores) of each run
ProduceRuns = dict[tuple[int, str], list[tuple[float, dict[str, float]]]]


@dataclass
class Bench:
    scale: Scale
    pool: ProcessPoolExecutor
    root: Path
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gates: int = 0
    samples_dir: Path | None = None
    log_args: list[str] = field(default_factory=list)

    def run_flush_mode(self, flush: str) -> None:
        # First the commit log alone (no subscribers): what produce costs without dispatch,
        # the reference the end-to-end produce figures are read against.
        alone = Store(self.root / f"{flush}-alone", flush, self.log_args)
        try:
            alone.start(followers=False)
            with _progress(flush, "produce, commit log alone"):
                alone_rates = self._produce_runs(alone, None)
        finally:
            self._stop(alone, flush)
        store = Store(self.root / flush, flush, self.log_args)
        try:
            store.start()
            self._phases(store, flush, alone_rates)
        finally:
            self._stop(store, flush)

    def _stop(self, store: Store, flush: str) -> None:
        codes = store.stop()
        if any(codes.values()):
            self.notes.append(f"{flush}: exit codes after SIGTERM {codes}")
        used_gb = allocated_bytes(store.root) / (1 << 30)
        print(
            f"   {flush}: the store under {store.root} took {used_gb:.1f} GiB of disk", flush=True
        )
        for name in ("commitlog", *FOLLOWERS.values()):
            shutil.rmtree(store.root / name, ignore_errors=True)

    def _gate(self) -> Gate:
        self.gates += 1
        base = self.root / f"gate-{self.gates}"
        return Gate(f"{base}.ready", f"{base}.go", GATE_TIMEOUT_S)

    def _measure(self, store: Store, fn: Callable[..., Any], *args: Any) -> tuple[Any, CpuMeter]:
        gate = self._gate()
        client = self.pool.submit(fn, *args, gate)
        wait_for_client(gate.ready, client)
        with CpuMeter(store.pids) as meter:
            gate.open()
            result = client.result()
        store.check_running()
        return result, meter

    def _phases(self, store: Store, flush: str, alone: ProduceRuns) -> None:
        sampler = store.sampler()
        with _progress(flush, "produce"):
            self._produce(store, flush, sampler, alone)
            sampler.wait_caught_up()
        with _progress(flush, "consume"):
            self._consume(store, flush)
        with _progress(flush, "peak load"):
            peak_rate, ts_range = self._peak(store, flush)
        with _progress(flush, "append-to-visible"):
            for share in VISIBLE_SHARES:
                self._visible(store, flush, peak_rate, share, sampler)
        with _progress(flush, "time lookups"):
            self._lookups(store, flush, ts_range)

    def _produce_runs(self, store: Store, sampler: Sampler | None) -> ProduceRuns:
        """Every (body, method) run, interleaved: rate and cores of each."""
        n = self.scale.produce_messages
        results: ProduceRuns = {}
        for run in range(self.scale.runs):
            for body_bytes in BODIES:
                for method in ("unary", "stream"):
                    topic = f"p{body_bytes}-{method}-{run}"
                    got, meter = self._measure(
                        store, produce, store.log.target, topic, body_bytes, n, method
                    )
                    if got["refused"] or got["stored"] != n // BATCH * BATCH:
                        raise RuntimeError(f"{topic}: {got}")
                    results.setdefault((body_bytes, method), []).append(
                        (got["stored"] / got["seconds"], meter.cores(got["client_cpu_s"]))
                    )
                    if sampler is not None:
                        # Each run starts with followers caught up: no backlog from the last.
                        sampler.wait_caught_up()
        return results

    def _produce(self, store: Store, flush: str, sampler: Sampler, alone: ProduceRuns) -> None:
        n = self.scale.produce_messages
        results = self._produce_runs(store, sampler)
        for body_bytes in BODIES:
            for method, label in (
                ("unary", f"produce: Append, {UNARY_IN_FLIGHT} in flight"),
                ("stream", f"produce: AppendStream, window {STREAM_WINDOW}"),
            ):
                got_runs = results[(body_bytes, method)]
                rates = [r for r, _ in got_runs]
                alone_rate = statistics.median(r for r, _ in alone[(body_bytes, method)])
                mb = statistics.median(rates) * body_bytes / 1e6
                self.rows.append(
                    Row(
                        flush,
                        label,
                        size_name(body_bytes),
                        f"{median_range(rates)} msg/s",
                        f"{statistics.median(rates) / alone_rate:.2f} of the commit log alone "
                        f"({alone_rate:,.0f} msg/s, no subscribers); {mb:.1f} MB/s of bodies; "
                        f"{n:,} msgs a run, median of {len(rates)}",
                        _median_cores([c for _, c in got_runs]),
                    )
                )

    def _consume(self, store: Store, flush: str) -> None:
        n = self.scale.produce_messages // BATCH * BATCH
        cq_target = store.followers["cq_svc"].target
        for body_bytes in BODIES:
            for threads, label in ((1, "1 Pull in flight"), (QUEUES, "8 in flight")):
                rates, cores = [], []
                for run in range(self.scale.runs):
                    topic = f"p{body_bytes}-stream-{run}"
                    got, meter = self._measure(store, consume, cq_target, topic, n, threads)
                    rates.append(got["messages"] / got["seconds"])
                    cores.append(meter.cores(got["client_cpu_s"]))
                mb = statistics.median(rates) * body_bytes / 1e6
                self.rows.append(
                    Row(
                        flush,
                        f"consume by offset: Pull x{PULL_MAX}, {label}",
                        size_name(body_bytes),
                        f"{median_range(rates)} msg/s",
                        f"{mb:.1f} MB/s; 8 queues from 0, records decoded",
                        _median_cores(cores),
                    )
                )

    def _visible(
        self, store: Store, flush: str, peak: float, share: float, sampler: Sampler
    ) -> None:
        rate = peak * share
        topic = f"visible-{round(share * 100)}"
        # The queues must exist before a long poll waits on them (an unknown queue is answered
        # at once): one message in each, seen by cq_svc, before the consumer starts.
        log = cl_grpc.CommitLogStub(store.channel(store.log.target))
        primer = cl.MessageBatch(
            topic=topic, queue_ids=list(range(QUEUES)), bodies=[b"\0" * 8] * QUEUES
        )
        log.Append(cl.AppendRequest(batches=[primer]), timeout=CALL_TIMEOUT_S)
        sampler.wait_caught_up()
        batches = max(1, round(rate * self.scale.visible_s / BATCH))
        polling = str(self.root / flush / f"{topic}.polling")
        gate = self._gate()
        consumer = self.pool.submit(
            visible_consumer,
            store.followers["cq_svc"].target,
            topic,
            1,
            batches * BATCH,
            polling,
            self.scale.visible_s + 120,
        )
        producer = self.pool.submit(paced_producer, store.log.target, topic, rate, batches, gate)
        wait_for_client(polling, consumer, producer)
        wait_for_client(gate.ready, consumer, producer)
        with CpuMeter(store.pids) as meter:
            gate.open()
            sent = producer.result()
            seen = consumer.result()
        store.check_running()
        if seen["received"] != batches * BATCH or sent["refused"]:
            raise RuntimeError(f"append-to-visible: sent {sent}, seen {seen}")
        achieved = sent["stored"] / sent["seconds"]
        first, last = seen["first_fifth_p50"], seen["last_fifth_p50"]
        # Queueing: the messages sent last waited much longer than the first ones.
        saturated = last > 2 * first + 20
        trend = f"p50 of the first / last fifth sent {first:,.0f} / {last:,.0f} ms" + (
            ": SATURATED, latency grows with the run" if saturated else ""
        )
        self.rows.append(
            Row(
                flush,
                "append-to-visible: Append paced, 8 long-polling consumers",
                "100 B",
                f"p50 {seen['p50']:.1f} ms · p99 {seen['p99']:.1f} · max {seen['max']:.1f}",
                f"offered {rate:,.0f} msg/s ({share:g} of the peak-load rate), achieved "
                f"{achieved:,.0f}; {batches * BATCH:,} msgs; {trend}",
                meter.cores(sent["client_cpu_s"] + seen["client_cpu_s"]),
            )
        )

    def _peak(self, store: Store, flush: str) -> tuple[float, tuple[int, int]]:
        """AppendStream 100 B at full speed, sampled; returns the rate it sustained and the
        store-time range it wrote."""
        sampler = store.sampler()
        gate = self._gate()
        client = self.pool.submit(
            produce_for, store.log.target, "peak", 100, self.scale.peak_s, gate
        )
        wait_for_client(gate.ready, client)
        with sampler, CpuMeter(store.pids) as meter:
            gate.open()
            got = client.result()
            stopped_at = time.perf_counter() - sampler.began
        store.check_running()
        catch_up_s = sampler.wait_caught_up()
        if got["refused"]:
            raise RuntimeError(f"peak: {got}")
        during = [s for s in sampler.samples if s.at_s <= stopped_at]
        rate = got["stored"] / got["seconds"]

        written_mb_s = (during[-1].max_offset - during[0].max_offset) / stopped_at / 1e6
        self.rows.append(
            Row(
                flush,
                f"peak load: AppendStream at full speed, {self.scale.peak_s:.0f} s",
                "100 B",
                f"{rate:,.0f} msg/s",
                f"{written_mb_s:.1f} MB/s of records; both followers had applied everything "
                f"{catch_up_s:.1f} s after the producer stopped",
                meter.cores(got["client_cpu_s"]),
            )
        )
        for follower in ("cq", "index"):
            self.rows.append(self._lag_row(flush, follower, during, stopped_at, written_mb_s))
        if self.samples_dir is not None:
            write_samples(self.samples_dir / f"peak-{flush}.csv", sampler.samples)
        return rate, (got["first_store_ms"], got["last_store_ms"])

    def _lag_row(
        self,
        flush: str,
        follower: str,
        during: list[LagSample],
        stopped_at: float,
        written_mb_s: float,
    ) -> Row:
        series = applied_lag(during, follower)
        final_bytes, final_ms = series[-1][1], series[-1][2]
        max_bytes = max(b for _, b, _ in series)
        max_ms = max(ms for _, _, ms in series)
        mid = mean_between(series, 0.4 * stopped_at, 0.6 * stopped_at)
        end = mean_between(series, 0.8 * stopped_at, stopped_at)
        # Lag grows at (write rate - apply rate): its slope over the second half says whether
        # the follower keeps up. Under 5 % of the write rate is taken as noise.
        slope_mb_s = slope([(t, b) for t, b, _ in series if t >= stopped_at / 2]) / 1e6
        if slope_mb_s <= 0.05 * written_mb_s:
            verdict = "bounded"
        else:
            verdict = (
                f"GROWS {slope_mb_s:.1f} MB/s ({slope_mb_s / written_mb_s:.0%} of the write rate)"
            )
        confirmed_ms = [s.confirmed_lag_ms.get(follower, 0) for s in during]
        confirmed_bytes = [s.confirmed_lag_bytes.get(follower, 0) for s in during]
        return Row(
            flush,
            f"dispatch lag at peak: {follower}",
            "100 B",
            f"applied: max {max_ms:,.0f} ms / {max_bytes / 1e6:.1f} MB, "
            f"final {final_ms:,.0f} ms / {final_bytes / 1e6:.1f} MB",
            f"{verdict}: mean {mid / 1e6:.1f} MB mid-phase, {end / 1e6:.1f} MB in the last "
            f"fifth; GetStatus lag_ms max {max(confirmed_ms):,} final {confirmed_ms[-1]:,}, "
            f"lag_bytes max {max(confirmed_bytes) / 1e6:.1f} MB final "
            f"{confirmed_bytes[-1] / 1e6:.1f} MB",
        )

    def _lookups(self, store: Store, flush: str, ts_range: tuple[int, int]) -> None:
        cq_svc = store.followers["cq_svc"]
        got, meter = self._measure(
            store,
            lookups,
            cq_svc.target,
            cq_svc.health_target,
            "peak",
            ts_range,
            self.scale.lookups,
        )
        look, info, health = got["lookup"], got["queue_info"], got["health"]
        self.rows.append(
            Row(
                flush,
                "time lookup: GetOffsetByTime (topic of the peak phase)",
                "100 B",
                f"p50 {look['p50']:.2f} ms · p99 {look['p99']:.2f}",
                f"{look['p50'] / info['p50']:.2f}x / {look['p99'] / info['p99']:.2f}x of "
                f"GetQueueInfo (p50 {info['p50']:.2f} · p99 {info['p99']:.2f} ms); health Check "
                f"p50 {health['p50']:.2f} · p99 {health['p99']:.2f} ms; "
                f"{self.scale.lookups:,} of each, interleaved",
                meter.cores(got["client_cpu_s"]),
            )
        )


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run (well under a minute)")
    parser.add_argument("--runs", type=int, default=None, help="runs of each produce/consume")
    parser.add_argument("--dir", default=None, help="where the data goes (default: a temp dir)")
    parser.add_argument("--flush", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--doc", default=None, help="markdown file to put the table in")
    parser.add_argument("--no-doc", action="store_true", help="print only")
    parser.add_argument("--samples-dir", default=None, help="write the peak phase's lag samples")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    if args.runs is not None:
        scale = Scale(
            scale.produce_messages, max(1, args.runs), scale.visible_s, scale.peak_s, scale.lookups
        )
    doc = None
    if not args.no_doc and (args.doc or not args.quick):
        doc = Path(args.doc or Path(__file__).resolve().parent.parent / "docs" / "bench.md")
    root = Path(tempfile.mkdtemp(prefix="mqstore-e2e-", dir=args.dir))
    started = time.perf_counter()
    modes = ["sync", "async"] if args.flush == "both" else [args.flush]
    ctx = get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
            bench = Bench(scale, pool, root)
            bench.log_args, disk_note = disk_guard(root)
            if disk_note:
                print(f"note: {disk_note}", flush=True)
                bench.notes.append(disk_note)
            if args.samples_dir:
                bench.samples_dir = Path(args.samples_dir)
            for flush in modes:
                print(f"-- flush {flush}: starting the services under {root / flush}", flush=True)
                bench.run_flush_mode(flush)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    took_s = time.perf_counter() - started
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    kind = "--quick (smoke run)" if args.quick else "full run"
    title = (
        f"End-to-end over gRPC, {when}, {kind}: {scale.produce_messages:,} messages a produce run, "
        f"{scale.runs} run(s) each, batches of {BATCH}, {QUEUES} queues; took {took_s:.0f} s"
    )
    print()
    print(title)
    print(render_text(bench.rows))
    for note in bench.notes:
        print(f"note: {note}")
    if doc is not None:
        notes = "".join(f"\n- {n}" for n in bench.notes)
        body = f"{title}.\n\n{versions_markdown(versions())}\n\n{render_markdown(bench.rows)}"
        write_doc_block(doc, DOC_BEGIN, DOC_END, body + (f"\n{notes}" if notes else ""))
        print(f"table written to {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
