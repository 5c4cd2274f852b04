"""Recovery (index_svc/recovery.py): every row of the decision table, then seeded crash
simulations on the SimDisk. The oracle is always the same: after recovery and a replay from the
offset recovery names, the files are byte-identical to a build without any crash."""

from __future__ import annotations

import random
import struct

import pytest

from index_svc.config import IndexConfig
from index_svc.engine import TIME_MAX_MS, IndexEngine
from index_svc.recovery import RecoveryReport
from mqstore.dispatch import DispatchEntry
from mqstore.formats import index_file as fmt
from mqstore.storage import failpoints
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import CrashMode, SimDisk
from tests.index.model import (
    T0,
    ModelIndex,
    apply_in_batches,
    build_model,
    file_contents,
    msg,
    stream,
)

DATA = "/data/idx"
INDEX_DIR = DATA + "/index"
ALL = (0, TIME_MAX_MS)


def open_engine(sim: SimDisk, clock: ManualClock, **overrides: object) -> IndexEngine:
    engine = IndexEngine(IndexConfig.for_tests(DATA, **overrides), disk=sim, clock=clock)
    engine.open()
    return engine


def replay(engine: IndexEngine, entries: list[DispatchEntry]) -> None:
    """What the service does after open: dispatch from the replay offset on."""
    start = engine.confirmed_offset
    apply_in_batches(engine, [e for e in entries if e.commit_log_offset >= start], seed=start)


def assert_rebuilt(sim: SimDisk, engine: IndexEngine, entries: list[DispatchEntry]) -> None:
    replay(engine, entries)
    assert file_contents(sim, engine) == build_model(entries).files


def poke(sim: SimDisk, path: str, pos: int, data: bytes) -> None:
    """Overwrite bytes of a file as a fault would (durable at once)."""
    region = sim.map(path, sim.size(path))
    region.buf[pos : pos + len(data)] = data
    region.flush(0, sim.size(path))


def kill(sim: SimDisk, mode: CrashMode = "keep", seed: int = 0) -> None:
    """kill -9 ("keep": the page cache survives) or power loss ("drop", "random")."""
    sim.crash(random.Random(seed), mode)


ENTRIES = stream(40, seed=3)


@pytest.fixture
def built(sim: SimDisk, clock: ManualClock) -> list[str]:
    """The names of the files of an engine that indexed ENTRIES and closed cleanly."""
    engine = open_engine(sim, clock)
    apply_in_batches(engine, ENTRIES, seed=1)
    names = engine.file_names
    assert len(names) >= 4
    engine.close()
    return names


# -- the decision table -------------------------------------------------------------------------


def test_a_fresh_directory_starts_empty_without_complaint(sim: SimDisk, clock: ManualClock) -> None:
    report = open_engine(sim, clock).recovery
    assert report == RecoveryReport(duration_ms=report.duration_ms if report else 0.0)


def test_no_checkpoint_deletes_every_file_and_replays_from_zero(
    sim: SimDisk, clock: ManualClock, built: list[str]
) -> None:
    sim.remove(INDEX_DIR + "/checkpoint")
    engine = open_engine(sim, clock)
    report = engine.recovery
    assert report is not None
    assert report.reset_reason == "index files without a checkpoint"
    assert len(report.files_deleted) == len(built)
    assert (report.replay_from_offset, engine.file_names) == (0, [])
    assert_rebuilt(sim, engine, ENTRIES)


def test_a_corrupt_checkpoint_is_no_checkpoint(
    sim: SimDisk, clock: ManualClock, built: list[str]
) -> None:
    path = INDEX_DIR + "/checkpoint"
    data = bytearray(sim.read(path))
    data[20] ^= 0x01
    sim.write(path, bytes(data))
    engine = open_engine(sim, clock)
    assert engine.recovery is not None
    assert "CRC32C" in engine.recovery.reset_reason
    assert engine.confirmed_offset == 0
    assert_rebuilt(sim, engine, ENTRIES)


