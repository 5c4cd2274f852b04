"""The commit log's preStop hook, run for real: the exec command of the rendered StatefulSet,
as written, in the pod's environment, with one change: the address of the pod's own replica
(127.0.0.1:7100 in the pod) becomes the address of a replica of `mqstore up --replicas 3` on
this machine. Run in a follower's place it must do nothing; in the leader's, the lead must
move to another replica and the group must go on acknowledging writes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mqstore.client import ClientSettings, Producer
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from tests.deploy.manifest_checks import Manifests, prestop_switchover
from tests.e2e.support import start_up
from tests.environ import environ_without

UP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 90.0
STATUS_TIMEOUT_S = 10.0
IN_SYNC_TIMEOUT_S = 60.0
POLL_S = 0.1
SEND_TIMEOUT_S = 60.0
OVERLAY = "dev"  # plaintext, as `mqstore up` without --secure (prod's hook is the same command)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`mqstore up --replicas 3`; the `export MQSTORE_...` lines it printed."""
    proc, text = start_up(tmp_path_factory.mktemp("up") / "data", "--replicas", "3",
                          timeout_s=UP_TIMEOUT_S)  # fmt: skip
    try:
        exports = dict(
            line.split("export ", 1)[1].split("=", 1)
            for line in text.splitlines()
            if line.strip().startswith("export MQSTORE_")
        )
        assert len(exports.get("MQSTORE_COMMITLOG", "").split(",")) == 3, text
        yield exports
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _roles(exports: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Each replica's address -> (its name, its role), asked of the replica itself."""
    out: dict[str, tuple[str, str]] = {}
    for address in exports["MQSTORE_COMMITLOG"].split(","):
        with grpc.insecure_channel(address) as channel:
            status = pb_grpc.CommitLogStub(channel).GetStatus(
                pb.GetStatusRequest(), timeout=STATUS_TIMEOUT_S
            )
        out[address] = (status.replica, status.role)
    return out


def _leader(exports: dict[str, str]) -> tuple[str, str]:
    """(address, name) of the one replica that leads."""
    leading = [(a, name) for a, (name, role) in _roles(exports).items() if role == "leader"]
    assert len(leading) == 1, _roles(exports)
    return leading[0]


def _wait_all_in_sync(exports: dict[str, str]) -> None:
    """Until the leader counts every replica in its in-sync set (a switchover needs one)."""
    deadline = time.monotonic() + IN_SYNC_TIMEOUT_S
    while True:
        roles = _roles(exports)
        leading = [a for a, (_, role) in roles.items() if role == "leader"]
        if len(leading) == 1:
            with grpc.insecure_channel(leading[0]) as channel:
                status = pb_grpc.CommitLogStub(channel).GetStatus(
                    pb.GetStatusRequest(), timeout=STATUS_TIMEOUT_S
                )
            if len(status.replicas) == 3 and all(r.in_sync for r in status.replicas):
                return
        assert time.monotonic() < deadline, roles
        time.sleep(POLL_S)


def _run_hook(m: Manifests, ordinal: int, replica: str) -> subprocess.CompletedProcess[str]:
    """The hook of pod commitlog-<ordinal> as the kubelet runs it (exec, the container's
    environment; the image's bin/ on PATH), its own replica's address rewritten."""
    hook = prestop_switchover(m, "commitlog")
    assert hook is not None
    own = hook.address
    assert own == "127.0.0.1:7100", hook.command  # what the pod asks: itself
    command = [replica if word == own else word for word in hook.command]
    bin_dir = str(Path(sys.executable).parent)
    base = environ_without("MQSTORE_")
    env = {**base, **m.env("commitlog", ordinal), "PATH": bin_dir + os.pathsep + base["PATH"]}
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=hook.bound_s, check=False
    )


def test_the_prestop_of_the_rendered_manifest_moves_the_lead_and_writes_go_on(
    rendered: dict[str, list[dict[str, Any]]], group: dict[str, str]
) -> None:
    m = Manifests(rendered[OVERLAY])
    _wait_all_in_sync(group)
    leader, leader_name = _leader(group)
    follower = next(a for a in _roles(group) if a != leader)

    # A follower's pod stops: nothing moves.
    skipped = _run_hook(m, 1, follower)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "nothing to do" in skipped.stdout, skipped.stdout
    assert _leader(group) == (leader, leader_name)

    # The leader's pod stops: the lead moves to another replica before SIGTERM would come.
    started = time.monotonic()
    moved = _run_hook(m, 0, leader)
    took_s = time.monotonic() - started
    assert moved.returncode == 0, moved.stdout + moved.stderr
    new_leader = _leader(group)
    assert new_leader[0] != leader, (leader, new_leader)
    print(f"preStop switchover took {took_s:.2f} s: {moved.stdout.strip()}")  # a figure

    # ... and the group acknowledges a write (the producer finds the new leader).
    with Producer(ClientSettings.from_env(group), retry_timeout_s=SEND_TIMEOUT_S) as producer:
        assert producer.send("prestop", b"after-the-handover").result(timeout=SEND_TIMEOUT_S)
    assert _leader(group) == new_leader
