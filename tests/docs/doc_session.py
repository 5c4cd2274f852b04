"""Runs one document's commands the way a reader would, in namespaces of its own.

    unshare --net --pid --fork --mount-proc --kill-child \
        python -m tests.docs.doc_session PLAN.json RESULTS.json

The network has only a loopback, so the commands use the ports the docs name (7100, 7200,
2379...) without meeting anything else on the machine, and `make run` is `make run`. This
process is pid 1 of its own pid namespace: when it ends, however, so does everything it started.

A plan is a list of steps, in the document's order, each run by bash in the session's
directory (the repository's files, linked, and a fresh ./data):

    run       wait for it to end (STEP_TIMEOUT_S at most); record its status and output
    follow    it reads until Ctrl-C: once it has printed and then been quiet FOLLOW_QUIET_S
              (caught up, waiting for more), or after FOLLOW_S at most, SIGINT; then record
              as `run`
    serve     it serves until stopped (`make run`, `mqstore up`, a service or etcd by hand):
              start it in the background as in a shell of its own, then wait until it is
              ready; a new store (`make run`, `mqstore up`) stops everything started before,
              as its reader would with Ctrl-C first. Nothing it prints is pasted: the context
              `mqstore up` saves and selects is what the commands after it find the store by.

At the end every server gets SIGINT (Ctrl-C), then SIGKILL after STOP_TIMEOUT_S.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STEP_TIMEOUT_S = 240.0
# Long enough for the command to start and reach its first wait on a loaded machine (Ctrl-C
# before its handler is set would end it by the signal).
FOLLOW_S = 10.0
# A follower that printed what there was and then nothing for this long is waiting for more:
# its handler is set (it printed) and what it was asked to read is read. A pause mid-read
# under load only ends it sooner, as an early Ctrl-C would: it must still exit 0.
FOLLOW_QUIET_S = 1.5
FOLLOW_POLL_S = 0.1
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
OUTPUT_KEPT_CHARS = 4000
STORE = re.compile(r"^(make run|mqstore up)\b")
PORT_FLAG = re.compile(r"--port (\d+)")
ETCD_CLIENT_PORT = 2379


@dataclass
class Result:
    doc: str
    line: int
    command: str
    kind: str
    status: int | None  # None: did not end (or never got ready)
    output: str
    seconds: float
    problems: list[str] = field(default_factory=list)


class Session:
    def __init__(self, workdir: str, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.servers: list[tuple[subprocess.Popen[bytes], str]] = []

    def run(self, step: dict[str, Any]) -> Result:
        started = time.monotonic()
        kind = step["kind"]
        if kind == "serve":
            return self._serve(step, started)
        proc = subprocess.Popen(
            ["bash", "-c", step["command"]],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if kind == "follow":
            return self._follow(step, proc, started)
        try:
            out, _ = proc.communicate(timeout=STEP_TIMEOUT_S)
            status: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = None
        return self._result(step, status, out.decode(errors="replace"), started)

    def _follow(self, step: dict[str, Any], proc: subprocess.Popen[bytes], t0: float) -> Result:
        """Ctrl-C once it has printed and gone quiet (FOLLOW_QUIET_S) or after FOLLOW_S; its
        output is read meanwhile by a thread (a pipe left full would stall it)."""
        assert proc.stdout is not None
        chunks: list[bytes] = []
        last_output = [0.0]  # monotonic time of the last chunk; 0: nothing yet

        def drain(fd: int) -> None:
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                chunks.append(chunk)
                last_output[0] = time.monotonic()

        reader = threading.Thread(target=drain, args=(proc.stdout.fileno(),), daemon=True)
        reader.start()
        deadline = t0 + FOLLOW_S
        while proc.poll() is None and time.monotonic() < deadline:
            if last_output[0] and time.monotonic() - last_output[0] >= FOLLOW_QUIET_S:
                break
            time.sleep(FOLLOW_POLL_S)
        status: int | None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole group
        try:
            status = proc.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = None
        reader.join()
        proc.stdout.close()
        return self._result(step, status, b"".join(chunks).decode(errors="replace"), t0)

    def _serve(self, step: dict[str, Any], started: float) -> Result:
        command = step["command"]
        if STORE.match(command):
            self.stop_all()
        log_path = os.path.join(self.workdir, f".serve-{step['line']}.log")
        log = open(log_path, "wb")  # noqa: SIM115 - the server writes it until the end
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}" if "&" not in command else command],
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.servers.append((proc, log_path))
        problems = self._wait_ready(command, proc, log_path)
        output = _read(log_path)
        status = proc.poll()
        result = self._result(step, status, output, started)
        result.problems += problems
        return result

    def _wait_ready(self, command: str, proc: subprocess.Popen[bytes], log_path: str) -> list[str]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None and "&" not in command:
                return [f"exited with {proc.returncode} before it was ready"]
            if _ready(command, _read(log_path)):
                return []
            time.sleep(0.2)
        return [f"not ready within {READY_TIMEOUT_S:.0f} s"]

    def stop_all(self) -> None:
        for proc, _ in self.servers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc, _ in self.servers:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # A server started with `&` leaves its children in the group: end them too.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.servers.clear()

    def _result(self, step: dict[str, Any], status: int | None, out: str, t0: float) -> Result:
        if len(out) > OUTPUT_KEPT_CHARS:
            out = out[: OUTPUT_KEPT_CHARS // 2] + "\n[...]\n" + out[-OUTPUT_KEPT_CHARS // 2 :]
        return Result(
            step["doc"],
            step["line"],
            step["command"],
            step["kind"],
            status,
            out,
            round(time.monotonic() - t0, 2),
        )


def _ready(command: str, output: str) -> bool:
    if STORE.match(command):
        return "mqstore is up" in output
    port = PORT_FLAG.search(command)
    if port is None and "etcd" in command:
        return _listening(ETCD_CLIENT_PORT)
    return port is not None and _listening(int(port.group(1)))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def main() -> None:
    plan_path, results_path = sys.argv[1], sys.argv[2]
    with open(plan_path) as f:
        plan = json.load(f)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    session = Session(plan["workdir"], plan["env"])
    results = []
    try:
        for step in plan["steps"]:
            results.append(asdict(session.run(step)))
            with open(results_path, "w") as f:  # what ran so far, should the run be cut
                json.dump(results, f)
    finally:
        session.stop_all()


if __name__ == "__main__":
    main()