@pytest.mark.parametrize(
    ("old", "new", "kept"),
    [
        ((1, 0), (1, 0), True),
        ((2, 1), (4, 1), True),
        ((2, 1), (3, 0), False),
        ((4, 1), (2, 1), False),
        ((2, 1), (3, 2), False),
    ],
)
def test_files_of_a_shard_are_kept_only_when_they_cover_the_new_shard(
    sim: SimDisk, clock: ManualClock, old: tuple[int, int], new: tuple[int, int], kept: bool
) -> None:
    engine = open_engine(sim, clock, shard_count=old[0], shard_index=old[1])
    engine.apply(ENTRIES)
    engine.close()
    engine = open_engine(sim, clock, shard_count=new[0], shard_index=new[1])
    assert engine.recovery is not None
    assert (engine.recovery.reset_reason == "") is kept
    assert (engine.confirmed_offset == ENTRIES[-1].end_offset) is kept


def test_a_file_the_checkpoint_does_not_name_is_deleted(
    sim: SimDisk, clock: ManualClock, built: list[str]
) -> None:
    stray = "20991231235959999"
    sim.create(f"{INDEX_DIR}/{stray}", 216)
    sim.create(f"{INDEX_DIR}/{stray}.hash64", 80)
    engine = open_engine(sim, clock)
    assert engine.recovery is not None
    assert sorted(engine.recovery.files_deleted) == [stray, stray + ".hash64"]
    assert engine.file_names == built
    assert not sim.exists(f"{INDEX_DIR}/{stray}")


@pytest.mark.parametrize("damage", ["missing", "wrong size", "header"])
def test_a_damaged_file_is_dropped_with_every_newer_one_and_rebuilt_by_replay(
    sim: SimDisk, clock: ManualClock, built: list[str], damage: str
) -> None:
    names = built
    victim = f"{INDEX_DIR}/{names[2]}"
    if damage == "missing":
        sim.remove(victim)
    elif damage == "wrong size":
        sim.remove(victim)
        sim.create(victim, 217)
    else:
        poke(sim, victim, 24, struct.pack(">q", 123_456_789))  # end phy
    engine = open_engine(sim, clock)
    report = engine.recovery
    assert report is not None
    assert len(report.damaged) == 1 and report.damaged[0].startswith(names[2])
    assert engine.file_names == names[:2]
    model = build_model(ENTRIES)
    first_of_victim = struct.unpack_from(">q", model.files[2], 16)[0]  # its begin phy
    assert report.replay_from_offset == first_of_victim
    assert_rebuilt(sim, engine, ENTRIES)


def test_a_flipped_entry_in_a_sealed_file_is_caught_only_when_verifying(
    sim: SimDisk, clock: ManualClock, built: list[str]
) -> None:
    names = built
    poke(sim, f"{INDEX_DIR}/{names[1]}", fmt.entry_pos(4, 3) + 5, b"\x77")
    engine = open_engine(sim, clock)
    assert engine.recovery is not None and engine.recovery.damaged == []
    engine.close()
    engine = open_engine(sim, clock, verify_sealed_on_open=True)
    assert engine.recovery is not None
    assert engine.recovery.damaged == [f"{names[1]}: entries CRC32C mismatch"]
    assert engine.file_names == names[:1]
    assert_rebuilt(sim, engine, ENTRIES)


def test_after_a_clean_close_everything_is_kept_as_is(
    sim: SimDisk, clock: ManualClock, built: list[str]
) -> None:
    before = [sim.read(f"{INDEX_DIR}/{n}") for n in built]
    engine = open_engine(sim, clock)
    report = engine.recovery
    assert report is not None
    assert report.clean_exit and report.damaged == [] and report.entries_cut == 0
    assert report.replay_from_offset == ENTRIES[-1].end_offset
    assert file_contents(sim, engine) == before


