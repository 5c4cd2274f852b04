"""Real service processes on loopback (ephemeral ports, data under one root directory).

The one launcher of whole stores for the end-to-end tests, the benchmarks (bench/) and the
chaos runs (chaos/): `Cluster` starts commitlog_svc and any number of cq_svc / index_svc
followers through mqstore.launcher.ServiceProcess and waits until each is ready (its health
service's "readiness" SERVING); `start_store` is the usual three. Not used by the services.
"""

from __future__ import annotations

import signal
from pathlib import Path

import grpc

from mqstore.launcher import READY_TIMEOUT_S, ServiceProcess
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2_grpc

EPHEMERAL = ["--port", "0", "--health-port", "0", "--metrics-port", "0"]

# Segment size of a test store, as `mqstore up`'s laptop store: the services' default (1 GiB,
# preallocated) times the dozens of stores a test run starts would fill a CI machine's disk.
TEST_SEGMENT_BYTES = 64 << 20


class Cluster:
    """commitlog_svc plus any number of cq_svc / index_svc replicas, each its own process."""

    def __init__(
        self,
        root: Path,
        *,
        flush: str = "sync",
        extra: dict[str, list[str]] | None = None,
        local_reads: bool = True,
        ready_timeout_s: float = READY_TIMEOUT_S,
        segment_bytes: int | None = TEST_SEGMENT_BYTES,
    ) -> None:
        """`segment_bytes`: the commit log's --file-bytes (None: the service's default, as the
        benchmarks measure it); a --file-bytes in `extra` wins over it."""
        self.root = root
        self.flush = flush
        self.ready_timeout_s = ready_timeout_s
        # cq_svc replicas read the commit log's segment files (`--commitlog-dir`), as `mqstore
        # up` starts them; False: every pull's records come through the commit log's Read.
        self.local_reads = local_reads
        self.extra = extra or {}
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        sized = [] if segment_bytes is None else ["--file-bytes", str(segment_bytes)]
        self.commitlog = self._process("commitlog_svc", "commitlog", ["--flush", flush, *sized])
        self.followers: dict[str, ServiceProcess] = {}
        self._channels: dict[str, grpc.Channel] = {}

    def _process(self, package: str, name: str, args: list[str]) -> ServiceProcess:
        return ServiceProcess(
            package,
            str(self.root / name),
            args=[*EPHEMERAL, *args, *self.extra.get(package, [])],
            log_path=str(self.logs / f"{name}.log"),
            env={"MQSTORE_TEST_RUN": "1"},
        )

    # -- processes ------------------------------------------------------------------------------

    def start_commitlog(self) -> ServiceProcess:
        self.commitlog.start()
        self.commitlog.wait_listening()
        self.commitlog.wait_ready(self.ready_timeout_s)
        return self.commitlog

    def add(self, package: str, name: str, *args: str) -> ServiceProcess:
        """A follower (cq_svc or index_svc) named `name` (its data dir and subscriber id)."""
        local = ["--commitlog-dir", self.commitlog.data_dir] if package == "cq_svc" else []
        process = self._process(
            package,
            name,
            [
                "--commitlog-target",
                self.commitlog.target,
                "--subscriber-id",
                name,
                *(local if self.local_reads else []),
                *args,
            ],
        )
        self.followers[name] = process
        return process

    def start(self, name: str, *, ready: bool = True) -> ServiceProcess:
        return self.start_many(name, ready=ready)[0]

    def start_many(self, *names: str, ready: bool = True) -> list[ServiceProcess]:
        """Start the followers `names` together, then wait for each: their start-ups
        (interpreter, imports, recovery, catching up, about a second each on an idle CI
        machine) overlap instead of adding up."""
        processes = [self.followers[name] for name in names]
        for process in processes:
            # A restarted commit log has a new port: followers always take the current one.
            at = process.args.index("--commitlog-target") + 1
            process.args[at] = self.commitlog.target
            process.start()
        for process in processes:
            process.wait_listening()
        if ready:
            for process in processes:
                process.wait_ready(self.ready_timeout_s)
        for name in names:
            self._channels.pop(name, None)
        return processes

    def restart_commitlog(self) -> None:
        """Start it again on the ports it had, so that followers find it where they left it."""
        self.commitlog.pin_ports()
        self.commitlog.start()
        self.commitlog.wait_listening()
        self.commitlog.wait_ready(self.ready_timeout_s)
        self._channels.pop("commitlog", None)
        # gRPC shares a connection to one address among this process's channels; one made
        # while the port was closed waits out its reconnect backoff (up to 2 s) before a new
        # channel can use it.
        grpc.channel_ready_future(self._channel("commitlog", self.commitlog.target)).result(
            timeout=READY_TIMEOUT_S
        )

    def stop_all(self) -> dict[str, int]:
        """SIGTERM to the followers (all at once: their shutdowns overlap), then the commit
        log; their exit codes by name."""
        followers = list(self.followers.items())
        for _, process in followers:
            process.signal(signal.SIGTERM)
        # Waited for, not signalled again: a second SIGTERM during interpreter shutdown
        # (default handlers back) would end a cleanly stopping service with -15.
        codes = {name: process.wait_stopped() for name, process in followers}
        codes["commitlog"] = self.commitlog.stop()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        return codes

    # -- stubs ----------------------------------------------------------------------------------

    def _channel(self, key: str, target: str) -> grpc.Channel:
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = make_channel(target)
        return channel

    def commitlog_stub(self) -> commitlog_pb2_grpc.CommitLogStub:
        return commitlog_pb2_grpc.CommitLogStub(self._channel("commitlog", self.commitlog.target))

    def cq_stub(self, name: str) -> consumequeue_pb2_grpc.ConsumeQueueStub:
        return consumequeue_pb2_grpc.ConsumeQueueStub(
            self._channel(name, self.followers[name].target)
        )

    def index_stub(self, name: str) -> index_pb2_grpc.IndexStub:
        return index_pb2_grpc.IndexStub(self._channel(name, self.followers[name].target))


