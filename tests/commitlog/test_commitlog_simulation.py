"""A seeded, replayable simulation of the commit log on a SimDisk against a plain list model.

Random operations: append batches (random topics, queues, body and property sizes), read back,
flush (async: move the clock so that the flush thread flushes and checkpoints), power loss
(crash modes drop / keep / random) and restart, clean restart. After every restart the store
is compared with the model:

- sync flush: every PUT_OK message is there, at its offset, with its bytes and queue offset;
- async flush: every message below the flushed offset at the crash survives;
- what survives is the model's dense prefix (no holes; queue offsets dense per queue) and
  nothing else: no record the model does not hold is ever returned;
- the queue-offset table continues from the survivors, so new appends take the next offset.

"random" crashes keep, drop, tear or garble each unflushed 512-byte sector; bytes that were
durable stay (SimDisk writes a sector whole), so the invariants are the same for every mode.

A failure names its seed. Run more seeds with MQSTORE_SIM_SEEDS=N (seeds 1000..1000+N-1), or
replay one with MQSTORE_SIM_SEED=S. Those runs add more async flush runs with "random" crashes.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import NoReturn

import pytest
from commitlog_testlib import Stored, open_log, reopen, sim_crash, stored_from

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from mqstore.errors import MqstoreError
from mqstore.formats.commitlog_checkpoint import decode_checkpoint
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import CrashMode, SimDisk
from tests.commitlog.message_in import MessageIn, as_batches

DATA_DIR = "/sim"
FILE = 4096
STEPS = 150
TOPICS = ("alpha", "beta", "gamma")
QUEUES = 3
WAIT_S = 10.0


class SimulationFailure(AssertionError):
    pass


@dataclass
class Sim:
    seed: int
    mode: FlushMode
    crash_modes: tuple[CrashMode, ...] = ("drop", "keep", "random")
    steps: int = STEPS
    rng: random.Random = field(init=False)
    clock: ManualClock = field(default_factory=ManualClock)
    disk: SimDisk = field(init=False)
    log: CommitLog = field(init=False)
    model: list[Stored] = field(default_factory=list)
    next_queue_offset: dict[tuple[str, int], int] = field(default_factory=dict)
    counter: int = 0
    history: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.disk = SimDisk(clock_ms=self.clock.now_ms)
        self.log = open_log(DATA_DIR, disk=self.disk, clock=self.clock, flush=self.mode)

    def fail(self, message: str) -> NoReturn:
        recent = "; ".join(self.history[-8:])
        raise SimulationFailure(
            f"seed {self.seed} ({self.mode.value}, crashes {'/'.join(self.crash_modes)}): "
            f"{message}\n  last steps: {recent}\n  replay: MQSTORE_SIM_SEED={self.seed}"
        )

    # -- operations --------------------------------------------------------------------------

    def new_message(self) -> MessageIn:
        rng = self.rng
        self.counter += 1
        props = b""
        if rng.random() < 0.7:
            props = encode_properties({"KEYS": f"k{self.counter}", "TAGS": rng.choice("xyz")})
        return MessageIn(
            topic=rng.choice(TOPICS),
            queue_id=rng.randrange(QUEUES),
            body=rng.randbytes(rng.choice((0, 1, 50, 300, 900))),
            properties=props,
            born_timestamp_ms=self.counter,
        )

    def append(self) -> None:
        batch = [self.new_message() for _ in range(self.rng.randint(1, 4))]
        result = self.log.append_batch(as_batches(batch))
        self.history.append(f"append {len(batch)} -> {result.status.name} at {result.offsets}")
        if not result.ok:
            self.fail(f"append refused: {result.statuses} {result.reasons}")
        for s in stored_from(result, batch):
            key = (s.message.topic, s.message.queue_id)
            expected = self.next_queue_offset.get(key, 0)
            if s.queue_offset != expected:
                self.fail(f"append got queue offset {s.queue_offset} in {key}, not {expected}")
            self.next_queue_offset[key] = expected + 1
            if self.model and s.offset < self.model[-1].end:
                self.fail(f"append at {s.offset} overlaps the model's end {self.model[-1].end}")
            self.model.append(s)

    def read(self) -> None:
        if not self.model:
            return
        s = self.rng.choice(self.model)
        self.history.append(f"read {s.offset}")
        self.check_record(s)

    def flush(self) -> None:
        """Let the flush thread flush everything and checkpoint it (async: the only flushes)."""
        config = self.log.config
        target = self.log.max_offset
        self.history.append(f"flush to {target}")
        self.clock.advance(max(config.flush_thorough_interval_ms, config.checkpoint_interval_ms))
        flusher = self.log._flusher
        assert flusher is not None
        flusher.wake()
        deadline = time.monotonic() + WAIT_S
        while self.log.flushed_offset < target or self.checkpoint_offset() < target:
            if time.monotonic() > deadline:
                self.fail(f"flush to {target} did not happen")
            time.sleep(0.001)

    def checkpoint_offset(self) -> int:
        return decode_checkpoint(self.disk.read(f"{DATA_DIR}/checkpoint")).flushed_offset

    def crash(self) -> None:
        mode = self.rng.choice(self.crash_modes)
        flushed = sim_crash(self.log, self.disk, self.rng, mode)
        self.history.append(f"crash {mode} flushed={flushed}")
        if self.mode is FlushMode.SYNC and self.model and flushed < self.model[-1].end:
            self.fail(f"sync flush acknowledged past the flushed offset {flushed}")
        self.log = reopen(self.log, disk=self.disk, clock=self.clock)
        self.verify_after_restart(flushed, mode)

    def restart(self) -> None:
        self.history.append("clean restart")
        self.log.close()
        self.log = reopen(self.log, disk=self.disk, clock=self.clock)
        self.verify_after_restart(self.model[-1].end if self.model else 0, "keep")

    # -- checks ------------------------------------------------------------------------------

    def check_record(self, s: Stored) -> None:
        try:
            record = self.log.read_record(s.offset)
        except MqstoreError as exc:
            self.fail(f"read of {s.offset} failed: {exc!r}")
        self.check_same(record, s)

    def check_same(self, record: Record, s: Stored) -> None:
        m = s.message
        got = (record.physical_offset, record.total_size, record.queue_offset, record.topic)
        want = (s.offset, s.size, s.queue_offset, m.topic)
        if got != want or (record.queue_id, record.body, record.properties) != (
            m.queue_id,
            m.body,
            m.properties,
        ):
            self.fail(f"record at {s.offset} differs from the model: {record!r}")

    def verify_after_restart(self, flushed: int, mode: CrashMode) -> None:
        log = self.log
        end = log.max_offset
        by_offset = {s.offset: s for s in self.model}
        survivors: list[Stored] = []
        offset = log.min_offset
        while offset < end:
            batch = log.scan(offset, end_offset=end, check_crc=True)
            if batch.corrupt:
                self.fail(f"corrupt ranges {batch.corrupt} after a {mode} crash")
            for record in batch.records:
                s = by_offset.get(record.physical_offset)
                if s is None:
                    self.fail(f"a record the model never had at {record.physical_offset}")
                self.check_same(record, s)
                survivors.append(s)
            if batch.next_offset <= offset:
                self.fail(f"scan made no progress at {offset}")
            offset = batch.next_offset
        if survivors != self.model[: len(survivors)]:
            self.fail("the surviving messages are not a prefix of the model")
        lost = self.model[len(survivors) :]
        if lost and lost[0].end <= flushed:
            self.fail(f"message at {lost[0].offset} lost below the flushed offset {flushed}")
        if mode == "keep" and lost:
            self.fail(f"{len(lost)} messages lost although every write reached the disk")
        if mode == "drop" and survivors != [s for s in self.model if s.end <= flushed]:
            self.fail("after a drop crash the log is not exactly the flushed prefix")
        if end != (survivors[-1].end if survivors else 0) and not (
            survivors and end == survivors[-1].end - survivors[-1].end % FILE + FILE
        ):
            self.fail(f"the log ends at {end}, not after its last record")
        for s in survivors:
            self.check_record(s)
        self.check_queue_offsets(survivors)
        self.model = survivors
        self.next_queue_offset = log.queue_offsets()

    def check_queue_offsets(self, survivors: list[Stored]) -> None:
        """Dense per queue, and the table continues right after the survivors."""
        per_queue: dict[tuple[str, int], list[int]] = {}
        for s in survivors:
            per_queue.setdefault((s.message.topic, s.message.queue_id), []).append(s.queue_offset)
        for key in {*per_queue, *self.log.queue_offsets()}:
            offsets = per_queue.get(key, [])
            nxt = self.log.queue_offset(*key)
            if offsets != list(range(len(offsets))) or nxt != len(offsets):
                self.fail(f"queue {key}: offsets {offsets} not dense or next offset {nxt} wrong")

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> None:
        try:
            for _ in range(self.steps):
                roll = self.rng.random()
                if roll < 0.55:
                    self.append()
                elif roll < 0.70:
                    self.read()
                elif roll < 0.82:
                    self.flush()
                elif roll < 0.94:
                    self.crash()
                else:
                    self.restart()
            self.restart()
        finally:
            if self.log.running:
                self.log.close()


def _extra_seeds() -> list[int]:
    if os.environ.get("MQSTORE_SIM_SEED"):
        return [int(os.environ["MQSTORE_SIM_SEED"])]
    return list(range(1000, 1000 + int(os.environ.get("MQSTORE_SIM_SEEDS", "0"))))


SEEDS = [1, 2, 3, 4, 5]


@pytest.mark.parametrize("seed", SEEDS + _extra_seeds())
def test_simulation_sync_flush_with_every_crash_mode(seed: int) -> None:
    Sim(seed, FlushMode.SYNC).run()


@pytest.mark.parametrize("seed", SEEDS + _extra_seeds())
def test_simulation_async_flush_with_drop_and_keep_crashes(seed: int) -> None:
    Sim(seed, FlushMode.ASYNC, ("drop", "keep")).run()


ONLY_ON_REQUEST = pytest.param(
    0, marks=pytest.mark.skip(reason="runs with MQSTORE_SIM_SEEDS=N or MQSTORE_SIM_SEED=S")
)


@pytest.mark.parametrize("seed", _extra_seeds() or [ONLY_ON_REQUEST])
def test_simulation_async_flush_with_random_crashes(seed: int) -> None:
    """Only with MQSTORE_SIM_SEEDS / MQSTORE_SIM_SEED: many more seeds of the case below."""
    Sim(seed, FlushMode.ASYNC, ("random",)).run()


def _first_failure(kind: str, seeds: range) -> None:
    """Run async simulations with random crashes until one fails with a message containing
    `kind`, and raise that failure; return if none does."""
    for seed in seeds:
        try:
            Sim(seed, FlushMode.ASYNC, ("random",)).run()
        except SimulationFailure as failure:
            if kind in str(failure):
                raise
    return


def test_simulation_async_random_crashes_never_keep_a_torn_record() -> None:
    """Torn writes that leave the body intact (zeros in the topic or properties) once passed
    every check; 40 seeds of random crashes must find no such record kept."""
    _first_failure("differs from the model", range(40))