def test_after_an_unclean_exit_the_active_file_is_cut_back_to_the_checkpoint(
    sim: SimDisk, clock: ManualClock
) -> None:
    engine = open_engine(sim, clock, entry_num=256, flush_interval_ms=10**9)
    engine.apply(ENTRIES[:10])  # the first file: checkpointed at once
    confirmed = engine.confirmed_offset
    engine.apply(ENTRIES[10:30])  # not flushed
    kept, lost = build_model(ENTRIES[:10], 4, 256), build_model(ENTRIES[:30], 4, 256)
    assert file_contents(sim, engine) == lost.files
    kill(sim, "keep")  # kill -9: the unflushed entries are in the file
    engine = open_engine(sim, clock, entry_num=256)
    report = engine.recovery
    assert report is not None and not report.clean_exit
    assert report.replay_from_offset == confirmed

    def count(model: ModelIndex) -> int:
        return int(struct.unpack_from(">i", model.files[0], 36)[0])

    assert report.entries_cut == count(lost) - count(kept) > 0
    assert file_contents(sim, engine) == kept.files
    replay(engine, ENTRIES)
    assert file_contents(sim, engine) == build_model(ENTRIES, 4, 256).files


def test_an_active_file_damaged_below_its_checkpoint_is_rebuilt(
    sim: SimDisk, clock: ManualClock
) -> None:
    engine = open_engine(sim, clock)
    apply_in_batches(engine, ENTRIES, seed=2)
    engine.flush()
    active = f"{INDEX_DIR}/{engine.file_names[-1]}"
    older = engine.file_names[:-1]
    kill(sim, "keep")
    poke(sim, active, fmt.entry_pos(4, 1) + 3, b"\xee")
    engine = open_engine(sim, clock)
    assert engine.recovery is not None
    assert "entries CRC32C mismatch" in engine.recovery.damaged[0]
    assert engine.file_names == older
    assert_rebuilt(sim, engine, ENTRIES)


def test_a_sealed_files_bad_companion_costs_only_precision(
    sim: SimDisk, clock: ManualClock
) -> None:
    entries = [msg(0, T0, keys="Aa"), msg(100, T0, keys="BB")]
    entries += [msg(200 + 100 * i, T0, keys=f"k{i}") for i in range(10)]
    engine = open_engine(sim, clock, exact=True)
    engine.apply(entries)
    first = engine.file_names[0]
    engine.close()
    poke(sim, f"{INDEX_DIR}/{first}.hash64", 0, b"XXXX")
    engine = open_engine(sim, clock, exact=True)
    assert engine.recovery is not None and engine.recovery.damaged == []
    assert engine.query("T", "Aa", *ALL, 10) == [100, 0]  # unfiltered in that file


def test_an_active_files_missing_companion_in_exact_mode_is_damage(
    sim: SimDisk, clock: ManualClock
) -> None:
    engine = open_engine(sim, clock, exact=True)
    engine.apply(ENTRIES)
    names = engine.file_names
    engine.close()
    sim.remove(f"{INDEX_DIR}/{names[-1]}.hash64")
    engine = open_engine(sim, clock, exact=True)
    assert engine.recovery is not None
    assert "companion" in engine.recovery.damaged[0]
    assert engine.file_names == names[:-1]
    replay(engine, ENTRIES)
    assert file_contents(sim, engine) == build_model(ENTRIES).files


def test_turning_exact_mode_off_and_on_never_filters_with_stale_hashes(
    sim: SimDisk, clock: ManualClock
) -> None:
    engine = open_engine(sim, clock, exact=True, entry_num=64)
    engine.apply([msg(0, T0, keys="Aa")])
    engine.close()
    engine = open_engine(sim, clock, exact=False, entry_num=64)
    assert not sim.exists(f"{INDEX_DIR}/{engine.file_names[0]}.hash64")
    engine.apply([msg(100, T0, keys="BB"), msg(200, T0, keys="Aa")])
    engine.close()
    engine = open_engine(sim, clock, exact=True, entry_num=64)
    # The file lost its companion, so its candidates come unfiltered; none is lost.
    assert engine.query("T", "Aa", *ALL, 10) == [200, 100, 0]


# -- crashes ---------------------------------------------------------------------------------


CRASH_GEOMETRY = {"slot_num": 8, "entry_num": 48, "flush_interval_ms": 1_000}


