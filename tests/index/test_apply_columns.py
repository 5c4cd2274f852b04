"""IndexEngine.apply_columns (a frame applied as columns, what index_svc's sink does, its keys
hashed from the frame's UTF-8 string columns) indexes exactly what apply indexes for the same
frames parsed by protobuf into entry lists: the same index files and exact-mode companions byte
for byte, the same checkpoint, the same counts, in plain, exact and sharded mode; and the files
are those of tests/index/model.py's one-key-at-a-time model (RocketMQ's putKey over
message_keys, str by str). The frames (tests/rpc/test_dispatch_columns.py) carry transactions
(a rolled-back message is not indexed), several topics, keys with repeated and empty tokens,
empty and non-ASCII keys, corrupt ranges and replays after a reconnect."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.sink import IndexSink
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.history import LogHistory
from mqstore.rpc.dispatch_codec import decode_columns, decode_dispatch
from mqstore.storage.clock import ManualClock
from tests.index.model import ModelIndex, file_contents
from tests.rpc.test_dispatch_columns import Stream, dispatch_streams, make_stream

# The log as the handshake gives it: one epoch from its start.
ONE_EPOCH = LogHistory([(1, 0)])

MODES: dict[str, dict[str, object]] = {
    "plain": {},
    "exact": {"exact": True},
    "shard-1-of-2": {"shard_count": 2, "shard_index": 1},
}


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name == "lock":
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def apply_both_ways(root: str, stream: Stream, **overrides: object) -> None:
    clock = ManualClock()
    engines = []
    for name in ("entries", "columns"):
        engine = IndexEngine(
            IndexConfig.for_tests(os.path.join(root, name), **overrides), clock=clock
        )
        engine.open()
        engine.handshake(b"s" * 16, 0, 0)
        engines.append(engine)
    by_entries, by_columns = engines
    config = by_columns.config
    model = ModelIndex(config.slot_num, config.entry_num, config.shard_count, config.shard_index)
    try:
        for i, frame in enumerate(stream.frames):
            entries = decode_dispatch(frame)
            model.apply(entries)
            written = by_entries.apply(entries)
            assert by_columns.apply_columns(decode_columns(frame)) == written, f"frame {i}"
            assert by_columns.applied_offset == by_entries.applied_offset
            assert by_columns.confirmed_offset == by_entries.confirmed_offset
            clock.advance(random.Random(i).choice([0, 0, 20, 60]))
        assert file_contents(by_columns.disk, by_columns) == model.files
    finally:
        for engine in engines:
            engine.close()
    assert _files(os.path.join(root, "entries")) == _files(os.path.join(root, "columns"))


@pytest.mark.parametrize("mode", list(MODES))
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=dispatch_streams())
def test_columns_index_what_entries_index(mode: str, tmp_path: Path, stream: Stream) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        apply_both_ways(root, stream, **MODES[mode])


@pytest.mark.parametrize("seed", [1, 2])
def test_long_streams_over_big_files_index_alike(tmp_path: Path, seed: int) -> None:
    stream = make_stream(random.Random(seed), include_keys=True, max_entries=800)
    apply_both_ways(str(tmp_path), stream, slot_num=64, entry_num=300)


def test_the_sink_applies_columns_and_entry_lists_alike(tmp_path: Path) -> None:
    stream = make_stream(random.Random(5), include_keys=True, max_entries=120)
    clock = ManualClock()
    sinks = []
    for name in ("entries", "columns"):
        engine = IndexEngine(IndexConfig.for_tests(str(tmp_path / name)), clock=clock)
        engine.open()
        sink = IndexSink(engine)
        sink.on_handshake(b"s" * 16, 0, 0, 0, ONE_EPOCH)
        sinks.append(sink)
    try:
        for frame in stream.frames:
            sinks[0].on_batch(decode_dispatch(frame), frame.next_offset)
            sinks[1].on_batch(decode_columns(frame), frame.next_offset)
            assert sinks[0].applied_offset == sinks[1].applied_offset
            assert sinks[0].engine.entry_count == sinks[1].engine.entry_count
    finally:
        for sink in sinks:
            sink.engine.close()
    assert _files(str(tmp_path / "entries")) == _files(str(tmp_path / "columns"))


def test_a_rolled_back_message_is_skipped_but_moves_the_applied_offset(tmp_path: Path) -> None:
    engine = IndexEngine(IndexConfig.for_tests(str(tmp_path)), clock=ManualClock())
    engine.open()
    try:
        entries = [
            DispatchEntry("T", 0, 0, 0, 100, 0, 1_000, uniq_key="U1", keys="a b"),
            DispatchEntry("T", 0, 0, 100, 100, 0, 1_000, sys_flag=0xC, uniq_key="U2"),
            DispatchEntry("T", 0, 0, 200, 100, 0, 1_000, sys_flag=0x4, uniq_key="U3"),
        ]
        assert engine.apply_columns(DispatchColumns.from_entries(entries)) == 4
        assert engine.applied_offset == 300
        assert engine.query_uniq("T", "U2") == []
        assert engine.query_uniq("T", "U3") == [200]
        assert engine.query("T", "b", 0, 2**62, 10) == [0]
    finally:
        engine.close()


def test_a_frame_out_of_commit_log_order_takes_the_rows_apply_takes(tmp_path: Path) -> None:
    """apply skips an entry starting below the end of the last one taken; a frame whose
    offsets go back in the middle is walked row by row to take the same rows."""
    phys = [0, 300, 100, 400, 350, 900]
    entries = [
        DispatchEntry("T", 0, i, phy, 50, 0, 1_000 + i, uniq_key=f"U{i}")
        for i, phy in enumerate(phys)
    ]
    stream = Stream([], entries)
    frame = DispatchColumns.from_entries(entries)
    clock = ManualClock()
    engines = [
        IndexEngine(IndexConfig.for_tests(str(tmp_path / name)), clock=clock)
        for name in ("entries", "columns")
    ]
    for engine in engines:
        engine.open()
    try:
        assert engines[0].apply(stream.entries) == engines[1].apply_columns(frame) == 4
        assert engines[0].applied_offset == engines[1].applied_offset == 950
    finally:
        for engine in engines:
            engine.close()
    assert _files(str(tmp_path / "entries")) == _files(str(tmp_path / "columns"))
