"""`mqstore up` (what `make run` runs): starts the three services, says where they listen, and
on Ctrl-C stops them all cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc

from .support import append, eventually, pull_all

pytestmark = pytest.mark.timeout(180)


def test_up_runs_the_store_and_ctrl_c_stops_it_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqstore.cli", "up", "--data-dir", str(data), "--base-port", "-1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            break
    text = "".join(lines)
    targets = dict(re.findall(r"^\s+(\w+_svc)\s+api (\S+)", text, re.M))
    assert set(targets) == {"commitlog_svc", "cq_svc", "index_svc"}, text
    with (
        make_channel(targets["commitlog_svc"]) as log_channel,
        make_channel(targets["cq_svc"]) as cq_channel,
    ):
        append(commitlog_pb2_grpc.CommitLogStub(log_channel), "hello", [0], [b"world"])
        cq_stub = consumequeue_pb2_grpc.ConsumeQueueStub(cq_channel)
        eventually(lambda: [b for _, _, b in pull_all(cq_stub, "hello", 0)] == [b"world"])
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text + out
    assert "stopped cleanly" in out
    for service in ("commitlog_svc", "cq_svc", "index_svc"):
        leftovers = [
            os.path.join(base, n)
            for base, _, names in os.walk(data / service)
            for n in names
            if n == "abort"
        ]
        assert leftovers == [], f"{service} left an abort marker: not a clean stop"
