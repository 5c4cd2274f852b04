"""The real services of a chaos run, and what one cycle does to them.

The store is mqstore/testing/cluster.py's Cluster: commitlog_svc, one cq_svc ("cq") and one
index_svc ("index"), each a process on loopback with its own data directory under the run's
root and its log in root/logs. After the first start every process is pinned to the ports it
got, so that a restart comes back where clients (and, for the commit log, the followers) look
for it.

A cycle's kill, restart and recovery:

    kill      SIGKILL to each service of the cycle, in the plan's order (ServiceProcess.kill
              waits for the process to be gone)
    down      the plan's pause
    restart   every killed service started at once (followers find the commit log when it is
              back: they retry their subscription); with a rekill, each is killed again
              `rekill_s` into its recovery and started once more
    ready     recovery time = from the (last) kill to readiness SERVING on its health port

A torn-tail cycle (chaos/torn.py) uses the same steps one at a time (kill, start, await_ready),
damages the commit log's files between the kill and the start, and may freeze cq_svc and
index_svc (SIGSTOP, then SIGCONT) across it.

Smaller files than the defaults, so that a run crosses file boundaries often: commit-log
segments of 4 MiB (a roll every few thousand messages), consume-queue files of 4,096 units,
index files of 16,384 entries. Under async flush the followers also confirm every 100 ms
(ASYNC_EXTRA_ARGS).
"""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grpc_health.v1 import health_pb2

from chaos.plan import CyclePlan
from mqstore.client.settings import ClientSettings
from mqstore.launcher import ServiceProcess, health_status
from mqstore.testing.cluster import Cluster, start_all

SEGMENT_BYTES = 4 << 20
CQ_UNITS_PER_FILE = 4_096
EXTRA_ARGS = {
    "commitlog_svc": ["--file-bytes", str(SEGMENT_BYTES), "--warm-ahead-bytes", "0"],
    "cq_svc": ["--units-per-file", str(CQ_UNITS_PER_FILE)],
}
# Under async flush the followers confirm every tenth of a second (cq_svc confirms after its
# journal flush and its thorough flush, 1 s and 60 s by default; index_svc after each flush,
# 1 s), so that when a torn cycle cuts the log they have often confirmed past the cut: the case
# in which a confirmed offset alone cannot say which log it was confirmed against. With the
# defaults they would mostly replay from below the cut, and the regrown log would overwrite
# what they held there.
FAST_CONFIRM_MS = 100
ASYNC_EXTRA_ARGS = {
    "commitlog_svc": EXTRA_ARGS["commitlog_svc"],
    "cq_svc": [
        *EXTRA_ARGS["cq_svc"],
        *("--flush-interval-ms", str(FAST_CONFIRM_MS)),
        *("--flush-thorough-interval-ms", str(FAST_CONFIRM_MS)),
    ],
    "index_svc": ["--flush-interval-ms", str(FAST_CONFIRM_MS)],
}
# How long a killed service may take to be ready again before the run calls it a failure to
# recover (the recovery bound the run checks, RECOVERY_S_MAX, is lower).
READY_TIMEOUT_S = 120.0
READY_POLL_S = 0.05
_SERVING = health_pb2.HealthCheckResponse.SERVING
METRICS_TIMEOUT_S = 5.0
# What the commit log's recovery did, from its Prometheus counters (commitlog_svc/metrics.py).
TRUNCATED_BYTES_METRIC = "mqstore_recovery_truncated_bytes_total"
CRC_MISMATCH_METRIC = "mqstore_crc_mismatch_total"


class RecoveryFailed(RuntimeError):
    """A killed service did not come back (it exited, or was not ready within the timeout)."""


@dataclass(frozen=True, slots=True)
class Recovery:
    cycle: int
    service: str
    seconds: float  # from the (last) kill to readiness SERVING
    ready_at: float  # monotonic


