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
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
import rocksdict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cq_svc.config import CqConfig, StoreKind
from cq_svc.engine import make_store
from cq_svc.rocks_store import OFFSET_CF
from cq_svc.store import CqStore
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


_pack_runs = _core.pack_runs


def _no_run_plain(*args: Any) -> tuple[Any, ...]:
    """_core.pack_runs finding no run plain: the stores apply every run through `_apply`."""
    ends, _, _ = _pack_runs(*args)
    nothing: list[bytes] = [] if args[8] is not None else [b""] * len(ends)
    return [(-1, *end[1:]) for end in ends], nothing, nothing


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
                pack = _core.pack_runs if packed else _no_run_plain
                try:
                    with mock.patch.object(_core, "pack_runs", pack):
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


def _states(*states: tuple[int, int, int]) -> list[SimpleNamespace]:
    """Queue states as _core.pack_runs reads them: (next offset, newest end, indexed time)."""
    return [SimpleNamespace(max_offset=q, last_phy_end=e, last_time_ms=t) for q, e, t in states]


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
    columns: list[Any] = [_int64([r[j] for r in rows]) for j in range(4)]
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
    cols: list[Any] = [_int64([1, 2]) for _ in range(4)]
    with pytest.raises(IndexError):
        _core.pack_units(_int64([0, 2]), 0, *cols, 0)
    with pytest.raises(IndexError):
        _core.pack_runs(_int64([-1]), _int64([0, 1]), *cols, cols[0], _states((0, 0, 0)))
    with pytest.raises(ValueError, match="bounds"):
        _core.pack_runs(_int64([0, 1]), _int64([0, 1]), *cols, cols[0], _states((0, 0, 0)))
    with pytest.raises(ValueError, match="1 queue states for 2 runs"):
        _core.pack_runs(_int64([0, 1]), _int64([0, 1, 2]), *cols, cols[0], _states((0, 0, 0)))
    with pytest.raises(ValueError, match="1 key prefixes for 2 runs"):
        _core.pack_runs(
            _int64([0, 1]), _int64([0, 1, 2]), *cols, cols[0], _states(*[(0, 0, 0)] * 2), [b""]
        )
    with pytest.raises(ValueError, match="int64 rows"):
        _core.pack_units(_int64([0, 1]), 0, cols[0], _int64([1]), cols[2], cols[3], 0)
    with pytest.raises(ValueError, match="start 3 of 2"):
        _core.pack_units(_int64([0, 1]), 3, *cols, 0)
    with pytest.raises(ValueError, match="int64 rows"):
        _core.queue_runs(cols[0], _int64([]), cols[2])


def reference_plain_start(
    queue_offsets: list[int], end_offsets: list[int], expect: int, last_end: int
) -> int | None:
    """Where a run starts to be written when it is plain, on lists (the specification):
    entry by entry, `_apply` skips an entry that ends at or below the queue's newest end or
    whose queue offset is below the queue's next one, fills a gap before an offset above it,
    and writes the others. A run is plain when, after a prefix of skipped entries, every entry
    is written with neither a gap nor a skip. len: none is; None: not plain."""
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
    """_core.pack_runs's start of a frame of one run, sizes 1 (phy = end - 1)."""
    n = len(offsets)
    cols: list[Any] = [
        _int64(offsets),
        _int64([e - 1 for e in ends]),
        _int64([1] * n),
        _int64([0] * n),
    ]
    state = _states((expect, last_end, 0))
    runs, *_ = _core.pack_runs(np.arange(n, dtype=np.int64), _int64([0, n]), *cols, cols[3], state)
    return None if runs[0][0] < 0 else runs[0][0]


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


def reference_pack_runs(
    runs: list[list[int]],
    rows: list[tuple[int, int, int, int, int]],
    state: list[tuple[int, int, int]],
    prefixes: list[bytes] | None,
) -> tuple[list[tuple[int, ...]], list[bytes], list[bytes]]:
    """_core.pack_runs run by run on lists: rows (queue offset, phy, size, tags, store time);
    each run's start, next queue offset, first and last written phy, last size and indexed
    time, and its units and time entries (file store: bytes a run) or keys and values
    (RocksDB: bytes a written row)."""
    ends: list[tuple[int, ...]] = []
    a: list[bytes] = []
    b: list[bytes] = []
    for r, run in enumerate(runs):
        expect, last_end, last_time = state[r]
        qo = [rows[i][0] for i in run]
        start = reference_plain_start(qo, [rows[i][1] + rows[i][2] for i in run], expect, last_end)
        written = run[start:] if start is not None else []
        units, times = [], []
        for j, i in enumerate(written):
            _, phy, size, tags, ts = rows[i]
            last_time = max(last_time, clamp_time(ts))
            units.append(encode_units([(phy, size, tags)]))
            times.append(encode_time(units[-1], last_time))
            if prefixes is not None:
                a.append(prefixes[r] + (expect + j).to_bytes(8, "big"))
                b.append(units[-1] + last_time.to_bytes(8, "big"))
        if prefixes is None:
            a.append(b"".join(units))
            b.append(b"".join(times))
        first_phy = rows[written[0]][1] if written else -1
        _, last_phy, last_size, *_ = rows[written[-1]] if written else (0, -1, 0)
        next_offset = expect + len(written)
        start = -1 if start is None else start
        ends.append((start, next_offset, first_phy, last_phy, last_size, last_time))
    return ends, a, b


@settings(max_examples=300, deadline=None)
@given(
    queues=st.lists(st.integers(0, 3), max_size=40),
    steps=st.lists(st.sampled_from([1, 1, 1, 1, 0, 2, -1]), min_size=40, max_size=40),
    grows=st.lists(st.sampled_from([240, 240, 100, 0, -300]), min_size=40, max_size=40),
    sizes=st.lists(st.sampled_from([100, 100, 1, 5_000]), min_size=40, max_size=40),
    stamps=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=40, max_size=40),
    state=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from([-1, 0, 480, 10**9]), st.integers(0, 99)),
        min_size=4,
        max_size=4,
    ),
    rocks=st.booleans(),
)
def test_packed_runs_are_the_reference_run_by_run(
    queues: list[int],
    steps: list[int],
    grows: list[int],
    sizes: list[int],
    stamps: list[int],
    state: list[tuple[int, int, int]],
    rocks: bool,
) -> None:
    """A frame of runs of up to 4 queues (gaps, repeats, ends going back, replayed prefixes):
    _core.pack_runs gives, run by run, the start, the ends (next offset, first and last phy,
    last size and time) and the bytes of the list reference, laid out for either store."""
    next_qo = [2, 0, 1, 3]
    rows = []
    phy = 1_000
    for i, q in enumerate(queues):
        next_qo[q] += steps[i]
        phy += grows[i]
        rows.append((next_qo[q], phy, sizes[i], i * 7 - 50, stamps[i]))
    by_queue: dict[int, list[int]] = {}
    for i, q in enumerate(queues):
        by_queue.setdefault(q, []).append(i)
    runs = list(by_queue.values())
    run_state = [state[q] for q in by_queue]
    prefixes = [b"Q%d/" % q for q in by_queue] if rocks else None
    bounds = list(itertools.accumulate((len(run) for run in runs), initial=0))
    order = [i for run in runs for i in run]
    columns: list[Any] = [_int64([row[j] for row in rows]) for j in range(5)]
    got = _core.pack_runs(_int64(order), _int64(bounds), *columns, _states(*run_state), prefixes)
    assert got == reference_pack_runs(runs, rows, run_state, prefixes)