# Small index files: RocketMQ's default 420 MB file per replica is too much for a test.
SMALL_INDEX_ARGS = ("--slot-num", "4096", "--entry-num", "16384")


# Every hour of the day: retention may delete whenever a segment is due.
ALL_HOURS = "[" + ", ".join(str(h) for h in range(24)) + "]"


def expiring_args(segment_bytes: int) -> dict[str, list[str]]:
    """Per-service flags of a store whose small segments retention deletes as soon as the
    followers confirm them (within a fraction of a second)."""
    return {
        "commitlog_svc": [
            "--file-bytes", str(segment_bytes),
            "--warm-ahead-bytes", "0",
            "--file-reserved-hours", "0",
            "--delete-when-hours", ALL_HOURS,
            "--clean-interval-ms", "100",
        ],
        "cq_svc": ["--flush-thorough-interval-ms", "100", "--log-probe-interval-ms", "100"],
        "index_svc": ["--flush-interval-ms", "100"],
    }  # fmt: skip


def start_store(
    root: Path,
    *,
    flush: str = "sync",
    extra: dict[str, list[str]] | None = None,
    local_reads: bool = True,
    segment_bytes: int | None = TEST_SEGMENT_BYTES,
) -> Cluster:
    """commitlog_svc, one cq_svc ("cq") and one index_svc ("index", small files), all ready."""
    return start_all(
        Cluster(
            root, flush=flush, extra=extra, local_reads=local_reads, segment_bytes=segment_bytes
        )
    )


def start_all(c: Cluster) -> Cluster:
    """Start a cluster's three services ("cq" and "index" added here) and wait until ready;
    everything stopped again if any fails to start."""
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index", *SMALL_INDEX_ARGS)
        c.start_many("cq", "index")
    except BaseException:
        c.stop_all()
        raise
    return c
