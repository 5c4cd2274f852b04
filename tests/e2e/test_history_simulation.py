"""A seeded simulation of logs cut and regrown under their followers (issue 23, item 1).

A real commitlog_svc process (async flush, 64 KiB segments) and two followers in this process
(cq_svc's engine and index_svc's engine, each behind the real subscriber loop and its sink).
Random steps, from the seed:

    append      a batch of 1-30 messages to random queues, each with a key of its own (one in
                five also with a key many share)
    pause       a follower stops applying and confirming, mid-stream (SIGSTOP's effect)
    resume      it goes on: its stream may have ended meanwhile, and its confirm thread may
                race its next handshake
    cut         kill -9 the commit log, zero the last N bytes of written data in the newest
                segment (N from 1 byte to past a whole segment's data), start it again:
                recovery cuts the log, and the next appends regrow it at the same offsets
    restart     SIGTERM and start the commit log (a clean new epoch)
    reconnect   close a follower and open it again from its files

After every step at which no follower is paused, once both have handshaken with the running
log and applied to its end: each follower's contents equal a from-scratch rebuild of the log,
both a fresh replica that replays it and the log's records read from its segment files (every
consume-queue unit of every queue; every index entry of every key, unconfirmed). Blank units
are left out of the comparison: when recovery loses durable bytes the queue offsets of the lost
records are not reused (docs/durability.md), and a queue that had units there fills the gap
with blanks where a fresh replica starts the queue past it; neither holds a message there.

A failure names its seed. Replay one with MQSTORE_HISTORY_SIM_SEED=S; run N more seeds with
MQSTORE_HISTORY_SIM_SEEDS=N.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cq_svc.config import CqConfig
from cq_svc.engine import CqEngine
from cq_svc.sink import EngineSink
from cq_svc.watch import QueueWatch
from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.sink import IndexSink
from mqstore.dispatch import DispatchEntry
from mqstore.formats.cq_unit import BLANK_SIZE
from mqstore.formats.properties import decode_properties
from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import history_from_proto
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.subscriber import DispatchSink, Subscriber
from mqstore.storage.logreader import LogDir, RecordEntry
from mqstore.testing.cluster import Cluster

from .support import append

pytestmark = pytest.mark.timeout(900)

SEGMENT_BYTES = 64 * 1024
TOPICS = ("t1", "t2")
QUEUES = 3
HOT_KEY = "hot"
STEPS = 30
CATCH_UP_S = 60.0
WEIGHTS = {
    "append": 8,
    "pause": 2,
    "resume": 3,
    "cut": 2,
    "restart": 1,
    "reconnect": 1,
}
# Bytes zeroed at a cut: inside one record, a few records, past a whole segment's data.
ZEROED = (1, 40, 300, 3_000, 80_000)


class SimulationFailure(AssertionError):
    pass


class PausableSink:
    """A follower's sink that can be frozen between frames: while paused, nothing is applied
    and nothing is read for a Confirm (what SIGSTOP does to the process)."""

    def __init__(self, sink: DispatchSink) -> None:
        self._sink = sink
        self._running = threading.Event()
        self._running.set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def _gate(self) -> None:
        self._running.wait()

    @property
    def store_id(self) -> bytes:
        self._gate()
        return self._sink.store_id

    @property
    def confirmed_offset(self) -> int:
        self._gate()
        return self._sink.confirmed_offset

    @property
    def applied_offset(self) -> int:
        return self._sink.applied_offset

    @property
    def history(self) -> LogHistory:
        self._gate()
        return self._sink.history

    def on_handshake(
        self,
        store_id: bytes,
        min_offset: int,
        max_offset: int,
        truncate_offset: int,
        history: LogHistory,
    ) -> None:
        self._gate()
        self._sink.on_handshake(store_id, min_offset, max_offset, truncate_offset, history)

    def on_batch(self, entries: Sequence[DispatchEntry], next_offset: int) -> None:
        self._gate()
        self._sink.on_batch(entries, next_offset)


class Follower:
    """cq_svc's or index_svc's engine in this process, following the log as the service does."""

    def __init__(self, kind: str, root: Path, target: str) -> None:
        self.kind = kind
        self.root = root
        self.target = target
        self.sink: PausableSink | None = None
        self.subscriber: Subscriber | None = None
        self.cq: CqEngine | None = None
        self.index: IndexEngine | None = None

    def open(self) -> None:
        inner: DispatchSink
        if self.kind == "cq":
            self.cq = CqEngine(
                CqConfig(
                    data_dir=str(self.root / "cq"),
                    units_per_file=200,
                    flush_interval_ms=20,
                    flush_thorough_interval_ms=50,
                )
            )
            self.cq.open()
            inner = EngineSink(self.cq, QueueWatch(1_000))
        else:
            self.index = IndexEngine(
                IndexConfig(
                    data_dir=str(self.root / "index"),
                    slot_num=512,
                    entry_num=4_096,
                    exact=True,
                    flush_interval_ms=50,
                )
            )
            self.index.open()
            inner = IndexSink(self.index)
        self.sink = PausableSink(inner)
        self.subscriber = Subscriber(
            self.target, self.kind, self.sink, include_keys=self.kind == "index"
        )
        self.subscriber.start()

    def close(self) -> None:
        assert self.sink is not None and self.subscriber is not None
        self.sink.resume()
        if self.cq is not None:
            self.subscriber.stop(flush=self.cq.flush)
            self.cq.close()
            self.cq = None
        else:
            assert self.index is not None
            self.subscriber.stop(flush=self.index.flush)
            self.index.close()
            self.index = None

    @property
    def paused(self) -> bool:
        return self.sink is not None and self.sink.paused

    def in_step_with(self, end: int, history: LogHistory) -> bool:
        """Handshaken with the running log (its history is the log's) and applied to its end."""
        if self.cq is not None:
            return self.cq.history == history and self.cq.store.applied_offset >= end
        assert self.index is not None
        return self.index.history == history and self.index.applied_offset >= end

    def contents(self, keys: Sequence[str]) -> object:
        if self.cq is not None:
            store = self.cq.store
            return {
                (topic, qid): [
                    (u.queue_offset, u.commit_log_offset, u.size)
                    for u in store.read_units(topic, qid, 0, 1 << 30)
                ]
                for topic in store.list_topics()
                for qid in store.list_queues(topic)
                if store.max_offset(topic, qid) > store.min_offset(topic, qid)
            }
        assert self.index is not None
        found = {}
        for topic in TOPICS:
            for key in keys:
                offsets = self.index.query(topic, key, 0, 1 << 62, 1_024)
                if offsets:
                    found[(topic, key)] = sorted(offsets)
        return found


def _difference(got: object, expected: object) -> str:
    assert isinstance(got, dict) and isinstance(expected, dict)
    lines = []
    for key in sorted(set(got) | set(expected)):
        g, e = got.get(key, []), expected.get(key, [])
        if g != e:
            lines.append(
                f"{key}: only held {sorted(set(g) - set(e))[:6]}, only in the log "
                f"{sorted(set(e) - set(g))[:6]}"
            )
    return "\n".join(lines[:10])


def _without_blanks(units: object) -> object:
    assert isinstance(units, dict)
    kept = {key: [u for u in queue if u[2] != BLANK_SIZE] for key, queue in units.items()}
    return {key: queue for key, queue in kept.items() if queue}


def rebuild(segments_dir: str, end: int) -> tuple[object, object]:
    """What a follower that replayed the whole log holds: the units of every queue and the
    offsets of every key."""
    units: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    keys: dict[tuple[str, str], list[int]] = {}
    if end == 0:
        return units, keys
    for entry in LogDir(segments_dir).scan():
        if entry.offset >= end:
            break
        if not isinstance(entry, RecordEntry):
            continue
        r = entry.record
        units.setdefault((r.topic, r.queue_id), []).append(
            (r.queue_offset, r.physical_offset, r.total_size)
        )
        for token in decode_properties(r.properties).get("KEYS", "").split(" "):
            if token:
                keys.setdefault((r.topic, token), []).append(r.physical_offset)
    return units, {k: sorted(v) for k, v in keys.items()}


@dataclass
class Sim:
    seed: int
    root: Path
    steps: int = STEPS
    rng: random.Random = field(init=False)
    trace: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=lambda: [HOT_KEY])
    sent = 0
    checks = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.cluster = Cluster(
            self.root,
            flush="async",
            extra={
                "commitlog_svc": ["--file-bytes", str(SEGMENT_BYTES), "--warm-ahead-bytes", "0"]
            },
        )

    def fail(self, why: str) -> SimulationFailure:
        return SimulationFailure(
            f"seed {self.seed}: {why}\nsteps: {' '.join(self.trace)}\n"
            f"(replay: MQSTORE_HISTORY_SIM_SEED={self.seed})"
        )

    def status(self) -> cl.GetStatusResponse:
        response: cl.GetStatusResponse = self.cluster.commitlog_stub().GetStatus(
            cl.GetStatusRequest(), timeout=10
        )
        return response

    # -- steps ------------------------------------------------------------------------------------

    def append(self) -> None:
        count = self.rng.randint(1, 30)
        topic = self.rng.choice(TOPICS)
        keys = []
        for _ in range(count):
            own = f"m{self.sent}"
            self.sent += 1
            self.keys.append(own)
            keys.append(f"{own} {HOT_KEY}" if self.rng.random() < 0.2 else own)
        append(
            self.cluster.commitlog_stub(),
            topic,
            [self.rng.randrange(QUEUES) for _ in range(count)],
            [os.urandom(self.rng.randint(1, 400)) for _ in range(count)],
            keys=keys,
        )

    def cut(self) -> None:
        end = self.status().max_offset
        self.cluster.commitlog.kill()
        segments = os.path.join(self.cluster.commitlog.data_dir, "commitlog")
        newest = max(name for name in os.listdir(segments) if name.isdigit())
        written = end - int(newest)
        zeroed = min(self.rng.choice(ZEROED), written)
        if zeroed > 0:
            with open(os.path.join(segments, newest), "r+b") as f:
                f.seek(written - zeroed)
                f.write(bytes(zeroed))
        self.trace[-1] += f"({zeroed})"
        self.cluster.restart_commitlog()

    def restart(self) -> None:
        self.cluster.commitlog.stop()
        self.cluster.restart_commitlog()

    def check(self, followers: Sequence[Follower]) -> None:
        """Both followers in step with the log hold what a fresh replica that replays the
        whole log holds (blank units included: a queue whose first offsets the log lost
        starts with blanks), and their real units and keys are the log's records."""
        status = self.status()
        end, history = status.max_offset, history_from_proto(status.history)
        self.checks += 1
        fresh = [
            Follower(f.kind, self.root / f"fresh{self.checks}", self.cluster.commitlog.target)
            for f in followers
        ]
        for follower in fresh:
            follower.open()
        try:
            deadline = time.monotonic() + CATCH_UP_S
            while not all(f.in_step_with(end, history) for f in (*followers, *fresh)):
                if time.monotonic() > deadline:
                    raise self.fail(f"the followers did not reach {end} in {history}")
                time.sleep(0.02)
            units, keys = rebuild(os.path.join(self.cluster.commitlog.data_dir, "commitlog"), end)
            for follower, replica in zip(followers, fresh, strict=True):
                got = follower.contents(self.keys)
                replayed = replica.contents(self.keys)
                if follower.kind == "cq":
                    got, replayed = _without_blanks(got), _without_blanks(replayed)
                if got != replayed:
                    raise self.fail(
                        f"{follower.kind} differs from a fresh replay of the log at {end}: "
                        + _difference(got, replayed)
                    )
                expected = keys if follower.kind == "index" else units
                if got != expected:
                    raise self.fail(
                        f"{follower.kind} differs from the log's records at {end}: "
                        + _difference(got, expected)
                    )
        finally:
            for follower in fresh:
                follower.close()
            shutil.rmtree(self.root / f"fresh{self.checks}", ignore_errors=True)

    def run(self) -> None:
        self.cluster.start_commitlog()
        followers = [
            Follower(kind, self.root, self.cluster.commitlog.target) for kind in ("cq", "index")
        ]
        for follower in followers:
            follower.open()
        try:
            for _ in range(self.steps):
                step = self.rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
                chosen = self.rng.choice(followers)
                self.trace.append(
                    step + (f":{chosen.kind}" if step in ("pause", "resume", "reconnect") else "")
                )
                if step == "append":
                    self.append()
                elif step == "pause" and not chosen.paused:
                    assert chosen.sink is not None
                    chosen.sink.pause()
                elif step == "resume" and chosen.sink is not None:
                    chosen.sink.resume()
                elif step == "cut":
                    self.cut()
                elif step == "restart":
                    self.restart()
                elif step == "reconnect":
                    chosen.close()
                    chosen.open()
                if not any(f.paused for f in followers):
                    self.check(followers)
            for follower in followers:
                assert follower.sink is not None
                follower.sink.resume()
            self.append()
            self.check(followers)
        finally:
            for follower in followers:
                follower.close()
            self.cluster.stop_all()


def seeds() -> list[int]:
    if "MQSTORE_HISTORY_SIM_SEED" in os.environ:
        return [int(os.environ["MQSTORE_HISTORY_SIM_SEED"])]
    extra = int(os.environ.get("MQSTORE_HISTORY_SIM_SEEDS", "0"))
    return [23, *range(1000, 1000 + extra)]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


@pytest.mark.parametrize("seed", seeds())
def test_followers_equal_a_rebuild_of_the_log_after_every_cut_regrow_and_reconnect(
    root: Path, seed: int
) -> None:
    Sim(seed, root / f"s{seed}").run()
