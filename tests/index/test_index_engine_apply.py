"""Applying dispatch batches: what is indexed, capacity and rollover, replay idempotence, and the
engine's batch writer against the one-key-at-a-time model (byte-identical files)."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.index_file import IndexFile
from mqstore.errors import (
    DiskFull,
    FlushFailed,
    InvalidArgument,
    InvariantViolation,
    StoreLocked,
    Unavailable,
)
from mqstore.formats import sysflag
from mqstore.formats.javahash import index_key_hash
from mqstore.storage.clock import ManualClock
from mqstore.storage.disk import Disk
from mqstore.storage.simdisk import SimDisk
from tests.index.model import (
    T0,
    apply_in_batches,
    build_model,
    file_contents,
    keys_of,
    msg,
    stream,
)

from .conftest import EngineFactory

ALL = (0, 2**62)


def test_index_file_holds_entry_num_minus_one_keys_and_refuses_the_next(
    disk_dir: tuple[Disk, str],
) -> None:
    # RocketMQ's IndexFileTest: INDEX_NUM - 1 keys go in, the next put fails; selectPhyOffset
    # finds a key.
    disk, data_dir = disk_dir
    disk.makedirs(data_dir)
    f = IndexFile.create(
        disk, data_dir, name_ms=T0, slot_num=100, entry_num=400, start_offset=0, exact=False
    )
    keys = [f"T#key-{i}" for i in range(399)]
    for i, k in enumerate(keys):
        f.put(
            np.array([index_key_hash(k)], dtype=np.int64),
            np.array([i * 10], dtype=np.int64),
            np.array([T0 + i], dtype=np.int64),
            None,
        )
    assert f.header.entries == 399
    assert f.is_full and f.capacity_left == 0
    with pytest.raises(InvariantViolation):
        f.put(
            np.array([index_key_hash("T#one-more")], dtype=np.int64),
            np.array([9999], dtype=np.int64),
            np.array([T0], dtype=np.int64),
            None,
        )
    assert list(f.select(index_key_hash("T#key-77"), None, *ALL)) == [770]
    f.close()


def test_the_engine_rolls_over_when_a_file_is_full(make_engine: EngineFactory) -> None:
    engine = make_engine()  # 8 entries: 7 keys a file
    engine.apply([msg(i * 100, T0 + i, keys=f"k{i}") for i in range(7)])
    assert len(engine.file_names) == 1
    engine.apply([msg(700, T0 + 7, keys="k7")])
    assert len(engine.file_names) == 2
    assert engine.entry_count == 8
    assert engine.query("T", "k7", *ALL, 10) == [700]
    assert engine.query("T", "k0", *ALL, 10) == [0]


def test_indexed_are_the_unique_id_and_each_non_empty_token_of_keys(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(entry_num=64)
    written = engine.apply([msg(0, T0, keys="  a b  a ", uniq="U1")])
    assert written == 4  # U1, a, b, a again (RocketMQ keeps repeats)
    assert engine.entry_count == 4
    assert engine.query("T", "a", *ALL, 10) == [0]  # a repeated key is one candidate
    assert engine.query_uniq("T", "U1") == [0]
    assert engine.query("T", " ", *ALL, 10) == []
    with pytest.raises(InvalidArgument):
        engine.query("T", "", *ALL, 10)


@pytest.mark.parametrize(
    ("tx", "indexed"),
    [
        (sysflag.TRANSACTION_NOT_TYPE, True),
        (sysflag.TRANSACTION_PREPARED_TYPE, True),
        (sysflag.TRANSACTION_COMMIT_TYPE, True),
        (sysflag.TRANSACTION_ROLLBACK_TYPE, False),
    ],
)
def test_only_rolled_back_transactions_are_skipped(
    make_engine: EngineFactory, tx: int, indexed: bool
) -> None:
    engine = make_engine()
    engine.apply([msg(0, T0, keys="k", uniq="U", sys_flag=tx)])
    assert (engine.query("T", "k", *ALL, 10) == [0]) is indexed
    assert engine.applied_offset == 100  # skipped or not, the entry was applied


def test_a_replayed_batch_adds_nothing(make_engine: EngineFactory, sim: SimDisk) -> None:
    entries = stream(60, seed=1)
    engine = make_engine()
    engine.apply(entries[:40])
    before = file_contents(sim, engine)
    assert engine.apply(entries[:40]) == 0
    assert engine.apply(entries[10:25]) == 0
    assert file_contents(sim, engine) == before
    # an overlapping batch adds only what is new
    engine.apply(entries[30:60])
    assert file_contents(sim, engine) == build_model(entries).files


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("slots", "entries"), [(4, 8), (1, 5), (7, 3), (64, 16)])
def test_batch_writer_matches_rocketmq_put_sequence_byte_for_byte(
    sim: SimDisk, clock: ManualClock, seed: int, slots: int, entries: int
) -> None:
    msgs = stream(150, seed=seed)
    engine = IndexEngine(
        IndexConfig.for_tests(f"/d{seed}", slot_num=slots, entry_num=entries),
        disk=sim,
        clock=clock,
    )
    engine.open()
    apply_in_batches(engine, msgs, seed)
    model = build_model(msgs, slots, entries)
    assert file_contents(sim, engine) == model.files
    total = sum(len(keys_of(e)) for e in msgs if e.sys_flag != sysflag.TRANSACTION_ROLLBACK_TYPE)
    assert engine.entry_count == total
    assert len(model.files) == -(-total // (entries - 1))
    for topic in ("T", "U"):
        for key in ("Aa", "BB", "k", "AaBB", "ünï", "C#c", "missing"):
            assert engine.query(topic, key, *ALL, 10_000) == model.candidates(key, topic, *ALL)
    engine.close()


def test_a_message_whose_keys_straddle_a_rollover_is_split_like_rocketmq(
    make_engine: EngineFactory, sim: SimDisk
) -> None:
    engine = make_engine()
    msgs = [msg(0, T0, keys="a b c d e"), msg(100, T0 + 1, keys="f g h i", uniq="U")]
    engine.apply(msgs)
    assert file_contents(sim, engine) == build_model(msgs).files
    assert [engine.query("T", k, *ALL, 9) for k in ("e", "f", "i", "U")] == [
        [0],
        [100],
        [100],
        [100],
    ]


def test_a_full_disk_at_rollover_refuses_the_whole_batch_and_a_retry_succeeds(
    make_engine: EngineFactory, sim: SimDisk
) -> None:
    engine = make_engine()
    engine.apply([msg(i * 100, T0, keys=f"k{i}") for i in range(5)])
    before = file_contents(sim, engine)
    batch = [msg(500 + i * 100, T0, keys=f"n{i}") for i in range(12)]  # needs two new files
    sim.inject("create", errno.ENOSPC, times=1, path_contains="/idx/index/")
    with pytest.raises(DiskFull):
        engine.apply(batch)
    assert file_contents(sim, engine) == before
    assert engine.applied_offset == 500
    assert engine.query("T", "n0", *ALL, 5) == []
    engine.apply(batch)
    assert (
        file_contents(sim, engine)
        == build_model([msg(i * 100, T0, keys=f"k{i}") for i in range(5)] + batch).files
    )


def test_a_failed_flush_stops_writes_for_good(make_engine: EngineFactory, sim: SimDisk) -> None:
    engine = make_engine()
    engine.apply([msg(0, T0, keys="a")])  # creates the first file, which checkpoints at once
    assert engine.confirmed_offset == 100
    engine.apply([msg(100, T0, keys="b")])
    sim.inject("flush", errno.EIO, path_contains="/idx/index/")
    with pytest.raises(FlushFailed):
        engine.flush()
    with pytest.raises(Unavailable):
        engine.apply([msg(200, T0, keys="c")])
    with pytest.raises(Unavailable):
        engine.flush()
    assert engine.query("T", "b", *ALL, 5) == [100]  # reads go on
    assert engine.confirmed_offset == 100


def test_the_checkpoint_follows_on_the_flush_interval(
    make_engine: EngineFactory, clock: ManualClock
) -> None:
    engine = make_engine(flush_interval_ms=1_000, entry_num=64)
    engine.apply([msg(0, T0)])  # no keys: no file, and no checkpoint before the interval
    assert (engine.applied_offset, engine.confirmed_offset) == (100, 0)
    engine.apply([msg(100, T0, keys="a")])  # the first file: checkpointed at once
    assert engine.confirmed_offset == 200
    clock.advance(999)
    engine.apply([msg(200, T0, keys="b")])
    assert engine.confirmed_offset == 200
    clock.advance(1)
    engine.apply([msg(300, T0)])  # no keys, but the applied offset moves
    assert engine.confirmed_offset == 400
    engine.apply([msg(400, T0, keys="c")])
    assert not engine.flush_if_due()  # not due yet
    assert engine.confirmed_offset == 400
    clock.advance(1_000)
    assert engine.flush_if_due()
    assert engine.confirmed_offset == 500
    assert not engine.flush_if_due()  # nothing new
    assert engine.flush() == 500


def test_a_rollover_checkpoints_at_once(make_engine: EngineFactory) -> None:
    engine = make_engine(flush_interval_ms=3_600_000)
    engine.apply([msg(i * 100, T0, keys="k") for i in range(7)])
    assert engine.confirmed_offset == 700  # the first file creation
    engine.apply([msg(700, T0, keys="k")])
    assert engine.confirmed_offset == 800


def test_a_second_engine_on_the_same_directory_is_refused(make_engine: EngineFactory) -> None:
    make_engine()
    with pytest.raises(StoreLocked):
        make_engine()


def test_on_real_files_a_reopened_index_reads_back_the_same_bytes(
    disk_dir: tuple[Disk, str], clock: ManualClock
) -> None:
    disk, data_dir = disk_dir
    entries = stream(80, seed=9)
    config = IndexConfig.for_tests(data_dir, exact=True)
    engine = IndexEngine(config, disk=disk, clock=clock)
    engine.open()
    apply_in_batches(engine, entries, seed=3)
    engine.close()
    engine = IndexEngine(config, disk=disk, clock=clock)
    report = engine.open()
    assert report.clean_exit and report.damaged == []
    assert file_contents(disk, engine) == build_model(entries).files
    assert engine.query("T", "order-1", *ALL, 100) == build_model(entries).candidates(
        "order-1", "T", *ALL
    )
    engine.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"slot_num": 0},
        {"entry_num": 1},
        {"slot_num": 5_000_000, "entry_num": 200_000_000},  # beyond Java int positions
        {"shard_count": 0},
        {"shard_count": 2, "shard_index": 2},
        {"shard_index": -1},
        {"flush_interval_ms": 0},
        {"max_results": 0},
        {"max_results": 2_000, "max_candidates": 1_000},
        {"uniq_max_results": 0},
    ],
)
def test_configurations_that_cannot_work_are_refused(overrides: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        IndexConfig.for_tests("/d", **overrides)
