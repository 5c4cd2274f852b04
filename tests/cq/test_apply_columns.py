"""put_columns (a frame applied as columns, what cq_svc's sink does) writes exactly what the
stores' entry-by-entry path (`_apply`, what a run that is not plain takes) writes for the same
frames: the same unit and time files byte for byte, the same RocksDB rows, the same
checkpoints, the same counts and queue bounds. The frames
(tests/rpc/test_dispatch_columns.py) carry transactions, several topics and queues, corrupt
ranges, gaps, queues starting above 0, times out of order or out of range, and replays."""

from __future__ import annotations

import itertools
import os
import random
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import rocksdict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import make_store
from cq_svc.rocks_store import OFFSET_CF
from cq_svc.store import CqStore, plain_run_start
from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import InvalidArgument
from mqstore.formats import _core
from mqstore.formats.cq_time import TIME_MAX_MS, clamp_time, decode_time, encode_time
from mqstore.rpc.dispatch_codec import decode_columns, decode_dispatch
from mqstore.storage.clock import ManualClock
from tests.cq.support import encode_units, last_offset
from tests.rpc.test_dispatch_columns import Stream, dispatch_streams, make_stream

KINDS = [StoreKind.FILE, StoreKind.ROCKSDB]


def _open(kind: StoreKind, data_dir: str, clock: ManualClock, **overrides: object) -> CqStore:
    store = make_store(CqConfig.for_tests(data_dir, cq_store=kind, **overrides), clock=clock)
    store.open()
    return store


def _files(root: str) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _rows(data_dir: str) -> dict[str, list[tuple[bytes, bytes]]]:
    db = rocksdict.Rdict(
        os.path.join(data_dir, "cq_rocksdb"),
        options=rocksdict.Options(raw_mode=True),
        column_families={OFFSET_CF: rocksdict.Options(raw_mode=True)},
    )
    try:
        out = {}
        for name, cf in (("default", db), (OFFSET_CF, db.get_column_family(OFFSET_CF))):
            it = cf.iter()
            it.seek_to_first()
            rows = []
            while it.valid():
                rows.append((it.key(), it.value()))
                it.next()
            del it
            out[name] = rows
        return out
    finally:
        db.close()


def _on_disk(kind: StoreKind, data_dir: str) -> object:
    if kind is StoreKind.FILE:
        return _files(data_dir)
    return (_rows(data_dir), _files(data_dir).get("cq_checkpoint"))


def _bounds(store: CqStore) -> list[tuple[str, int, int, int, int]]:
    return [
        (t, q, store.min_offset(t, q), store.max_offset(t, q), last_offset(store, t, q))
        for t in store.list_topics()
        for q in store.list_queues(t)
    ]


def apply_both_ways(kind: StoreKind, root: str, stream: Stream, **overrides: object) -> None:
    """Apply the stream to two stores, entry by entry to one (no run counts as plain) and
    packed to the other; assert they agree after every frame and on disk at the end."""
    clock = ManualClock()
    by_entries = _open(kind, os.path.join(root, "entries"), clock, **overrides)
    by_columns = _open(kind, os.path.join(root, "columns"), clock, **overrides)
    stores = (by_entries, by_columns)
    try:
        for i, frame in enumerate(stream.frames):
            results: list[tuple[str, object]] = []
            for store, packed in ((by_entries, False), (by_columns, True)):
                module = sys.modules[type(store).__module__]
                plain = module.plain_run_start if packed else lambda *_: None
                try:
                    with mock.patch.object(module, "plain_run_start", plain):
                        n = store.put_columns(decode_columns(frame), frame.next_offset)
                    results.append(("ok", n))
                except InvalidArgument as exc:  # refused alike (a gap wider than a file)
                    results.append(("refused", str(exc)))
            assert results[0] == results[1], f"frame {i}"
            assert by_entries.applied_offset == by_columns.applied_offset
            assert _bounds(by_entries) == _bounds(by_columns), f"frame {i}"
            if i % 7 == 3:
                clock.advance(5)
                assert by_entries.flush(0) == by_columns.flush(0)
        for t, q, lo, hi, _ in _bounds(by_entries):
            assert by_entries.read_units(t, q, lo, hi - lo) == by_columns.read_units(
                t, q, lo, hi - lo
            )
    finally:
        for store in stores:
            store.close()
    assert _on_disk(kind, os.path.join(root, "entries")) == _on_disk(
        kind, os.path.join(root, "columns")
    )


@pytest.mark.parametrize("kind", KINDS, ids=["file", "rocksdb"])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(stream=dispatch_streams(include_keys=False))
def test_columns_write_what_entries_write(kind: StoreKind, tmp_path: Path, stream: Stream) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        apply_both_ways(kind, root, stream)


