"""Consumer groups: committed offsets, and receive / ack / change-invisible-duration with the
journal + segments state (acks.py), on the simulated disk with a hand-moved clock."""

from __future__ import annotations

import random
import struct

import crc32c
import pytest

from cq_svc import ack_journal
from cq_svc.ack_journal import JournalEntry, Kind
from cq_svc.config import AckFlush, CqConfig
from cq_svc.engine import CqEngine
from cq_svc.errors import ReceiptExpired
from mqstore.errors import CorruptFile
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import SimDisk
from tests.cq.support import ack, apply, entries

DATA = "/d"
G = "g1"
ACK_DIR = f"{DATA}/groups/acks/{G}/T/0"


class World:
    def __init__(self, **overrides: object) -> None:
        self.disk = SimDisk()
        self.clock = ManualClock()
        self.config = CqConfig.for_tests(DATA, **overrides)
        self.engine = self.start()

    def start(self) -> CqEngine:
        engine = CqEngine(self.config, disk=self.disk, clock=self.clock)
        engine.open(flush_thread=False)
        return engine

    def crash(self, mode: str = "drop") -> None:
        self.disk.crash(random.Random(7), mode)  # type: ignore[arg-type]
        self.engine = self.start()

    def restart(self) -> None:
        self.engine.close()
        self.engine = self.start()

    def load(self, n: int) -> None:
        apply(self.engine, entries(n))
        self.engine.store.flush()

    def receive(self, n: int, invisible_ms: int = 1000) -> list[tuple[int, int]]:
        got = self.engine.receive(G, "T", 0, n, invisible_ms)
        return [(r.delivery.queue_offset, r.delivery.delivery_count) for r in got]


@pytest.fixture
def world() -> World:
    w = World()
    w.load(100)
    w.engine.store.flush()
    return w


def test_received_messages_are_invisible_until_their_deadline_then_redelivered(
    world: World,
) -> None:
    assert world.receive(3) == [(0, 1), (1, 1), (2, 1)]
    assert world.receive(2) == [(3, 1), (4, 1)]
    world.clock.advance(999)
    assert world.receive(1) == [(5, 1)]
    world.clock.advance(1)
    assert world.receive(2) == [(0, 2), (1, 2)]
    got = world.engine.receive(G, "T", 0, 1, 1000)
    assert got[0].unit.commit_log_offset == 200  # what the service fetches from the log


def test_the_committed_offset_is_the_lowest_offset_not_acked(world: World) -> None:
    world.receive(5)
    assert world.engine.fetch_offset(G, "T", 0) == 0
    assert ack(world.engine, G, "T", 0, [(1, 1), (2, 1)]) == 0
    assert ack(world.engine, G, "T", 0, [(0, 1)]) == 3
    assert world.engine.fetch_offset(G, "T", 0) == 3
    world.restart()
    assert world.engine.fetch_offset(G, "T", 0) == 3
    world.clock.advance(5000)
    assert world.receive(10) == [(3, 2), (4, 2), *[(i, 1) for i in range(5, 13)]]


def test_an_ack_naming_an_older_delivery_is_refused_and_a_repeat_ack_is_fine(world: World) -> None:
    world.receive(2)
    world.clock.advance(2000)
    assert world.receive(1) == [(0, 2)]
    with pytest.raises(ReceiptExpired):
        ack(world.engine, G, "T", 0, [(0, 1)])
    with pytest.raises(ReceiptExpired):
        ack(world.engine, G, "T", 0, [(50, 1)])  # never delivered
    ack(world.engine, G, "T", 0, [(0, 2)])
    ack(world.engine, G, "T", 0, [(0, 2)])
    ack(world.engine, G, "T", 0, [(1, 1)])  # a delivery past its deadline but not yet redelivered
    assert world.engine.fetch_offset(G, "T", 0) == 2


def test_change_invisible_duration_moves_the_deadline(world: World) -> None:
    world.receive(1)
    world.engine.acks.change_invisible((G, "T", 0), 0, 1, 5000)
    world.clock.advance(1000)
    assert world.receive(1) == [(1, 1)]
    world.clock.advance(4000)
    assert world.receive(2) == [(1, 2), (0, 2)]  # in deadline order: 2000, then 5000
    with pytest.raises(ReceiptExpired):
        world.engine.acks.change_invisible((G, "T", 0), 0, 1, 5000)
    ack(world.engine, G, "T", 0, [(0, 2)])
    with pytest.raises(ReceiptExpired):
        world.engine.acks.change_invisible((G, "T", 0), 0, 2, 5000)


def test_receive_starts_at_a_committed_offset_and_never_past_the_window() -> None:
    w = World(ack_window_max=10)
    w.load(100)
    w.engine.commit_offset(G, "T", 0, 40)
    assert [o for o, _ in w.receive(32)] == list(range(40, 50))
    assert w.receive(32) == []
    ack(w.engine, G, "T", 0, [(40, 1), (41, 1)])
    assert [o for o, _ in w.receive(32)] == [50, 51]


