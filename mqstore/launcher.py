"""Start mqstore's service processes and find where they listen.

Used by `mqstore up` (and so `make run`) and by the end-to-end tests. A service is started as
`python -m <package> --port P --ports-file F ...`; it writes F (JSON: port, health_port,
metrics_port, pid) once it listens, so ports may be 0 and picked by the kernel. It is ready
when its plaintext health port answers "readiness" SERVING (a follower: caught up with the
commit log). This module only launches processes: it imports no service code.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0  # SIGTERM to SIGKILL
READY_POLL_S = 0.05
HEALTH_CALL_TIMEOUT_S = 2.0
READINESS = "readiness"  # the health service name every service sets once it can serve
# A service's port flags and the ports-file keys they name.
_PORT_FLAGS = (
    ("--port", "port"),
    ("--health-port", "health_port"),
    ("--metrics-port", "metrics_port"),
)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How much of a log's end is searched for the error a service stopped with.
_LOG_TAIL_BYTES = 64 * 1024


def last_error(log_path: str) -> str:
    """The last error a service logged (its JSON lines, level error or critical): why it
    stopped, for the console rather than only its log file. "" when there is none."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - _LOG_TAIL_BYTES))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
            return str(entry.get("event", ""))
    return ""


def health_status(target: str, service: str) -> int:
    """A health Check's status (health_pb2.HealthCheckResponse.*) at `target`, -1 when the
    call fails (not listening yet, or gone)."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=HEALTH_CALL_TIMEOUT_S
            )
        except grpc.RpcError:
            return -1
    return int(answer.status)


def ends_with_launcher() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGTERM (a clean stop) when the launching
    process dies, however it dies: killed, crashed, its terminal or pipe gone (Linux's
    PR_SET_PDEATHSIG). None elsewhere. Only for a launcher whose children are started from a
    thread that lives as long as it (the signal follows the creating thread): `mqstore up`.
    Safe as a preexec_fn in a threaded parent: between fork and exec it takes no lock (the
    prctl function is resolved before the fork; getppid and kill are plain system calls)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not in the child
    launcher = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != launcher:  # it died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


@dataclass
class ServiceProcess:
    package: str  # commitlog_svc | cq_svc | index_svc
    data_dir: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports_file: str = ""
    log_path: str = ""  # stdout and stderr go here ("" = inherit)
    proc: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)
    # Stop (SIGTERM) when the launching process dies: `mqstore up`'s services never outlive it.
    ends_with_launcher: bool = False

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            self.package,
            "--data-dir",
            self.data_dir,
            "--ports-file",
            self.ports_file,
            *self.args,
        ]

    def start(self) -> None:
        if not self.ports_file:
            self.ports_file = os.path.join(self.data_dir, f".{self.package}.ports.json")
        os.makedirs(self.data_dir, exist_ok=True)
        if os.path.exists(self.ports_file):
            os.unlink(self.ports_file)
        out = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115 - kept open
        env = {**os.environ, **self.env}
        # A process group of its own: Ctrl-C in a terminal signals the whole foreground group,
        # and a service that got it straight from the terminal could be in interpreter
        # shutdown (default signal actions restored) when its launcher's own SIGTERM comes,
        # and die of it (exit -15) after stopping cleanly. The launcher alone decides when
        # and in which order its services stop.
        self.proc = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=out,
            env=env,
            process_group=0,
            preexec_fn=ends_with_launcher() if self.ends_with_launcher else None,  # noqa: PLW1509 - takes no lock
        )
        if out is not None:
            out.close()  # the child has its own copy

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S) -> dict[str, int]:
        """Wait for the ports file; raises if the process exits or the time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                why = last_error(self.log_path) if self.log_path else ""
                raise RuntimeError(
                    f"{self.package} exited with {self.proc.returncode} before listening"
                    + (f": {why}" if why else "")
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if os.path.exists(self.ports_file):
                with open(self.ports_file, encoding="utf-8") as f:
                    data = json.load(f)
                if data.get("pid") == self.proc.pid:
                    self.ports = {k: int(v) for k, v in data.items() if k.endswith("port")}
                    return self.ports
            time.sleep(0.05)
        raise TimeoutError(f"{self.package} did not listen within {timeout_s} s")

    def wait_ready(self, timeout_s: float | None = READY_TIMEOUT_S) -> None:
        """Wait for readiness SERVING (None: as long as the process runs); raises
        RuntimeError if it exits, TimeoutError when the time runs out."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while deadline is None or time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"{self.package} exited; see {self.log_path}")
            if self.ready:
                return
            time.sleep(READY_POLL_S)
        raise TimeoutError(f"{self.package} not ready within {timeout_s} s; see {self.log_path}")

    @property
    def ready(self) -> bool:
        return (
            self.running
            and health_status(self.health_target, READINESS)
            == health_pb2.HealthCheckResponse.SERVING
        )

    def pin_ports(self) -> None:
        """The next start listens on the ports this run got (0 in the flags means the kernel
        picks anew), so that clients and followers that named them find it again."""
        for flag, key in _PORT_FLAGS:
            self.args[self.args.index(flag) + 1] = str(self.ports[key])

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    @property
    def health_target(self) -> str:
        return f"127.0.0.1:{self.ports['health_port']}"

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def kill(self) -> None:
        """kill -9: no flush, no checkpoint, no goodbye."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait (SIGKILL past the timeout); returns the exit code."""
        if self.proc is None:
            return 0
        self.signal(signal.SIGTERM)
        return self.wait_stopped(timeout_s)

    def wait_stopped(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """The exit code of a process already told to stop (0 if never started); SIGKILL past
        the timeout."""
        if self.proc is None:
            return 0
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
