"""A seeded simulation of receive / ack / change-invisible / idle fold / crash against a model,
under `ack_flush: sync`: after any crash nothing acknowledged comes back and every receipt the
model holds is still current. CQ_SIM_SEEDS=300 runs more seeds (300 passed)."""

from __future__ import annotations

import os
import random

import pytest

from cq_svc.config import CqConfig
from cq_svc.engine import CqEngine
from cq_svc.errors import ReceiptExpired
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.cq.support import ack, apply, entries

G = "g"
MESSAGES = 120


def start(disk: SimDisk, clock: ManualClock) -> CqEngine:
    config = CqConfig.for_tests(
        "/d", ack_journal_entries_max=24, ack_segment_entries=8, ack_window_max=40
    )
    engine = CqEngine(config, disk=disk, clock=clock)
    engine.open(flush_thread=False)
    return engine


@pytest.mark.parametrize(
    "seed", range(int(os.environ.get("CQ_SIM_SEEDS", "8"))), ids=lambda s: f"seed-{s}"
)
def test_ack_state_matches_the_model_across_crashes(seed: int) -> None:
    rng = random.Random(seed)
    disk, clock = SimDisk(), ManualClock()
    engine = start(disk, clock)
    apply(engine, entries(MESSAGES))
    engine.store.flush()
    # offset -> (delivery count, deadline ms); acked offsets are in `acked`
    inflight: dict[int, tuple[int, int]] = {}
    acked: set[int] = set()
    for step in range(300):
        op = rng.choice(["receive", "receive", "ack", "ack", "change", "tick", "fold", "crash"])
        now = clock.now_ms()
        if op == "receive":
            got = engine.receive(G, "T", 0, rng.randint(1, 6), rng.randint(50, 500))
            for r in got:
                d = r.delivery
                assert d.queue_offset not in acked, (seed, step, "acked message redelivered")
                if d.queue_offset in inflight:
                    count, deadline = inflight[d.queue_offset]
                    assert deadline <= now and d.delivery_count == count + 1, (seed, step)
                else:
                    assert d.delivery_count == 1, (seed, step)
                inflight[d.queue_offset] = (d.delivery_count, d.deadline_ms)
        elif op == "ack" and inflight:
            offs = rng.sample(sorted(inflight), k=min(len(inflight), rng.randint(1, 4)))
            ack(engine, G, "T", 0, [(o, inflight[o][0]) for o in offs])
            for o in offs:
                acked.add(o)
                del inflight[o]
        elif op == "change" and inflight:
            o = rng.choice(sorted(inflight))
            count, _ = inflight[o]
            d = engine.acks.change_invisible((G, "T", 0), o, count, rng.randint(10, 800))
            inflight[o] = (count, d.deadline_ms)
        elif op == "tick":
            clock.advance(rng.randint(1, 300))
        elif op == "fold":
            clock.advance(engine.config.ack_idle_ms)
            engine.acks.fold_idle()
        elif op == "crash":
            disk.crash(rng, "drop")
            engine = start(disk, clock)
        floor = min((o for o in range(MESSAGES + 1) if o not in acked), default=MESSAGES)
        if inflight or acked:
            assert engine.fetch_offset(G, "T", 0) == floor, (seed, step, op)
        if acked and rng.random() < 0.2:  # an old receipt of an acked message is harmless
            o = rng.choice(sorted(acked))
            try:
                ack(engine, G, "T", 0, [(o, 1)])
            except ReceiptExpired:
                pass
    engine.close()
