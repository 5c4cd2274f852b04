"""The compiled core's index operations (_core_index.pxi) pinned to their plain-Python
specifications: index_file.put_keys to put_keys_reference byte for byte on the file and the
header, keyhash.index_hashes_prefixed to javahash.index_key_hash key by key."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import _core, keyhash, sysflag
from mqstore.formats import index_file as fmt
from mqstore.formats.javahash import index_key_hash

INT32_MAX = (1 << 31) - 1
T0_MS = 1_700_000_000_000


@st.composite
def put_cases(draw: st.DrawFn) -> tuple[bytearray, int, fmt.IndexHeader, list[np.ndarray]]:
    """A file of a few slots and entries whose slots hold anything (empty, earlier entries,
    garbage numbers at or beyond the count, negatives), a header at some count, and a batch
    that fits: hashes crowd few slots, so chains form inside the batch."""
    slot_num = draw(st.integers(1, 9))
    count = draw(st.integers(1, 12))
    m = draw(st.integers(1, 12))
    entry_num = count + m + draw(st.integers(0, 2))
    buf = bytearray(fmt.file_bytes(slot_num, entry_num))
    slot_values = draw(
        st.lists(st.integers(-3, count + m + 3), min_size=slot_num, max_size=slot_num)
    )
    for s, value in enumerate(slot_values):
        fmt.SLOT.pack_into(buf, fmt.slot_pos(s), value)
    begin = draw(st.sampled_from([0, -5, T0_MS]))
    header = fmt.IndexHeader(
        begin_ts_ms=begin,
        end_ts_ms=begin + draw(st.integers(0, 10_000)),
        begin_phy=7,
        end_phy=99,
        slots_used=draw(st.integers(0, slot_num)),
        index_count=count,
    )
    hashes = draw(st.lists(st.integers(0, INT32_MAX), min_size=m, max_size=m))
    phys = draw(st.lists(st.integers(0, 1 << 50), min_size=m, max_size=m))
    times = draw(
        st.lists(
            st.integers(T0_MS - 5_000, T0_MS + (INT32_MAX + 10) * 1000), min_size=m, max_size=m
        )
    )
    columns = [np.array(c, dtype=np.int64) for c in (hashes, phys, times)]
    return buf, slot_num, header, columns


@settings(max_examples=400, deadline=None)
@given(put_cases())
def test_compiled_put_keys_writes_the_bytes_and_header_of_the_reference(
    case: tuple[bytearray, int, fmt.IndexHeader, list[np.ndarray]],
) -> None:
    buf, slot_num, header, (hashes, phys, times) = case
    want_buf, want_header = bytearray(buf), dataclasses.replace(header)
    fmt.put_keys_reference(want_buf, slot_num, want_header, hashes, phys, times)
    fmt.put_keys(buf, slot_num, header, hashes, phys, times)
    assert bytes(buf) == bytes(want_buf)
    assert header == want_header


def test_compiled_put_keys_refuses_a_batch_that_does_not_fit() -> None:
    buf = bytearray(fmt.file_bytes(4, 3))
    keys = np.arange(3, dtype=np.int64)
    try:
        fmt.put_keys(buf, 4, fmt.IndexHeader(), keys, keys, keys)
    except ValueError:
        return
    raise AssertionError("entries 1..3 of a 3-entry file were written")


# Keys with every kind of str: ASCII, Latin-1, BMP, supplementary planes (surrogate pairs in
# UTF-16) and lone surrogates (which the Java hash takes as code units).
_keys = st.text(
    alphabet=st.one_of(
        st.characters(max_codepoint=0x7F),
        st.characters(min_codepoint=0x80, max_codepoint=0xFF),
        st.characters(min_codepoint=0x100),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=12) | _keys, st.lists(_keys, max_size=30))
def test_compiled_index_hashes_are_index_key_hash_of_prefix_and_key(
    prefix: str, keys: list[str]
) -> None:
    got = keyhash.index_hashes_prefixed(prefix, keys).tolist()
    assert got == [index_key_hash(prefix + k) for k in keys]
    assert keyhash.index_hashes([prefix + k for k in keys]).tolist() == got


def test_the_hash_of_integer_min_value_is_zero() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE, whose abs RocketMQ maps to 0.
    assert keyhash.index_hashes_prefixed("polygene", ["lubricants"]).tolist() == [0]


def _rows_walk(
    offsets: list[int], sizes: list[int], flags: list[int], applied: int
) -> tuple[list[int], int]:
    """IndexEngine.apply's walk over a frame's entries: replays skipped, rolled-back
    transactions taken (they move the applied offset) but not written."""
    rows = []
    for i, (offset, size, flag) in enumerate(zip(offsets, sizes, flags, strict=True)):
        if offset < applied:
            continue
        applied = offset + size
        if flag & sysflag.TRANSACTION_MASK != sysflag.TRANSACTION_ROLLBACK_TYPE:
            rows.append(i)
    return rows, applied


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 500), st.integers(0, 60), st.sampled_from([0, 4, 8, 0xC, 0x3])),
        max_size=30,
    ),
    st.integers(0, 300),
)
def test_compiled_index_rows_are_the_rows_apply_walks(
    rows: list[tuple[int, int, int]], applied: int
) -> None:
    """Frames in and out of commit-log order (replays after a reconnect, overlaps) and every
    transaction kind."""
    offsets, sizes, flags = ([r[k] for r in rows] for k in range(3))
    o, z, f = (np.array(c, dtype=np.int64) for c in (offsets, sizes, flags))
    taken, got_applied = _core.index_rows(o, z, f, applied)
    assert (np.frombuffer(taken, dtype=np.int64).tolist(), got_applied) == _rows_walk(
        offsets, sizes, flags, applied
    )
