"""The real services of a chaos run, and what one cycle does to them.

The store is tests/e2e/cluster.py's Cluster: commitlog_svc, one cq_svc ("cq") and one
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

Smaller files than the defaults, so that a run crosses file boundaries often: commit-log
segments of 4 MiB (a roll every few thousand messages), consume-queue files of 4,096 units,
index files of 16,384 entries.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from grpc_health.v1 import health_pb2

from chaos.plan import CyclePlan
from mqstore.client.settings import ClientSettings
from mqstore.launcher import ServiceProcess
from tests.e2e.cluster import Cluster, health_status, start_all

SEGMENT_BYTES = 4 << 20
CQ_UNITS_PER_FILE = 4_096
EXTRA_ARGS = {
    "commitlog_svc": ["--file-bytes", str(SEGMENT_BYTES), "--warm-ahead-bytes", "0"],
    "cq_svc": ["--units-per-file", str(CQ_UNITS_PER_FILE)],
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
        self.cluster = Cluster(root, flush=flush, extra=EXTRA_ARGS)

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
        self.cluster.stop_all()

    # -- one cycle --------------------------------------------------------------------------------

    def crash_and_recover(self, cycle: CyclePlan) -> list[Recovery]:
        processes = self.processes()
        victims = [processes[name] for name in cycle.kill_order]
        for p in victims:
            p.kill()
        killed_at = time.monotonic()
        if cycle.down_s:
            time.sleep(cycle.down_s)
        for p in victims:
            p.start()
        if cycle.rekill_s is not None:
            time.sleep(cycle.rekill_s)
            for p in victims:
                p.kill()
            killed_at = time.monotonic()
            for p in victims:
                p.start()
        ready_at = _await_ready(dict(zip(cycle.kill_order, victims, strict=True)))
        return [
            Recovery(cycle.index, name, ready_at[name] - killed_at, ready_at[name])
            for name in cycle.kill_order
        ]


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