@pytest.mark.parametrize("kind", KINDS, ids=["file", "rocksdb"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_many_files_and_few_open_maps_write_alike(
    kind: StoreKind, tmp_path: Path, seed: int
) -> None:
    """Longer streams: runs cross file ends, the LRU of maps evicts queues between frames."""
    stream = make_stream(random.Random(seed), include_keys=True, max_entries=600)
    apply_both_ways(kind, str(tmp_path), stream, units_per_file=7, open_maps_max=4)


@pytest.mark.parametrize("kind", KINDS, ids=["file", "rocksdb"])
def test_a_frame_resent_whole_writes_nothing_twice(kind: StoreKind, tmp_path: Path) -> None:
    stream = make_stream(random.Random(11), include_keys=False, max_entries=80)
    store = _open(kind, str(tmp_path / "cq"), ManualClock())
    try:
        frame = stream.frames[0]
        first = store.put_columns(decode_columns(frame), frame.next_offset)
        assert first == sum(e.goes_to_consume_queue for e in decode_dispatch(frame))
        assert store.put_columns(decode_columns(frame), frame.next_offset) == 0
    finally:
        store.close()


def test_prepared_and_rolled_back_messages_take_no_unit_but_move_the_applied_offset(
    tmp_path: Path,
) -> None:
    entries = [
        DispatchEntry("T", 0, 0, 0, 100, 0, 1_000),
        DispatchEntry("T", 0, 0, 100, 100, 0, 1_001, sys_flag=0x4),  # PREPARED
        DispatchEntry("T", 0, 1, 200, 100, 0, 1_002, sys_flag=0x8),  # COMMIT
        DispatchEntry("T", 0, 0, 300, 100, 0, 1_003, sys_flag=0xC),  # ROLLBACK
    ]
    store = _open(StoreKind.FILE, str(tmp_path / "cq"), ManualClock())
    try:
        assert store.put_columns(DispatchColumns.from_entries(entries)) == 2
        assert store.applied_offset == 400
        assert [u.commit_log_offset for u in store.read_units("T", 0, 0, 10)] == [0, 200]
    finally:
        store.close()


# -- the pure pieces ---------------------------------------------------------------------------


def _int64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def reference_pack(
    rows: list[tuple[int, int, int, int]], last_time: int
) -> tuple[bytes, bytes, int]:
    """What FileQueue.append writes for rows (phy, size, tags, store time) applied one at a
    time (`_apply`'s way): the running maximum of the clamped times, each unit's time entry
    by encode_time."""
    units = []
    times = []
    for phy, size, tags, ts in rows:
        last_time = max(last_time, clamp_time(ts))
        unit = encode_units([(phy, size, tags)])
        units.append(unit)
        times.append(encode_time(unit, last_time))
    return b"".join(units), b"".join(times), last_time


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.integers(1, 2**31 - 1),
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**63), 2**63 - 1),
        ),
        min_size=0,
        max_size=40,
    ),
    last_time=st.integers(0, TIME_MAX_MS),
    data=st.data(),
)
def test_packed_units_and_times_are_the_bytes_of_one_at_a_time(
    rows: list[tuple[int, int, int, int]], last_time: int, data: st.DataObject
) -> None:
    """_core.pack_units of any rows of a frame (in any order, from any start) writes the bytes
    `_apply` writes unit by unit, times clamped to 48 bits and kept from going down."""
    order = data.draw(st.permutations(range(len(rows))))
    start = data.draw(st.integers(0, len(rows)))
    columns = [_int64([r[j] for r in rows]) for j in range(4)]
    got = _core.pack_units(_int64(list(order)), start, *columns, last_time)
    assert got == reference_pack([rows[i] for i in order[start:]], last_time)


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.binary(min_size=20, max_size=20), st.binary(min_size=8, max_size=8))
    ),
    packed=st.lists(st.tuples(st.binary(min_size=20, max_size=20), st.integers(0, TIME_MAX_MS))),
    flip=st.integers(0, 2**16),
)
def test_the_compiled_time_check_is_decode_times_verdict(
    entries: list[tuple[bytes, bytes]], packed: list[tuple[bytes, int]], flip: int
) -> None:
    """_core.time_entries_ok passes an entry exactly when cq_time.decode_time does: written
    entries (one with a flipped bit), and any bytes."""
    pairs = entries + [(unit, encode_time(unit, t)) for unit, t in packed]
    if pairs:
        unit, entry = pairs[flip % len(pairs)]
        bit = flip % 64
        pairs[flip % len(pairs)] = (unit, (int.from_bytes(entry) ^ (1 << bit)).to_bytes(8))
    units = b"".join(u for u, _ in pairs)
    times = b"".join(e for _, e in pairs)
    got = list(_core.time_entries_ok(units, times))
    assert got == [int(decode_time(u, e) is not None) for u, e in pairs]
    assert list(_core.time_entries_ok(units, times + b"\0" * 8)) == got  # no unit: not looked at