def test_a_group_behind_expired_messages_skips_to_the_queue_minimum(world: World) -> None:
    world.receive(3)
    world.engine.store.delete_expired(6000)
    assert world.engine.store.min_offset("T", 0) == 60
    assert [o for o, _ in world.receive(2)] == [60, 61]
    assert world.engine.fetch_offset(G, "T", 0) == 60


def test_the_journal_folds_into_segments_and_all_acked_segments_are_deleted() -> None:
    w = World(ack_journal_entries_max=20, ack_segment_entries=16)
    w.load(100)
    for _ in range(4):
        got = w.receive(10)
        ack(w.engine, G, "T", 0, got)
    names = w.disk.listdir(ACK_DIR)
    assert "meta" in names
    # 40 acked: segments 0 and 1 (offsets 0..31) are wholly acked and gone.
    assert [n for n in names if n.startswith("seg_")] in ([], ["seg_000000000002"])
    assert len(w.disk.read(f"{ACK_DIR}/journal")) < 21 * ack_journal.ENTRY_BYTES
    w.crash()
    assert w.engine.fetch_offset(G, "T", 0) == 40
    assert [o for o, _ in w.receive(3)] == [40, 41, 42]


def test_an_idle_queue_is_folded_and_dropped_from_memory(world: World) -> None:
    world.receive(4)
    ack(world.engine, G, "T", 0, [(0, 1), (2, 1)])
    world.clock.advance(world.config.ack_idle_ms)
    assert world.engine.acks.fold_idle() == 1
    assert not world.engine.acks._open
    assert world.disk.read(f"{ACK_DIR}/journal") == b""
    world.clock.advance(1000)
    assert world.receive(10)[:2] == [(1, 2), (3, 2)]


def test_an_acknowledged_ack_survives_a_crash_and_is_never_redelivered(world: World) -> None:
    world.receive(6)
    ack(world.engine, G, "T", 0, [(0, 1), (1, 1), (4, 1)])
    world.crash("drop")
    world.clock.advance(10_000)
    assert world.receive(10) == [(2, 2), (3, 2), (5, 2), *[(i, 1) for i in range(6, 13)]]


@pytest.mark.parametrize("point", ["cq.ack.fold.after_segments", "cq.ack.fold.after_meta"])
def test_a_crash_inside_a_fold_loses_nothing(point: str) -> None:
    w = World(ack_journal_entries_max=1000, ack_segment_entries=16)
    w.load(100)
    got = w.receive(40)
    ack(w.engine, G, "T", 0, [d for d in got if d[0] != 35])
    with failpoints.armed(point), pytest.raises(failpoints.SimulatedCrash):
        w.engine.acks._queue((G, "T", 0)).fold()
    w.crash("drop")
    assert w.engine.fetch_offset(G, "T", 0) == 35
    w.clock.advance(5000)
    assert w.receive(3) == [(35, 2), (40, 1), (41, 1)]


def test_async_ack_flush_makes_acks_durable_at_the_next_sync() -> None:
    w = World(ack_flush=AckFlush.ASYNC)
    w.load(10)
    w.receive(3)
    ack(w.engine, G, "T", 0, [(0, 1)])
    w.engine.acks.sync_all()
    ack(w.engine, G, "T", 0, [(1, 1)])  # inside the loss window
    w.crash("drop")
    assert w.engine.fetch_offset(G, "T", 0) == 1


# -- journal corruption table --------------------------------------------------------------------


def _journal_with(n: int) -> tuple[World, bytes]:
    w = World(ack_journal_entries_max=10_000)
    w.load(50)
    got = w.receive(n)
    ack(w.engine, G, "T", 0, got)
    data = w.disk.read(f"{ACK_DIR}/journal")
    return w, data


@pytest.mark.parametrize("cut", range(1, ack_journal.ENTRY_BYTES))
def test_a_torn_journal_tail_is_dropped_at_every_byte(cut: int) -> None:
    w, data = _journal_with(4)  # SKIP, 4 DELIVER, 4 ACK
    w.disk.crash(random.Random(1), "drop")
    torn = data[: len(data) - ack_journal.ENTRY_BYTES + cut]
    w.disk.write(f"{ACK_DIR}/journal", torn)
    w.engine = w.start()
    assert w.engine.fetch_offset(G, "T", 0) == 3  # the last ack (offset 3) was torn away
    assert len(w.disk.read(f"{ACK_DIR}/journal")) == len(data) - ack_journal.ENTRY_BYTES
    ack(w.engine, G, "T", 0, [(3, 1)])
    w.restart()
    assert w.engine.fetch_offset(G, "T", 0) == 4


@pytest.mark.parametrize(
    ("name", "damage", "committed", "redelivered"),
    [
        # The journal: SKIP, DELIVER 0..3, ACK 0..3 (entries 0..8, 24 bytes each).
        ("flipped bit in an ack", lambda d: _flip(d, 6 * 24 + 10), 1, [1]),
        ("zeroed entry", lambda d: d[: 7 * 24] + bytes(24) + d[8 * 24 :], 2, [2]),
        ("trailing garbage", lambda d: d + b"\xab" * 30, 4, []),
        ("trailing zeros", lambda d: d + bytes(48), 4, []),
        ("bad kind with a good CRC", lambda d: d + _bad_kind(), 4, []),
    ],
)
def test_journal_corruption_costs_at_most_the_damaged_entry(  # type: ignore[no-untyped-def]
    name: str, damage, committed: int, redelivered: list[int]
) -> None:
    w, data = _journal_with(4)
    w.disk.crash(random.Random(1), "drop")
    w.disk.write(f"{ACK_DIR}/journal", damage(data))
    w.engine = w.start()
    assert w.engine.fetch_offset(G, "T", 0) == committed, name
    w.clock.advance(5000)
    assert [o for o, c in w.receive(10) if c > 1] == redelivered, name


