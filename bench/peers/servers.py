"""nats-server and redis-server from Debian's packages, on loopback, each in its own temp dir.

    python -m bench.peers.servers --ensure     install them when missing (root), else say how

A server is started on a free 127.0.0.1 port with its data directory under a directory given
by the caller, waited for until it answers its own protocol, and stopped by its PID (SIGTERM,
then SIGKILL) in a finally: `with running(nats_server(dir)) as s:`. Nothing is left behind.

Durability as started here (the peers' defaults a Python user gets, as in the reference):
- nats-server `-js -sd DIR`: JetStream file storage; a publish is acknowledged once the
  server has stored it, with no fsync per message: the file store syncs on its own interval.
- redis-server `--appendonly yes --appendfsync everysec --save ''`: every write reaches the
  AOF file (write(2)) before the reply, and is fsynced by a background thread once a second.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = {"nats-server": "nats-server", "redis-server": "redis-server"}  # binary -> package
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
APT_TIMEOUT_S = 600.0


class ServerMissing(RuntimeError):
    """A server binary is not installed and could not be installed here."""


def find(binary: str) -> str | None:
    # Debian puts nats-server in /usr/sbin, which a non-root PATH may lack.
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")


def missing(binaries: tuple[str, ...] = tuple(PACKAGES)) -> list[str]:
    return [b for b in binaries if find(b) is None]


def ensure_installed(binaries: tuple[str, ...] = tuple(PACKAGES)) -> dict[str, str]:
    """Paths of the binaries; installs the missing ones with apt-get when running as root
    (the service is never enabled or started by us: Debian's policy-rc.d decides that),
    otherwise raises ServerMissing saying what to run."""
    absent = missing(binaries)
    if absent:
        packages = [PACKAGES[b] for b in absent]
        command = ["apt-get", "install", "-y", *packages]
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise ServerMissing(
                f"{', '.join(absent)} not installed: run `sudo {' '.join(command)}` "
                "(Debian's packages), then again"
            )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"installing {' '.join(packages)} with apt-get", file=sys.stderr, flush=True)
        done = subprocess.run(command, env=env, check=False, timeout=APT_TIMEOUT_S)
        if done.returncode != 0:  # stale package lists: update once and try again
            subprocess.run(["apt-get", "update"], env=env, check=False, timeout=APT_TIMEOUT_S)
            subprocess.run(command, env=env, check=False, timeout=APT_TIMEOUT_S)
        absent = missing(binaries)
        if absent:
            raise ServerMissing(f"apt-get did not install {', '.join(absent)}")
    return {b: str(find(b)) for b in binaries}


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the server binds it a moment later; start retries
    once should someone else take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nats_ready(port: int) -> bool:
    """A NATS server greets every connection with an INFO line."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        return s.recv(4096).startswith(b"INFO ")


def _redis_ready(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


@dataclass
class Server:
    name: str  # nats | redis
    binary: str
    data_dir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)

    def argv(self) -> list[str]:
        if self.name == "nats":
            return [
                self.binary,
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                str(self.data_dir),
            ]
        return [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
        ]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        scheme = "nats" if self.name == "nats" else "redis"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir.parent / f"{self.name}-server.log"
        for attempt in range(2):
            self.port = free_port()
            argv = self.argv()
            with open(self.log_path, "ab") as log:
                # Its own process group: a Ctrl-C in the terminal reaches us, and we stop it.
                self.proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.data_dir, process_group=0
                )
            try:
                self._wait_ready()
                return
            except RuntimeError:
                self.stop()
                if attempt:
                    raise

    def _wait_ready(self) -> None:
        check = _nats_ready if self.name == "nats" else _redis_ready
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.binary} exited with {self.proc.returncode}; see {self.log_path}"
                )
            with contextlib.suppress(OSError):
                if check(self.port):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.binary} did not answer within {READY_TIMEOUT_S} s")

    def stop(self) -> int | None:
        """SIGTERM by PID, SIGKILL past STOP_TIMEOUT_S; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def version(self) -> str:
        done = subprocess.run(
            [self.binary, "--version"], capture_output=True, text=True, check=False, timeout=10
        )
        return (done.stdout or done.stderr).strip()


def nats_server(root: Path) -> Server:
    return Server("nats", ensure_installed(("nats-server",))["nats-server"], root / "nats")


def redis_server(root: Path) -> Server:
    return Server("redis", ensure_installed(("redis-server",))["redis-server"], root / "redis")


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ensure", action="store_true", help="install what is missing (root)")
    args = parser.parse_args(argv)
    try:
        paths = ensure_installed() if args.ensure else {b: find(b) for b in PACKAGES}
    except ServerMissing as err:
        print(f"bench-peers: {err}", file=sys.stderr)
        return 2
    for binary, path in paths.items():
        print(f"{binary}: {path or 'not installed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
