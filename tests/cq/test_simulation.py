"""A seeded simulation of dispatch / flush / truncate / expire / crash / recover against a
plain-list model, on both stores. A failure prints its seed; rerun one with
`pytest tests/cq/test_simulation.py -k "seed-N"`, and run more seeds with CQ_SIM_SEEDS=300
(300 seeds of each store passed before this was committed).

The file store runs on the simulated disk and loses (drop), keeps (keep) or tears and garbles
sector by sector (random) whatever was not flushed when it crashes; the RocksDB store runs
in a real directory and is reopened without a flush (a process crash: the WAL written to the
page cache survives).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import make_store
from cq_svc.store import CqStore, PullStatus, put_entries
from mqstore.dispatch import DispatchEntry
from mqstore.formats.cq_time import Boundary
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk

QUEUES = [("A", 0), ("A", 1), ("B", 0)]
STEPS = 120


@dataclass
class Model:
    """The commit log as the store should see it: every entry, in phy order."""

    log: list[DispatchEntry] = field(default_factory=list)
    sent: int = 0  # entries [0, sent) were dispatched
    min_phy: int = 0
    next_phy: int = 0

    def append(self, rng: random.Random, n: int) -> None:
        counts: dict[tuple[str, int], int] = {}
        for e in self.log:
            counts[(e.topic, e.queue_id)] = e.queue_offset + 1
        last_time = self.log[-1].store_timestamp_ms if self.log else 1_000
        for _ in range(n):
            topic, qid = rng.choice(QUEUES)
            size = rng.randint(50, 300)
            # Store times mostly rise, sometimes go back (clock skew), sometimes repeat.
            last_time += rng.choice([0, 1, 5, 20, -30])
            qo = counts.get((topic, qid), 0)
            counts[(topic, qid)] = qo + 1
            self.log.append(
                DispatchEntry(topic, qid, qo, self.next_phy, size, rng.randint(1, 3), last_time)
            )
            self.next_phy += size

    def truncate(self, phy: int) -> None:
        self.log = [e for e in self.log if e.commit_log_offset < phy]
        self.sent = min(self.sent, len(self.log))
        self.next_phy = phy

    def resend_from(self, confirmed: int) -> None:
        self.sent = sum(1 for e in self.log if e.end_offset <= confirmed)

    def units(self, topic: str, qid: int) -> list[DispatchEntry]:
        return [e for e in self.log[: self.sent] if (e.topic, e.queue_id) == (topic, qid)]


def indexed_times(units: list[DispatchEntry]) -> list[int]:
    out, top = [], 0
    for u in units:
        top = max(top, u.store_timestamp_ms)
        out.append(top)
    return out


def expected_time_offset(times: list[int], lo: int, hi: int, t: int, boundary: Boundary) -> int:
    if boundary is Boundary.LOWER:
        found = next((i for i in range(lo, hi) if times[i] >= t), hi)
    else:
        found = max((i for i in range(lo, hi) if times[i] <= t), default=0)
    return min(max(found, lo), hi) if hi > lo or hi == lo else found


class Runner:
    def __init__(self, kind: StoreKind, tmp: Path, seed: int) -> None:
        self.kind = kind
        self.rng = random.Random(seed)
        self.disk = SimDisk() if kind is StoreKind.FILE else None
        data_dir = "/sim" if kind is StoreKind.FILE else str(tmp / "sim")
        self.config = CqConfig.for_tests(
            data_dir, cq_store=kind, units_per_file=16, open_maps_max=8
        )
        self.clock = ManualClock()
        self.model = Model()
        self.store = self._open()

    def _open(self) -> CqStore:
        store = make_store(self.config, disk=self.disk, clock=self.clock)
        store.open()
        return store

    def crash(self) -> None:
        if self.disk is not None:
            self.disk.crash(self.rng, self.rng.choice(["drop", "keep", "random"]))
        else:
            # RocksDB: the process dies; what reached the WAL survives. Closing without the
            # store's own flush is the nearest an in-process test gets (the LOCK must go).
            self.store._release_db()  # type: ignore[attr-defined]
        self.store = self._open()
        # The start-up handshake: the log re-sends from the confirmed offset and tells the
        # current minimum.
        self.model.resend_from(self.store.confirmed_offset)
        self.store.correct_min_offset(self.model.min_phy)

    def step(self) -> str:
        rng, model, store = self.rng, self.model, self.store
        op = rng.choices(
            ["append", "dispatch", "resend", "flush", "crash", "truncate", "expire"],
            weights=[5, 6, 2, 2, 2, 1, 1],
        )[0]
        if op == "append":
            model.append(rng, rng.randint(1, 30))
        elif op in ("dispatch", "resend"):
            start = model.sent if op == "dispatch" else rng.randint(0, model.sent)
            stop = min(len(model.log), model.sent + rng.randint(1, 40))
            if stop > start:
                put_entries(store, model.log[start:stop])
                model.sent = max(model.sent, stop)
        elif op == "flush":
            assert (
                store.flush()
                == max(
                    (e.end_offset for e in model.log[: model.sent]), default=store.confirmed_offset
                )
                or model.sent == 0
            )
        elif op == "crash":
            self.crash()
        elif op == "truncate" and model.log:
            candidates = [
                e.commit_log_offset for e in model.log if e.commit_log_offset >= model.min_phy
            ]
            if candidates:
                cut = rng.choice(candidates)
                store.truncate_dirty(cut)
                model.truncate(cut)
        elif op == "expire" and model.sent:
            floor = rng.choice(model.log[: model.sent]).commit_log_offset
            # The log never deletes above the lowest confirmed subscriber offset (DESIGN.md).
            if model.min_phy < floor <= store.confirmed_offset:
                model.min_phy = floor
                store.delete_expired(floor)
        return op

    def check(self) -> None:
        store, model = self.store, self.model
        for topic, qid in QUEUES:
            want = model.units(topic, qid)
            times = indexed_times(want)
            hi = len(want)
            lo = next((i for i, e in enumerate(want) if e.commit_log_offset >= model.min_phy), hi)
            assert store.max_offset(topic, qid) == hi, (topic, qid)
            assert store.min_offset(topic, qid) == lo, (topic, qid)
            got = store.read_units(topic, qid, lo, 10_000)
            assert [(u.queue_offset, u.commit_log_offset, u.size, u.tags_code) for u in got] == [
                (e.queue_offset, e.commit_log_offset, e.size, e.tags_code) for e in want[lo:]
            ], (topic, qid)
            # Indexed times: non-decreasing, never below the message's own time, never above
            # the true running maximum (the running maximum restarts where a truncation left
            # no retained unit before it, so it may be lower than the model's, never higher).
            indexed = [u.store_timestamp_ms for u in got]
            assert indexed == sorted(indexed), (topic, qid)
            for u, e, top in zip(got, want[lo:], times[lo:], strict=True):
                assert e.store_timestamp_ms <= u.store_timestamp_ms <= top, (topic, qid)
            if hi > lo:
                full = [0] * lo + indexed
                t = self.rng.randint(indexed[0] - 10, indexed[-1] + 10)
                for b in Boundary:
                    assert store.get_offset_by_time(topic, qid, t, b) == expected_time_offset(
                        full, lo, hi, t, b
                    ), (topic, qid, t, b)
                off = self.rng.randint(lo, hi - 1)
                pulled = store.pull(topic, qid, off, 8, 1 << 20)
                assert pulled.status is PullStatus.FOUND
                assert pulled.units[0].queue_offset == off
            elif hi:
                assert (
                    store.pull(topic, qid, hi, 8, 1 << 20).status is PullStatus.OFFSET_OVERFLOW_ONE
                )


@pytest.mark.parametrize(
    "seed", range(int(os.environ.get("CQ_SIM_SEEDS", "5"))), ids=lambda s: f"seed-{s}"
)
@pytest.mark.parametrize("kind", [StoreKind.FILE, StoreKind.ROCKSDB], ids=["file", "rocksdb"])
def test_simulation_matches_the_model(kind: StoreKind, seed: int, tmp_path: Path) -> None:
    runner = Runner(kind, tmp_path, seed)
    trail: list[str] = []
    try:
        for _ in range(STEPS):
            trail.append(runner.step())
            runner.check()
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} ({kind}) after {trail[-8:]}: {exc}") from exc
    finally:
        runner.store.close()