def test_pack_units_refuses_rows_outside_the_frame_and_short_columns() -> None:
    cols = [_int64([1, 2]) for _ in range(4)]
    with pytest.raises(IndexError):
        _core.pack_units(_int64([0, 2]), 0, *cols, 0)
    with pytest.raises(IndexError):
        _core.plain_start(_int64([-1]), cols[0], cols[1], cols[2], 0, 0)
    with pytest.raises(ValueError, match="int64 rows"):
        _core.pack_units(_int64([0, 1]), 0, cols[0], _int64([1]), cols[2], cols[3], 0)
    with pytest.raises(ValueError, match="start 3 of 2"):
        _core.pack_units(_int64([0, 1]), 3, *cols, 0)
    with pytest.raises(ValueError, match="int64 rows"):
        _core.queue_runs(cols[0], _int64([]), cols[2])


def reference_plain_start(
    queue_offsets: list[int], end_offsets: list[int], expect: int, last_end: int
) -> int | None:
    """plain_run_start as it was written on lists (the specification)."""
    n = len(queue_offsets)
    k = 0
    while k < n and not (end_offsets[k] > last_end and queue_offsets[k] >= expect):
        k += 1
    if k == n:
        return n
    if queue_offsets[k] != expect:
        return None
    if queue_offsets[k:] != list(range(expect, expect + n - k)):
        return None
    if not all(a < b for a, b in itertools.pairwise(end_offsets[k:])):
        return None
    return k


def _plain(offsets: list[int], ends: list[int], expect: int, last_end: int) -> int | None:
    """plain_run_start of a run laid out as a frame's rows, sizes 1 (phy = end - 1)."""
    n = len(offsets)
    columns = DispatchColumns.from_entries(
        [DispatchEntry("T", 0, q, e - 1, 1, 0, 0) for q, e in zip(offsets, ends, strict=True)]
    )
    return plain_run_start(np.arange(n, dtype=np.int64), columns, expect, last_end)


@pytest.mark.parametrize(
    ("offsets", "ends", "expect", "last_end", "start"),
    [
        ([5, 6, 7], [10, 20, 30], 5, 0, 0),  # plain from the first row
        ([3, 4, 5, 6], [5, 10, 20, 30], 5, 10, 2),  # a replayed prefix is skipped
        ([3, 4], [5, 10], 5, 10, 2),  # everything applied before
        ([6, 7], [10, 20], 5, 0, None),  # a gap before the first row
        ([5, 7], [10, 20], 5, 0, None),  # a gap inside
        ([5, 6], [20, 10], 5, 0, None),  # an end going back: `_apply` would skip it
        ([5, 5], [10, 20], 5, 0, None),  # a queue offset repeated
    ],
)
def test_a_run_is_plain_only_without_gaps_or_skips_after_its_start(
    offsets: list[int], ends: list[int], expect: int, last_end: int, start: int | None
) -> None:
    assert _plain(offsets, ends, expect, last_end) == start
    assert reference_plain_start(offsets, ends, expect, last_end) == start


def test_a_unit_is_a_hashable_value_read_alike_from_both_stores(tmp_path: Path) -> None:
    entries = [DispatchEntry("T", 0, i, 100 * i, 100, 5, 1_000 + i) for i in range(10)]
    units = []
    for kind in KINDS:
        store = _open(kind, str(tmp_path / kind.value), ManualClock())
        try:
            store.put_columns(DispatchColumns.from_entries(entries))
            units.append(store.read_units("T", 0, 0, 10))
        finally:
            store.close()
    assert units[0] == units[1]
    assert len(set(units[0])) == 10
    assert units[0][3] in set(units[1])


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.sampled_from([1, 1, 1, 1, 0, 2, -1]), min_size=1, max_size=90),
    grows=st.lists(st.sampled_from([240, 240, 100, 0, -5]), min_size=90, max_size=90),
    expect=st.integers(0, 6),
    last_end=st.sampled_from([0, 480, 1_000, 10**9]),
)
def test_the_compiled_plain_check_is_the_reference_on_any_run(
    steps: list[int], grows: list[int], expect: int, last_end: int
) -> None:
    """Gaps, repeats, ends going back, replayed prefixes: the same answer as the list code."""
    offsets = list(itertools.accumulate(steps, initial=2))[1:]
    ends = list(itertools.accumulate(grows[: len(steps)], initial=200))[1:]
    want = reference_plain_start(offsets, ends, expect, last_end)
    assert _plain(offsets, ends, expect, last_end) == want
