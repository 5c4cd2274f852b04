"""build_queue_columns (numpy over a queue's dispatch entries, what the rebuild and audit jobs
run) makes exactly the units QueueImage.apply (entry by entry, cq_svc's rule) makes, for
entries in any order: replays, queue offsets going back, gaps, queues starting above 0 or past
a file, times out of order or out of range; and the same error for a gap over a file.
QueueUnits.files() writes the bytes the per-unit encoders write; the jobs' tags codes are
javahash.tags_code's. No Spark here."""

from __future__ import annotations

import importlib
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import InvalidArgument, InvariantViolation
from mqstore.formats import index_file as ifmt
from mqstore.formats import index_hash64, keyhash
from mqstore.formats.cq_time import TIME_BYTES, TIME_MAX_MS, encode_time
from mqstore.formats.cq_unit import UNIT, UNIT_BYTES
from mqstore.formats.javahash import tags_code
from mqstore.spark.jobs import derived, rebuild

pa: Any = importlib.import_module("pyarrow")
UNITS_PER_FILE = 8  # small files: blanks, file starts and gaps over a file in a few entries


@st.composite
def queue_entries(draw: st.DrawFn) -> list[derived.QueueEntry]:
    """A queue's entries as a log holds them: records side by side (no overlap), each with a
    queue offset mostly one above the last, sometimes replayed, back, or past a gap."""
    n = draw(st.integers(0, 40))
    qo = draw(st.integers(0, 3 * UNITS_PER_FILE))
    phy = draw(st.integers(0, 1000))
    out = []
    for _ in range(n):
        size = draw(st.integers(1, 300))
        ts = draw(st.one_of(st.integers(-5, 10_000), st.just(TIME_MAX_MS + 7)))
        tags = draw(st.one_of(st.just(0), st.integers(-(2**31), 2**31 - 1)))
        out.append(derived.QueueEntry(qo, phy, size, tags, ts))
        phy += size + draw(st.integers(0, 50))
        qo += draw(
            st.sampled_from([1, 1, 1, 0, -1, -3, 2, 5, UNITS_PER_FILE + 1, UNITS_PER_FILE + 2])
        )
        qo = max(qo, draw(st.sampled_from([0, -1])))
    return out


def _build(
    entries: list[derived.QueueEntry], units_per_file: int = UNITS_PER_FILE, where: str = ""
) -> derived.QueueUnits:
    def col(values: list[int]) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    return derived.build_queue_columns(
        col([e.queue_offset for e in entries]),
        col([e.commit_log_offset for e in entries]),
        col([e.size for e in entries]),
        col([e.tags_code for e in entries]),
        col([e.store_timestamp_ms for e in entries]),
        units_per_file,
        where,
    )


@settings(max_examples=500, deadline=None)
@given(entries=queue_entries(), seed=st.integers(0, 2**32 - 1))
def test_columns_build_the_units_apply_builds_entry_by_entry(
    entries: list[derived.QueueEntry], seed: int
) -> None:
    shuffled = list(entries)
    random.Random(seed).shuffle(shuffled)  # both sort by commit-log offset
    try:
        want = derived.build_queue(shuffled, UNITS_PER_FILE, "t/0").units()
    except InvalidArgument as err:
        with pytest.raises(InvalidArgument) as raised:
            _build(shuffled, where="t/0")
        assert str(raised.value) == str(err)
        return
    got = _build(shuffled, where="t/0")
    assert (got.first_file_offset, got.min_offset, got.max_offset) == (
        want.first_file_offset,
        want.min_offset,
        want.max_offset,
    )
    for name in ("phy", "size", "tags", "time"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist(), name


def test_overlapping_records_are_a_broken_invariant() -> None:
    entries = [derived.QueueEntry(0, 100, 50, 0, 1), derived.QueueEntry(1, 120, 10, 0, 1)]
    with pytest.raises(InvariantViolation):
        _build(entries)


@settings(max_examples=200, deadline=None)
@given(entries=queue_entries())
def test_files_hold_the_bytes_of_the_unit_and_time_encoders(
    entries: list[derived.QueueEntry],
) -> None:
    try:
        image = _build(entries)
    except InvalidArgument:
        return
    files = list(image.files())
    assert [first for first, _, _ in files] == list(
        range(image.first_file_offset, image.max_offset, UNITS_PER_FILE)
    )
    for first, units, times in files:
        want_units = bytearray(UNITS_PER_FILE * UNIT_BYTES)
        want_times = bytearray(UNITS_PER_FILE * TIME_BYTES)
        for i in range(UNITS_PER_FILE):
            row = first - image.first_file_offset + i
            if row >= len(image.phy):
                break
            UNIT.pack_into(
                want_units, i * UNIT_BYTES, image.phy[row], image.size[row], image.tags[row]
            )
            unit = bytes(want_units[i * UNIT_BYTES : (i + 1) * UNIT_BYTES])
            t = int(image.time[row])
            want_times[i * TIME_BYTES : (i + 1) * TIME_BYTES] = encode_time(unit, t)
        assert units == bytes(want_units)
        assert times == bytes(want_times)


def test_a_groups_tags_codes_are_tags_code_of_each_tags_string() -> None:
    tags = [None, "", "TagA", "t3", "\u00fc\u975e", "\U0001f600x", "a" * 70]
    table = pa.table(
        {
            "queueOffset": list(range(len(tags))),
            "commitLogOffset": [100 * i for i in range(len(tags))],
            "totalSize": [90] * len(tags),
            "tags": tags,
            "storeTimestampMs": [5] * len(tags),
        }
    )
    units = rebuild.queue_units_of(table, UNITS_PER_FILE, "t/0")
    assert units.tags.tolist() == [tags_code(t) for t in tags]


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=40))
def test_an_index_file_of_utf8_keys_is_the_one_of_the_strings(keys: list[str]) -> None:
    """Utf8Keys (what a task takes from Arrow) give the strings back for exact mode's 64-bit
    hashes, and put the same entries and slots as keyhash.index_hashes of the strings."""
    utf8 = derived.Utf8Keys.of(keys)
    assert utf8.strings() == keys
    geometry = derived.IndexGeometry(slot_num=7, entry_num=64, exact=True)
    phys = np.arange(len(keys), dtype=np.int64) * 100
    image = derived.build_index_file(geometry, utf8, phys, phys + 5)
    want = bytearray(ifmt.file_bytes(7, 64))
    header = ifmt.IndexHeader()
    ifmt.put_keys(want, 7, header, keyhash.index_hashes(keys), phys, phys + 5)
    want[0 : ifmt.HEADER_BYTES] = ifmt.encode_header(header)
    assert bytes(image.data) == bytes(want)
    assert image.companion is not None
    at = index_hash64.hash_pos(1)
    wide = keyhash.hashes64(keys).astype(index_hash64.HASH_DTYPE).tobytes()
    assert bytes(image.companion[at : at + len(wide)]) == wide
