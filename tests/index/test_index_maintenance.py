"""Deletion below the commit log's minimum, truncation and the start-up handshake, and shards."""

from __future__ import annotations

import struct

import pytest

from index_svc.engine import TIME_MAX_MS
from mqstore.errors import FailedPrecondition
from mqstore.sharding import shard_of
from mqstore.storage.simdisk import SimDisk
from tests.index.model import T0, apply_in_batches, build_model, file_contents, keys_of, msg, stream

from .conftest import EngineFactory

ALL = (0, TIME_MAX_MS)
STORE_A = b"A" * 16
STORE_B = b"B" * 16


def end_phys(files: list[bytes]) -> list[int]:
    return [struct.unpack_from(">q", f, 24)[0] for f in files]


def assert_same_but_end_time(got: list[bytes], expected: list[bytearray]) -> None:
    """A cut file keeps store times in whole seconds only, so its header's end time is an upper
    bound within 999 ms of the true one; every other byte is what indexing wrote."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        (g_end,), (e_end,) = struct.unpack_from(">q", g, 8), struct.unpack_from(">q", e, 8)
        assert e_end <= g_end <= e_end + 999
        assert g[:8] + g[16:] == bytes(e[:8] + e[16:])


def test_delete_expired_removes_the_leading_files_wholly_below_the_minimum(
    make_engine: EngineFactory, sim: SimDisk
) -> None:
    engine = make_engine()
    engine.apply([msg(i * 100, T0, keys="k") for i in range(28)])  # 4 files of 7
    names = engine.file_names
    assert end_phys(file_contents(sim, engine)) == [600, 1300, 2000, 2700]
    assert engine.delete_expired(600) == []  # the first file's last entry is at 600
    assert engine.delete_expired(601) == names[:1]
    assert engine.delete_expired(1500) == names[1:2]
    assert engine.file_names == names[2:]
    assert not sim.exists(f"{engine.config.index_dir}/{names[0]}")
    # candidates below the minimum are not returned, even from a kept file
    assert engine.query("T", "k", *ALL, 100) == [i * 100 for i in reversed(range(15, 28))]


def test_the_newest_file_is_never_deleted(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.apply([msg(i * 100, T0, keys="k") for i in range(10)])
    engine.delete_expired(10**9)
    assert len(engine.file_names) == 1
    assert engine.query("T", "k", *ALL, 100) == []


def test_deletion_and_the_minimum_survive_a_reopen(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.apply([msg(i * 100, T0, keys="k") for i in range(21)])
    deleted = engine.delete_expired(1000)
    engine.close()
    engine = make_engine()
    assert engine.min_offset == 1000
    assert deleted[0] not in engine.file_names
    assert engine.query("T", "k", *ALL, 100) == [i * 100 for i in reversed(range(10, 21))]


@pytest.mark.parametrize("cut_index", [0, 1, 5, 13, 20, 33, 39])
def test_truncate_leaves_exactly_what_indexing_the_surviving_log_writes(
    make_engine: EngineFactory, sim: SimDisk, cut_index: int
) -> None:
    entries = stream(40, seed=11)
    engine = make_engine()
    apply_in_batches(engine, entries, seed=4)
    cut = entries[cut_index].commit_log_offset
    engine.truncate(cut)
    assert engine.applied_offset == engine.confirmed_offset == cut
    assert_same_but_end_time(file_contents(sim, engine), build_model(entries[:cut_index]).files)
    # the log's new tail is indexed as usual afterwards, even at reused offsets
    tail = stream(10, seed=12, start=cut, t0=T0 + 10**7)
    engine.apply(tail)
    assert file_contents(sim, engine) == build_model(entries[:cut_index] + tail).files


def test_truncate_above_what_is_applied_changes_nothing(
    make_engine: EngineFactory, sim: SimDisk
) -> None:
    entries = stream(20, seed=2)
    engine = make_engine()
    engine.apply(entries)
    before = file_contents(sim, engine)
    assert engine.truncate(entries[-1].end_offset) == 0
    assert file_contents(sim, engine) == before


def test_truncated_files_reopen_as_truncated(make_engine: EngineFactory, sim: SimDisk) -> None:
    entries = stream(40, seed=5)
    engine = make_engine()
    engine.apply(entries)
    engine.truncate(entries[17].commit_log_offset)
    engine.close()
    engine = make_engine()
    assert_same_but_end_time(file_contents(sim, engine), build_model(entries[:17]).files)
    assert engine.confirmed_offset == entries[17].commit_log_offset


def test_handshake_adopts_the_first_store_id_and_flows_from_the_confirmed_offset(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    assert engine.handshake(STORE_A, 0, 0) == 0
    engine.apply([msg(0, T0, keys="k"), msg(100, T0, keys="k")])
    engine.close()
    engine = make_engine()
    assert engine.store_id == STORE_A
    assert engine.handshake(STORE_A, 0, 500) == 200


def test_handshake_with_another_store_id_drops_everything(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.handshake(STORE_A, 0, 0)
    engine.apply(stream(30, seed=1))
    assert engine.handshake(STORE_B, 0, 10**6) == 0
    assert engine.file_names == []
    assert engine.store_id == STORE_B
    assert engine.query("T", "Aa", *ALL, 10) == []


def test_handshake_truncates_a_tail_the_log_lost(make_engine: EngineFactory, sim: SimDisk) -> None:
    entries = stream(30, seed=8)
    engine = make_engine()
    engine.handshake(STORE_A, 0, 0)
    engine.apply(entries)
    max_offset = entries[12].commit_log_offset
    assert engine.handshake(STORE_A, 0, max_offset) == max_offset
    assert_same_but_end_time(file_contents(sim, engine), build_model(entries[:12]).files)


def test_handshake_raises_the_minimum_when_segments_expired(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.handshake(STORE_A, 0, 0)
    engine.apply([msg(i * 100, T0, keys="k") for i in range(14)])
    assert engine.handshake(STORE_A, 700, 1400) == 1400
    assert len(engine.file_names) == 1
    assert engine.min_offset == 700
    # an index that fell behind expired segments resumes at the log's minimum
    engine2 = make_engine("/data/idx2")
    assert engine2.handshake(STORE_A, 700, 1400) == 700


# -- shards ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shard_count", [2, 3, 5])
def test_each_shard_indexes_exactly_the_keys_the_shared_function_routes_to_it(
    make_engine: EngineFactory, shard_count: int
) -> None:
    entries = stream(400, seed=shard_count)
    engines = [
        make_engine(f"/shard{i}", shard_count=shard_count, shard_index=i, entry_num=4096)
        for i in range(shard_count)
    ]
    for engine in engines:
        apply_in_batches(engine, entries, seed=7)
    indexed = [
        (e.topic, k)
        for e in entries
        if e.sys_flag == 0 or e.sys_flag & 0xC != 0xC
        for k in keys_of(e)
    ]
    assert sum(engine.entry_count for engine in engines) == len(indexed)
    for i, engine in enumerate(engines):
        mine = [tk for tk in indexed if shard_of(*tk, shard_count) == i]
        assert engine.entry_count == len(mine)
        for topic, key in set(indexed):
            owner = shard_of(topic, key, shard_count)
            assert engine.owns(topic, key) is (owner == i)
            if owner == i:
                assert engine.query(topic, key, *ALL, 10_000)
            else:
                with pytest.raises(FailedPrecondition, match=f"shard {owner} of {shard_count}"):
                    engine.query(topic, key, *ALL, 10)


def test_a_shard_grown_in_place_keeps_answering_for_its_keys(make_engine: EngineFactory) -> None:
    entries = stream(200, seed=21)
    engine = make_engine(shard_count=2, shard_index=1, entry_num=4096)
    engine.apply(entries)
    before = {
        k: engine.query("T", k, *ALL, 10_000)
        for e in entries
        for k in keys_of(e)
        if e.topic == "T" and shard_of("T", k, 3) == 1
    }
    engine.close()
    engine = make_engine(shard_count=3, shard_index=1, entry_num=4096)
    assert engine.confirmed_offset == entries[-1].end_offset  # nothing to rebuild
    for key, offsets in before.items():
        assert engine.query("T", key, *ALL, 10_000) == offsets
