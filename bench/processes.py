"""The processes a benchmark starts and coordinates, and how it waits on them.

mqstore's services are started by the package's launcher: whole stores through
mqstore.testing.cluster (Cluster, start_store), single processes through
mqstore.launcher.ServiceProcess (bench/peers/grpc_ceiling.py's server too). This module adds
what the benchmarks share on top:

- `settings_of`: the SDK's settings for a store of one of each;
- `INDEX_DEFAULT_ARGS`: index_svc with the index files `make run` gives it, rather than the
  small test ones of mqstore.testing.cluster, so that its work is what a user's store does;
- `by_name` / `by_package` / `pids`: which PID each service of a Cluster has, for the meters;
- `wait_caught_up`: until every cq_svc and index_svc replica has applied the log's end;
- `disk_guard` / `allocated_bytes`: commitlog_svc's disk protection on a shared disk;
- file handshakes between the orchestrator and its client processes: `touch`,
  `wait_for_file`, `Gate` (the client is ready, the orchestrator says go) and
  `wait_for_client` (a file, or the client's error if it failed first).

nats-server and redis-server are not Python services: bench/peers/servers.py starts them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqstore.client import Admin, ClientSettings
from mqstore.formats.index_file import DEFAULT_ENTRY_NUM, DEFAULT_SLOT_NUM
from mqstore.launcher import ServiceProcess
from mqstore.testing.cluster import Cluster

CATCH_UP_TIMEOUT_S = 300.0
CATCH_UP_POLL_S = 0.05
FILE_POLL_S = 0.001
FILE_TIMEOUT_S = 60.0
# Disk one store of a full e2e run takes at its largest (measured: ~3 GiB, mostly preallocated
# 1 GiB commit-log segments, 6 MB consume-queue files and the 420 MB index file), with room.
STORE_BYTES_MAX = 6 << 30
DISK_CLEAN_FORCIBLY_RATIO = 0.85  # commitlog_svc's default (RocketMQ's)
INDEX_DEFAULT_ARGS = ["--slot-num", str(DEFAULT_SLOT_NUM), "--entry-num", str(DEFAULT_ENTRY_NUM)]


def settings_of(cluster: Cluster) -> ClientSettings:
    """The SDK's settings for a Cluster of commitlog_svc, "cq" and "index"."""
    return ClientSettings(
        commitlog=cluster.commitlog.target,
        cq=(cluster.followers["cq"].target,),
        index=(cluster.followers["index"].target,),
    )


def by_name(cluster: Cluster) -> dict[str, ServiceProcess]:
    """The processes of a Cluster by their names there: "commitlog" and each follower's."""
    return {"commitlog": cluster.commitlog, **cluster.followers}


def by_package(cluster: Cluster) -> dict[str, ServiceProcess]:
    """The processes of a Cluster of one of each by package: commitlog_svc, cq_svc, index_svc."""
    out: dict[str, ServiceProcess] = {}
    for process in by_name(cluster).values():
        if process.package in out:
            raise ValueError(f"more than one {process.package}: name them with by_name")
        out[process.package] = process
    return out


def pids(processes: Mapping[str, ServiceProcess]) -> dict[str, int]:
    """The PID of each process that was started."""
    return {name: p.proc.pid for name, p in processes.items() if p.proc is not None}


def wait_caught_up(
    settings: ClientSettings, timeout_s: float = CATCH_UP_TIMEOUT_S, poll_s: float = CATCH_UP_POLL_S
) -> float:
    """Until every cq_svc and index_svc replica in `settings` has applied the whole log (each
    run starts with the followers idle, and a read finds what was written). Returns the seconds
    it took; TimeoutError past `timeout_s`."""
    began = time.monotonic()
    with Admin(settings) as admin:
        while True:
            status = admin.status()
            end = status.commitlog.max_offset
            caught_up = [r.reachable and r.applied_offset >= end for r in status.cq]
            caught_up += [r.reachable and r.applied_offset >= end for r in status.index]
            if all(caught_up):
                return time.monotonic() - began
            if time.monotonic() - began > timeout_s:
                raise TimeoutError(f"followers did not catch up within {timeout_s} s")
            time.sleep(poll_s)


def disk_guard(directory: Path) -> tuple[list[str], str | None]:
    """Flags for commitlog_svc when other files on this disk would trip its disk protection,
    and a note saying so (None: no flags needed).

    The commit log measures use as (total - available) / total (OsDisk.usage), deletes segments
    even unexpired past 85 % and refuses appends past 90 %. On a shared VM other tenants' files
    can put that within one store's worth of bytes, and a run would then measure refusals, not
    appends. Only then are the thresholds raised, and the table says so."""
    st = os.statvfs(directory)
    total = st.f_blocks * st.f_frsize
    used_ratio = (total - st.f_bavail * st.f_frsize + STORE_BYTES_MAX) / total
    if used_ratio <= DISK_CLEAN_FORCIBLY_RATIO:
        return [], None
    flags = ["--disk-max-used-ratio", "0.97", "--disk-warning-ratio", "0.99"]
    df_ratio = (st.f_blocks - st.f_bfree) / (st.f_blocks - st.f_bfree + st.f_bavail)
    note = (
        f"the commit log's measure of disk use would reach {used_ratio:.0%} during the run "
        f"({df_ratio:.0%} as df counts it), past its {DISK_CLEAN_FORCIBLY_RATIO:.0%} "
        "forced-deletion threshold, from other files on this shared disk: the run passed "
        f"`{' '.join(flags)}`"
    )
    return flags, note


def allocated_bytes(directory: Path) -> int:
    """Disk blocks the files under `directory` hold (preallocated segments count in full)."""
    total = 0
    for base, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(base, name)).st_blocks * 512
            except OSError:
                pass
    return total


# -- file handshakes ---------------------------------------------------------------------------


def touch(path: str) -> None:
    Path(path).touch()


def wait_for_file(path: str, timeout_s: float = FILE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(FILE_POLL_S)


@dataclass(frozen=True)
class Gate:
    """When a client's clock starts. The client builds what it sends, connects, then touches
    `ready` and waits for `go`: the orchestrator starts its CPU meter in between, so that the
    meter covers the measured window and not the building."""

    ready: str
    go: str
    timeout_s: float = FILE_TIMEOUT_S

    def arrive(self) -> None:
        """The client's side: ready, then wait for go."""
        touch(self.ready)
        wait_for_file(self.go, self.timeout_s)

    def open(self) -> None:
        """The orchestrator's side, once its meter runs."""
        touch(self.go)


def wait_for_client(path: str, *clients: Future[Any], timeout_s: float | None = None) -> None:
    """Wait for a client process to touch `path`; a client that failed first raises its error
    here, one that returned without touching it a RuntimeError."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not os.path.exists(path):
        for client in clients:
            if client.done():
                client.result()
                raise RuntimeError(f"a client returned before touching {path}")
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"no client touched {path} within {timeout_s} s")
        time.sleep(FILE_POLL_S)
