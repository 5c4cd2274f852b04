"""`mqstore up` (what `make run` runs): starts the three services, says where they listen, and
on Ctrl-C stops them all cleanly."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mqstore.client import Admin, ClientSettings, Consumer, Producer
from mqstore.client.producer import SendFuture
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc

from .support import append, eventually, pull_all, start_up

pytestmark = pytest.mark.timeout(180)
STORE_ON_A_LAPTOP_BYTES_MAX = 100 * 1000 * 1000


def test_up_runs_the_store_and_ctrl_c_stops_it_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc, text = start_up(data)
    try:
        _use_the_store_as_printed(data, text)
    except BaseException:
        proc.kill()
        proc.communicate(timeout=60)
        raise
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


def _use_the_store_as_printed(data: Path, text: str) -> None:
    """A message through the printed addresses, then the same with the export lines, then
    with nothing at all (the saved context)."""
    targets = dict(re.findall(r"^\s+(\w+_svc)\s+api (\S+)", text, re.M))
    assert set(targets) == {"commitlog_svc", "cq_svc", "index_svc"}, text
    with (
        make_channel(targets["commitlog_svc"]) as log_channel,
        make_channel(targets["cq_svc"]) as cq_channel,
    ):
        append(commitlog_pb2_grpc.CommitLogStub(log_channel), "hello", [0], [b"world"])
        cq_stub = consumequeue_pb2_grpc.ConsumeQueueStub(cq_channel)
        eventually(lambda: [b for _, _, b in pull_all(cq_stub, "hello", 0)] == [b"world"])
    # Sized for a laptop: a store holding one message takes well under 100 MB of disk (the
    # services' production defaults took ~1.5 GB: a 1 GiB segment and a 401 MB index file).
    used = _disk_bytes(data)
    assert used < STORE_ON_A_LAPTOP_BYTES_MAX, f"{used / 1e6:.0f} MB on disk"
    # The printed export lines, pasted into a shell, are all a client needs.
    env = dict(re.findall(r"^\s+export (MQSTORE_\w+)=(\S+)", text, re.M))
    assert set(env) == {"MQSTORE_COMMITLOG", "MQSTORE_CQ", "MQSTORE_INDEX"}, text
    shown = mqstore(env, "consume", "hello", "--raw")
    assert shown.stdout == "world\n", shown
    # Or nothing at all: up saved and selected a context that the command and the SDK read.
    bare = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MQSTORE_") or k.endswith("CONFIG_DIR")
    }
    shown = subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "consume", "hello", "--raw"],
        env=bare, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.stdout == "world\n", shown
    listed = json.loads(mqstore({}, "context", "ls", "--json").stdout)
    assert listed == {"contexts": ["local-any"], "selected": "local-any"}, listed
    assert ClientSettings.from_env(bare).commitlog == env["MQSTORE_COMMITLOG"]


def _disk_bytes(root: Path) -> int:
    """The disk blocks the files under `root` take (preallocated space counts, holes not)."""
    return sum(
        os.stat(os.path.join(base, n)).st_blocks * 512
        for base, _, names in os.walk(root)
        for n in names
    )


def mqstore(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The `mqstore` command as a user runs it, with the printed environment."""
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def cluster_status(env: dict[str, str]) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(mqstore(env, "cluster", "status", "--json").stdout)
    return shown


