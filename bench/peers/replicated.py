"""Produce to a broker group of three replicas against one replica, in the same bench-peers run.

The group is what `mqstore up --replicas 3` runs: etcd, three commitlog_svc replicas (flush
sync, `--replication sync --min-insync 2`: an append is acknowledged once every in-sync
replica holds it durably), cq_svc and index_svc following the leader. The single replica it is
set against is bench-peers' own flush-sync store, produced to right before each group run, so
both see the same machine. The producer is the plain SDK Producer given all three addresses.

Where the time goes is read from the CPU meter over each run: the leader's cores, each
follower's, and the followers of the log (cq_svc, index_svc).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.peers.context import Context
from bench.report import size_name
from mqstore.client import ClientSettings
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.testing.cluster import EPHEMERAL

REPLICAS = 3
MIN_INSYNC = 2
GROUP = "bench"


@dataclass
class Group:
    root: Path
    etcd: EtcdProcess
    replicas: list[ServiceProcess] = field(default_factory=list)
    followers: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def settings(self) -> ClientSettings:
        """All three addresses, the leader's first (Admin's status asks the first)."""
        targets = sorted((r.target for r in self.replicas), key=lambda t: role(t) != "leader")
        return ClientSettings(
            commitlog=",".join(targets),
            cq=(self.followers["cq"].target,),
            index=(self.followers["index"].target,),
        )

    def pids(self) -> dict[str, int]:
        """Each process by its part: the replicas by role (leader, follower-1, follower-2),
        cq_svc, index_svc."""
        out: dict[str, int] = {}
        followers = 0
        for replica in self.replicas:
            assert replica.proc is not None
            if role(replica.target) == "leader":
                out["leader"] = replica.proc.pid
            else:
                followers += 1
                out[f"follower-{followers}"] = replica.proc.pid
        for name, service in self.followers.items():
            if service.proc is not None:
                out[f"{name}_svc"] = service.proc.pid
        return out

    def stop(self) -> None:
        for service in [*self.followers.values(), *reversed(self.replicas)]:
            service.stop()
        self.etcd.stop()


def role(target: str) -> str:
    with grpc.insecure_channel(target) as channel:
        answer = pb_grpc.CommitLogStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    return str(answer.role)


def start_group(root: Path, commitlog_args: list[str]) -> Group:
    """etcd, three replicas and the log's two followers, listening."""
    etcd = EtcdProcess(data_dir=str(root / "etcd"), log_path=str(root / "etcd.log"))
    etcd.start()
    group = Group(root, etcd)
    try:
        for i in range(REPLICAS):
            name = f"commitlog-{i}"
            replica = ServiceProcess(
                "commitlog_svc",
                str(root / name),
                args=[*EPHEMERAL, "--flush", "sync", *commitlog_args,
                      "--group", GROUP, "--replica-name", name, "--etcd", etcd.endpoint,
                      "--replication", "sync", "--min-insync", str(MIN_INSYNC)],
                log_path=str(root / f"{name}.log"),
            )  # fmt: skip
            replica.start()
            group.replicas.append(replica)
        for replica in group.replicas:
            replica.wait_listening()
        target = ",".join(r.target for r in group.replicas)
        for name in ("cq", "index"):
            service = ServiceProcess(
                f"{name}_svc",
                str(root / f"{name}_svc"),
                args=[*EPHEMERAL, "--commitlog-target", target],
                log_path=str(root / f"{name}_svc.log"),
            )
            service.start()
            group.followers[name] = service
        for service in group.followers.values():
            service.wait_listening()
    except BaseException:
        group.stop()
        raise
    return group


def note_replicated(
    ctx: Context, size: int, single_rate: float, made: dict[str, Any], cores: dict[str, float]
) -> None:
    """Keep one pair (1 replica, 3 replicas) and rewrite the note from every pair so far."""
    pairs = ctx.results.extras.setdefault("mqstore_replicated_produce", {})
    pairs.setdefault(str(size), []).append(
        {"single": single_rate, "group": made["rate"], "cores": cores}
    )
    parts = []
    for key, runs in pairs.items():
        ratio = statistics.median(r["group"] / r["single"] for r in runs if r["single"] > 0)
        rate = statistics.median(r["group"] for r in runs)
        every: dict[str, list[float]] = {}
        for r in runs:
            for name, value in r["cores"].items():
                every.setdefault(name, []).append(value)
        spent = ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in sorted(every.items()))
        parts.append(
            f"{size_name(int(key))}: {rate:,.0f} msg/s, {ratio:.2f}x one replica (cores: {spent})"
        )
    ctx.results.set_note(
        "mqstore_replicated",
        f"mqstore with {REPLICAS} replicas (flush sync, --replication sync --min-insync "
        f"{MIN_INSYNC}: acknowledged once every in-sync replica holds it durably), the plain SDK "
        "Producer given the three addresses, against one replica (flush sync) produced to right "
        "before it (median of the pairs): " + "; ".join(parts) + ".",
    )
