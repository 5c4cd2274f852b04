"""Smoke test of the side-by-side benchmark (`make bench-peers`, bench/peers): every part of
the harness runs for real at a tiny scale, and the table it builds is checked.

The mqstore and gRPC-ceiling parts always run (the three services and the ceiling server are
real processes). The NATS and Redis parts need nats-server / redis-server (Debian packages)
and the `bench` extra (nats-py, redis, hiredis): without them they are skipped, saying why.
"""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from bench.peers import servers
from bench.peers.common import SIZES, WORKLOADS, Scale, sizes_of
from bench.peers.run import Report, RunInfo, build_report, run_bench
from bench.peers.table import NOT_APPLICABLE

TINY = Scale(messages=2_000, runs=1, lookups=20, visible_s=0.5)
# Without mqstore in the run, append-to-visible needs a load: a small fixed one.
VISIBLE_RATE = 2_000.0
RATE_WORKLOADS = ("produce", "produce_sync", "consume", "consume_fast")
MEMORY_MAX_MIB = 24 * 1024  # the machine's memory
LATENCY_MAX_MS = 60_000.0


def _run(tmp_path: Path, systems: tuple[str, ...], visible_rate: float | None) -> Report:
    results, failures, ctx = run_bench(TINY, systems, root=tmp_path, visible_rate=visible_rate)
    report = build_report(results, failures, RunInfo.of(ctx, systems, "test"))
    assert not report.failures, report.failures
    return report


def _number(text: str) -> float:
    """The median at the start of a cell ("12,345 (11,000-13,000)" -> 12345)."""
    match = re.match(r"[\d,]+(\.\d+)?", text)
    assert match, f"not a figure: {text!r}"
    return float(match.group(0).replace(",", ""))


def _check_system(report: Report, system: str) -> None:
    """Every row has a sane figure for `system` (the ceiling has no append-to-visible, the plain
    user's rows are mqstore's and Redis's)."""
    for row in report.rows:
        key, cell = row.workload.key, row.cells[system]
        if (key, system) in NOT_APPLICABLE:
            assert cell == "-"
            continue
        value = _number(cell)
        assert math.isfinite(value) and value > 0, (key, row.size, cell)
        if row.workload.unit == "ms":
            assert value < LATENCY_MAX_MS, (key, row.size, cell)
        if row.workload.unit == "MiB":
            assert value < MEMORY_MAX_MIB, (key, cell)
    # p50 never above p99 (same runs)
    for kind in ("lookup", "visible"):
        for size in SIZES:
            p50 = report.results.get(f"{kind}_p50", size, system)
            p99 = report.results.get(f"{kind}_p99", size, system)
            if p50 is not None and p99 is not None:
                assert p50.values[0] <= p99.values[0]


def _check_table(report: Report) -> None:
    expected = [(w.key, size) for w in WORKLOADS for size in sizes_of(w)]
    assert [(r.workload.key, r.size) for r in report.rows] == expected
    body = [line for line in report.markdown.splitlines() if line.startswith("| ")]
    labels = [w.label for w in WORKLOADS]
    assert len(
        [line for line in body if any(line.startswith(f"| {lb} |") for lb in labels)]
    ) == len(expected)


@pytest.mark.slow
def test_mqstore_and_ceiling_quick(tmp_path: Path) -> None:
    report = _run(tmp_path, ("mqstore", "ceiling"), None)
    _check_table(report)
    _check_system(report, "mqstore")
    _check_system(report, "ceiling")
    for row in report.rows:
        if row.workload.key in RATE_WORKLOADS or row.workload.key.startswith("lookup"):
            assert row.ratios["ceiling"].endswith("x"), row.texts()
        assert row.cells["redis"] == "not run"
        assert row.cells["nats"] == (
            "-" if (row.workload.key, "nats") in NOT_APPLICABLE else "not run"
        )
    # the plain user's rows: mqstore's figures with the SDK's defaults, timed from the first call
    for size in SIZES:
        for key in ("plain_produce", "plain_consume"):
            plain = report.results.get(key, size, "mqstore")
            assert plain is not None and plain.values[0] > 0, key
    # append-to-visible ran at half of mqstore's own produce rate
    for size in SIZES:
        produced = report.results.get("produce", size, "mqstore")
        visible = report.results.get("visible_p50", size, "mqstore")
        assert produced is not None and visible is not None
        assert visible.runs[0]["offered"] == pytest.approx(produced.values[0] / 2)
        assert visible.runs[0]["received"] == max(1, round(produced.values[0] / 2 * TINY.visible_s))
    # each lookup run measured the bare round trip in the same moments, and a note reads one
    # against the other
    for size in SIZES:
        lookup = report.results.get("lookup_p50", size, "mqstore")
        assert lookup is not None
        assert 0 < lookup.runs[0]["round_trip_p50_ms"] < LATENCY_MAX_MS
    (note,) = [n for n in report.results.notes if n.startswith("mqstore time lookups")]
    assert re.search(r"100 B [\d.]+ ms against [\d.]+ ms, [\d.]+x", note), note
    # the whole-record CRC's cost: a twin store without it produced right after each run
    (note,) = [n for n in report.results.notes if n.startswith("mqstore's whole-record CRC")]
    assert re.search(r"100 B [\d.]+x \(without it [\d,]+ msg/s\); 1 KiB [\d.]+x", note), note
    # produce to a broker group of three replicas, against one replica, with where time went
    (note,) = [n for n in report.results.notes if n.startswith("mqstore with 3 replicas")]
    for size in ("100 B", "1 KiB"):
        assert re.search(size + r": [\d,]+ msg/s, [\d.]+x one replica \(cores: ", note), note
    assert "leader " in note and "follower-2 " in note and "cq_svc " in note, note
    memory = report.results.get("memory", 0, "mqstore")
    assert memory is not None
    assert set(memory.runs[0]) >= {"commitlog_svc", "cq_svc", "index_svc"}
    for pid in memory.runs[0]["pids"].values():
        assert not Path(f"/proc/{pid}").exists(), f"service {pid} still running"
    _stopped(report, "ceiling")


def _need(binary: str, module: str) -> None:
    if servers.missing((binary,)):
        pytest.skip(
            f"{binary} not installed (Debian package {binary}; `make bench-peers` installs it)"
        )
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"python package {module!r} not installed (the `bench` extra)")


def _stopped(report: Report, system: str) -> None:
    """The server the harness started is gone (stopped by its PID and reaped)."""
    memory = report.results.get("memory", 0, system)
    assert memory is not None
    pid = memory.runs[0]["pid"]
    assert not Path(f"/proc/{pid}").exists(), f"{system} server {pid} still running"


def test_nats_quick(tmp_path: Path) -> None:
    _need("nats-server", "nats")
    report = _run(tmp_path, ("nats",), VISIBLE_RATE)
    _check_table(report)
    _check_system(report, "nats")
    _stopped(report, "nats")


def test_redis_quick(tmp_path: Path) -> None:
    _need("redis-server", "redis")
    report = _run(tmp_path, ("redis",), VISIBLE_RATE)
    _check_table(report)
    _check_system(report, "redis")
    _stopped(report, "redis")