def _flip(data: bytes, pos: int) -> bytes:
    return data[:pos] + bytes([data[pos] ^ 0x10]) + data[pos + 1 :]


def _bad_kind() -> bytes:
    body = struct.pack(">BBHqq", 99, 0, 1, 3, 0)
    return struct.pack(">I", crc32c.crc32c(body)) + body


def test_a_corrupt_segment_refuses_to_guess() -> None:
    w = World(ack_journal_entries_max=5, ack_segment_entries=16)
    w.load(50)
    w.receive(4)
    ack(w.engine, G, "T", 0, [(1, 1)])
    w.engine.close()
    seg = f"{ACK_DIR}/seg_000000000000"
    raw = bytearray(w.disk.read(seg))
    raw[-1] ^= 1
    w.disk.write(seg, bytes(raw))
    with pytest.raises(CorruptFile):
        w.start().receive(G, "T", 0, 1, 1000)


def test_journal_entries_round_trip() -> None:
    es = [JournalEntry(Kind.DELIVER, 5, 2, 1234), JournalEntry(Kind.SKIP, 9)]
    assert ack_journal.decode_entries(ack_journal.encode_entries(es)) == (es, 48, 0)


# -- committed offsets ---------------------------------------------------------------------------


def test_committed_offsets_survive_a_crash_and_compaction() -> None:
    w = World(offsets_log_records_max=5)
    for i in range(12):
        w.engine.commit_offset("g", "T", i % 3, 100 + i)
    w.crash("drop")
    assert [w.engine.fetch_offset("g", "T", q) for q in range(3)] == [109, 110, 111]
    assert w.engine.fetch_offset("g", "T", 7) == -1


def test_a_torn_offsets_log_tail_is_dropped() -> None:
    w = World()
    w.engine.commit_offset("g", "T", 0, 5)
    w.engine.commit_offset("g", "T", 0, 6)
    w.engine.close()
    path = f"{DATA}/groups/offsets.log"
    data = w.disk.read(path)
    w.disk.write(path, data[:-3])
    w.engine = w.start()
    assert w.engine.fetch_offset("g", "T", 0) == 5
    w.engine.commit_offset("g", "T", 0, 7)
    w.restart()
    assert w.engine.fetch_offset("g", "T", 0) == 7


def test_a_changed_delivery_is_redelivered_once_when_both_deadlines_passed(world: World) -> None:
    world.receive(1, invisible_ms=100)
    world.engine.acks.change_invisible((G, "T", 0), 0, 1, 200)  # two heap entries for it
    world.clock.advance(1000)
    assert world.receive(5) == [(0, 2), (1, 1), (2, 1), (3, 1), (4, 1)]


def test_a_stale_receipt_in_a_batch_is_reported_and_the_current_ones_are_acked_durably(
    world: World,
) -> None:
    world.receive(3)
    world.clock.advance(2000)
    assert world.receive(1) == [(0, 2)]  # offset 0 redelivered: receipt (0, 1) is stale now
    committed, stale = world.engine.acks.ack((G, "T", 0), [(1, 1), (0, 1), (2, 1), (77, 1)])
    assert stale == [(0, 1), (77, 1)]
    assert committed == 0
    world.crash()  # ack_flush sync: what the call acknowledged is on disk
    world.clock.advance(5000)
    assert world.receive(10) == [(0, 3), *[(i, 1) for i in range(3, 12)]]


def test_the_next_redelivery_deadline_is_the_earliest_unacked_delivery(world: World) -> None:
    assert world.engine.acks.next_deadline_ms((G, "T", 0)) is None
    world.receive(2, invisible_ms=1000)
    start = world.clock.now_ms()
    world.engine.acks.change_invisible((G, "T", 0), 0, 1, 300)
    assert world.engine.acks.next_deadline_ms((G, "T", 0)) == start + 300
    ack(world.engine, G, "T", 0, [(0, 1)])
    assert world.engine.acks.next_deadline_ms((G, "T", 0)) == start + 1000
    ack(world.engine, G, "T", 0, [(1, 1)])
    assert world.engine.acks.next_deadline_ms((G, "T", 0)) is None


def test_committing_an_offset_moves_a_receive_ack_group_with_it(world: World) -> None:
    world.receive(5)
    world.engine.commit_offset(G, "T", 0, 3)
    assert world.engine.fetch_offset(G, "T", 0) == 3
    world.restart()
    assert world.engine.fetch_offset(G, "T", 0) == 3
    assert [o for o, _ in world.receive(2)] == [5, 6]  # 3 and 4 are still invisible