def test_up_with_three_replicas_runs_a_broker_group_a_client_reaches_as_printed(
    tmp_path: Path,
) -> None:
    """`mqstore up --replicas 3`: etcd and three commit-log replicas (plus cq_svc and
    index_svc following the leader); the printed `export` lines are all a client needs;
    `mqstore cluster switchover` moves the lead while a producer sends, losing nothing;
    the group survives a kill -9 of its leader; Ctrl-C stops everything cleanly."""
    data = tmp_path / "data"
    proc, text = start_up(data, "--replicas", "3", timeout_s=120)
    try:
        env = dict(re.findall(r"^\s+export (MQSTORE_\w+)=(\S+)", text, re.M))
        assert set(env) == {"MQSTORE_COMMITLOG", "MQSTORE_CQ", "MQSTORE_INDEX"}, text
        assert len(env["MQSTORE_COMMITLOG"].split(",")) == 3, text
        assert "etcd" in text and "broker group" in text, text
        settings = ClientSettings.from_env(env)
        with Producer(settings, retry_timeout_s=60) as producer:
            sent = [producer.send("hello", b"world-%d" % i) for i in range(100)]
            producer.flush()
            assert all(f.result(timeout=60) for f in sent)
        # `mqstore cluster status --json` with the same environment: one leader, all in sync
        cluster = cluster_status(env)
        rows = cluster["replicas"]
        assert sorted(r["role"] for r in rows) == ["follower", "follower", "leader"], rows
        assert all(r["in_sync"] for r in rows), rows
        (lead,) = [r for r in rows if r["role"] == "leader"]
        assert (
            cluster["leader"] == lead["replica"] and cluster["commit_offset"] == lead["end_offset"]
        )

        # `mqstore cluster switchover` while a producer sends: every send acknowledged
        follower = next(r for r in rows if r["role"] == "follower")
        skipped = mqstore(env, "cluster", "switchover", "--if-leader", "--commitlog",
                          follower["address"])  # fmt: skip
        assert "nothing to do" in skipped.stdout, skipped.stdout
        sending = threading.Event()
        during: list[SendFuture] = []

        def send_during() -> None:
            with Producer(settings, retry_timeout_s=60) as producer:
                i = 0
                while sending.is_set() or i < 50:
                    during.append(producer.send("hello", b"during-%d" % i))
                    i += 1
                    time.sleep(0.002)
                producer.flush()

        sending.set()
        sender = threading.Thread(target=send_during)
        sender.start()
        time.sleep(0.3)
        moved = json.loads(mqstore(env, "cluster", "switchover", "--json").stdout)
        time.sleep(0.3)
        sending.clear()
        sender.join(timeout=90)
        assert moved["switched"] and moved["from"] == lead["replica"], moved
        assert moved["to"] != lead["replica"], moved
        stored = sorted(f.result(timeout=60).store_timestamp_ms for f in during)
        gap_ms = max(b - a for a, b in itertools.pairwise(stored))
        # figures, not bounds: the old leader's pause, and the longest gap between two stored
        # messages of a producer sending every 2 ms (what its user saw)
        print(f"switchover: writes paused {moved['writes_paused_ms']} ms, longest gap {gap_ms} ms")
        cluster = cluster_status(env)
        assert cluster["leader"] == moved["to"], cluster
        # Admin's commit-log calls go to the leader, wherever it is in the address list
        (now,) = [r for r in cluster["replicas"] if r["role"] == "leader"]
        with Admin(settings) as admin:
            status = admin.status()
        assert status.commitlog.address == now["address"], status.commitlog
        assert status.commitlog.max_offset >= now["end_offset"]
        bodies = {b"world-%d" % i for i in range(100)} | {
            b"during-%d" % i for i in range(len(during))
        }
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(bodies) and time.monotonic() < deadline:
            with Consumer(settings, "hello", start="earliest") as consumer:
                got = [m.body for m in consumer.messages(follow=False)]
            time.sleep(0.1)
        assert sorted(got) == sorted(bodies)  # every acknowledged message once

        # a kill -9 of the leading replica: the group goes on, the client follows it
        rows = cluster["replicas"]
        (lead,) = [r for r in rows if r["role"] == "leader"]
        leader_dir = data / f"commitlog_svc-{[r['address'] for r in rows].index(lead['address'])}"
        leader_pid = int(json.loads((leader_dir / ".commitlog_svc.ports.json").read_text())["pid"])
        os.kill(leader_pid, signal.SIGKILL)
        with Producer(settings, retry_timeout_s=60) as producer:
            assert producer.send("hello", b"after-the-kill").result(timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    assert "the broker group goes on with 2 replicas" in out, text + out
    assert "stopping the rest" not in out, out


def test_make_run_takes_the_data_directory_and_the_base_port() -> None:
    # `make -n`: the command `make run` would run, not run (test_up_* run `mqstore up` itself).
    root = Path(__file__).resolve().parents[2]
    shown = subprocess.run(
        ["make", "-n", "-C", str(root), "run", "DATA_DIR=/tmp/elsewhere", "BASE_PORT=8100"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "mqstore up --data-dir /tmp/elsewhere --base-port 8100" in shown, shown


def _service_pids(data: Path) -> dict[str, int]:
    """Each service's pid, from the ports file it wrote once listening."""
    pids = {}
    for service in ("commitlog_svc", "cq_svc", "index_svc"):
        ports_file = data / service / f".{service}.ports.json"
        pids[service] = int(json.loads(ports_file.read_text())["pid"])
    return pids


def _alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("ending", ["ctrl-c with its pipe closed", "kill -9"])
def test_the_services_end_with_up_however_it_ends(tmp_path: Path, ending: str) -> None:
    # `mqstore up | tee log` then Ctrl-C: tee dies first, and `up` writes to a closed pipe
    # while it stops; or `up` killed outright. Before, both left the services running on the
    # data directory and its ports (the next `up` failed "exited with 1 before listening").
    data = tmp_path / "data"
    proc, _ = start_up(data)
    pids = _service_pids(data)
    assert all(_alive(pid) for pid in pids.values()), pids
    assert proc.stdout is not None
    if ending == "kill -9":
        proc.kill()
        proc.stdout.close()
    else:
        proc.stdout.close()  # tee is gone
        proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    eventually(lambda: not any(_alive(pid) for pid in pids.values()), timeout_s=60)
    # Each one stopped cleanly (SIGTERM), not killed: no abort marker left behind.
    markers = [p for p in data.rglob("abort")]
    assert markers == [], markers


def test_a_second_up_on_a_data_directory_in_use_says_which_process_holds_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    first, _ = start_up(data)
    try:
        holder = _service_pids(data)["commitlog_svc"]
        second = subprocess.run(
            [sys.executable, "-m", "mqstore.cli", "up", "--data-dir", str(data),
             "--base-port", "-1"],
            check=False, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert second.returncode == 1, second
        # On the console, not only in a log file: who holds the directory.
        assert f"lock is held by process {holder} (" in second.stderr, second.stderr
        assert "-m commitlog_svc" in second.stderr, second.stderr
        assert _alive(holder)  # the first store is untouched
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