def crash_run(seed: int, mode: CrashMode) -> RecoveryReport:
    """Apply a random stream in random batches with random flushes, crash at a random point,
    recover, replay, and check the oracle. Returns what recovery reported."""
    rng = random.Random(seed)
    sim = SimDisk()
    clock = ManualClock()
    config = {**CRASH_GEOMETRY, "exact": seed % 2 == 1}
    entries = stream(120, seed=seed)
    crash_at = rng.randint(1, len(entries))
    engine = open_engine(sim, clock, **config)
    i = 0
    while i < crash_at:
        n = rng.randint(1, 10)
        engine.apply(entries[i : min(i + n, crash_at)])
        i += n
        clock.advance(rng.choice([0, 10, 300]))
        if rng.random() < 0.1:
            engine.flush()
    confirmed = engine.confirmed_offset
    kill(sim, mode, seed)
    engine = open_engine(sim, clock, **config)
    report = engine.recovery
    assert report is not None
    assert report.replay_from_offset <= confirmed
    replay(engine, entries)
    model = build_model(entries, 8, 48)
    assert file_contents(sim, engine) == model.files, f"seed {seed} {mode}"
    for key in ("Aa", "k", "ünï"):
        got = engine.query("T", key, *ALL, 10_000)
        expected = model.candidates(key, "T", *ALL)
        if config["exact"]:
            assert set(got) <= set(expected)
        else:
            assert got == expected
    return report


@pytest.mark.parametrize("mode", ["drop", "keep", "random"])
@pytest.mark.parametrize("seed", range(12))
def test_a_crash_at_any_moment_recovers_to_what_a_clean_build_writes(
    mode: CrashMode, seed: int
) -> None:
    crash_run(seed, mode)


def test_the_crash_simulation_reaches_every_recovery_path() -> None:
    # Guards the test above against a schedule that never loses or tears anything.
    reports = [crash_run(seed, "random") for seed in range(12, 40)]
    assert any(r.entries_cut > 0 and not r.damaged for r in reports)  # cut to the checkpoint
    assert any(r.entries_cut == 0 and not r.damaged for r in reports)  # nothing to undo
    # The simulated disk never damages bytes that were durable before a write (sectors are
    # written whole), so damaged durable entries are covered by the explicit damage tests.
    assert not any(r.damaged for r in reports)


POINTS = [
    "index.after_create",
    "index.after_seal",
    "index.before_checkpoint",
    "index.after_checkpoint",
    "index.after_apply",
]


@pytest.mark.parametrize("mode", ["drop", "random"])
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_each_step_of_a_rollover_recovers(point: str, mode: CrashMode) -> None:
    sim = SimDisk()
    clock = ManualClock()
    engine = open_engine(sim, clock, exact=True)
    engine.apply(ENTRIES[:5])
    with failpoints.armed(point), pytest.raises(failpoints.SimulatedCrash):
        engine.apply(ENTRIES[5:30])
    kill(sim, mode, seed=len(point))
    engine = open_engine(sim, clock, exact=True)
    replay(engine, ENTRIES)
    assert file_contents(sim, engine) == build_model(ENTRIES).files


def test_a_crash_during_recovery_is_recovered_from(sim: SimDisk, clock: ManualClock) -> None:
    engine = open_engine(sim, clock)
    apply_in_batches(engine, ENTRIES, seed=5)
    kill(sim, "keep")
    with failpoints.armed("index.before_checkpoint"), pytest.raises(failpoints.SimulatedCrash):
        open_engine(sim, clock)
    kill(sim, "random", seed=9)
    engine = open_engine(sim, clock)
    assert_rebuilt(sim, engine, ENTRIES)


def test_a_damaged_file_opened_by_a_straddling_message_is_rebuilt_without_duplicates(
    sim: SimDisk, clock: ManualClock
) -> None:
    # The message at 100 has keys in both files; the second file is lost. Replay restarts at
    # that message, so the first file must give up the keys it already had of it.
    entries = [msg(0, T0, keys="a b c d e"), msg(100, T0 + 1, keys="f g h i"), msg(200, T0 + 2)]
    engine = open_engine(sim, clock)
    engine.apply(entries)
    names = engine.file_names
    engine.close()
    sim.remove(f"{INDEX_DIR}/{names[1]}")
    engine = open_engine(sim, clock)
    assert engine.recovery is not None
    assert engine.recovery.replay_from_offset == 100
    assert engine.recovery.entries_cut == 2  # "f" and "g" left the first file
    assert_rebuilt(sim, engine, entries)