class Services:
    def __init__(self, root: Path, *, flush: str) -> None:
        self.root = root
        extra = ASYNC_EXTRA_ARGS if flush == "async" else EXTRA_ARGS
        self.cluster = Cluster(root, flush=flush, extra=extra)

    def start(self) -> None:
        start_all(self.cluster)
        for process in self.processes().values():
            process.pin_ports()

    def processes(self) -> dict[str, ServiceProcess]:
        return {"commitlog": self.cluster.commitlog, **self.cluster.followers}

    def exited(self) -> list[str]:
        """Services that exited without being killed (a crash of their own), with their codes."""
        return [
            f"{name} exited on its own with code {p.proc.returncode}; see {p.log_path}"
            for name, p in self.processes().items()
            if p.proc is not None and p.proc.poll() is not None
        ]

    def commitlog_counters(self) -> dict[str, float] | None:
        """The commit log's recovery counters since its last start (None: no answer)."""
        port = self.cluster.commitlog.ports["metrics_port"]
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/metrics", timeout=METRICS_TIMEOUT_S
            ) as response:
                text = response.read().decode()
        except OSError:
            return None
        return {
            name: _metric_sum(text, name) for name in (TRUNCATED_BYTES_METRIC, CRC_MISMATCH_METRIC)
        }

    def settings(self) -> ClientSettings:
        c = self.cluster
        return ClientSettings(
            commitlog=c.commitlog.target,
            cq=(c.followers["cq"].target,),
            index=(c.followers["index"].target,),
        )

    @property
    def commitlog_dir(self) -> str:
        return self.cluster.commitlog.data_dir

    @property
    def logs_dir(self) -> Path:
        return self.cluster.logs

    def stop(self) -> None:
        self.thaw(list(self.cluster.followers))  # a stopped process would not see SIGTERM
        self.cluster.stop_all()

    # -- one cycle --------------------------------------------------------------------------------

    def crash_and_recover(self, cycle: CyclePlan) -> list[Recovery]:
        victims = cycle.kill_order
        killed_at = self.kill(victims)
        if cycle.down_s:
            time.sleep(cycle.down_s)
        processes = self.processes()
        for name in victims:
            processes[name].start()
        if cycle.rekill_s is not None:
            time.sleep(cycle.rekill_s)
            killed_at = self.kill(victims)
            for name in victims:
                processes[name].start()
        return self.await_ready(cycle.index, victims, killed_at)

    def kill(self, names: Sequence[str]) -> float:
        """SIGKILL each, in order, each gone before the next; returns when (monotonic)."""
        processes = self.processes()
        for name in names:
            processes[name].kill()
        return time.monotonic()

    def restart(self, names: Sequence[str]) -> None:
        """Start each killed service again (on its pinned ports)."""
        processes = self.processes()
        for name in names:
            processes[name].start()

    def await_ready(self, cycle: int, names: Sequence[str], killed_at: float) -> list[Recovery]:
        processes = self.processes()
        ready_at = _await_ready({name: processes[name] for name in names})
        return [Recovery(cycle, name, ready_at[name] - killed_at, ready_at[name]) for name in names]

    def freeze(self, names: Sequence[str]) -> None:
        """SIGSTOP: the processes keep their sockets and files, and do nothing."""
        processes = self.processes()
        for name in names:
            processes[name].signal(signal.SIGSTOP)

    def thaw(self, names: Sequence[str]) -> None:
        processes = self.processes()
        for name in names:
            processes[name].signal(signal.SIGCONT)


def _metric_sum(text: str, name: str) -> float:
    """The sum of a metric's samples (over its labels) in Prometheus text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _await_ready(processes: dict[str, ServiceProcess]) -> dict[str, float]:
    """When each process answered readiness SERVING (monotonic time); polled together, so that
    a follower waiting for the commit log does not delay the commit log's own measurement."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready: dict[str, float] = {}
    while len(ready) < len(processes):
        for name, p in processes.items():
            if name in ready:
                continue
            if not p.running:
                raise RecoveryFailed(f"{name} exited during recovery; see {p.log_path}")
            if not p.ports:
                continue
            if health_status(p.health_target, "readiness") == _SERVING:
                ready[name] = time.monotonic()
        if len(ready) < len(processes):
            if time.monotonic() > deadline:
                late = sorted(set(processes) - set(ready))
                raise RecoveryFailed(
                    f"{', '.join(late)} not ready {READY_TIMEOUT_S:.0f} s after the restart; "
                    f"see {processes[late[0]].log_path}"
                )
            time.sleep(READY_POLL_S)
    return ready
