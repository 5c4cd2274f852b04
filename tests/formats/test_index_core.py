"""The compiled core's index operations (_core_index.pxi) pinned to their plain-Python
specifications: index_file.put_keys to put_keys_reference byte for byte on the file and the
header, keyhash.index_hashes (str keys, numpy) to javahash.index_key_hash key by key, and
keyhash.message_key_hashes (a frame's keys hashed from its UTF-8 string columns) to
message_key_hashes_reference key by key, its UTF-8 verdicts to Python's strict decoder's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
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
@given(st.lists(_keys, max_size=30))
def test_index_hashes_of_str_keys_are_index_key_hash_key_by_key(keys: list[str]) -> None:
    assert keyhash.index_hashes(keys).tolist() == [index_key_hash(k) for k in keys]


def _key_hashing_to(prefix: str, target: int) -> str:
    """A key whose Java hash after the ASCII `prefix` is `target` mod 2**32: seven base-31
    digits as the characters U+0000..U+001E (31**7 > 2**32)."""
    h = 0
    for c in prefix:
        h = (h * 31 + ord(c)) % (1 << 32)
    want = (target - h * 31**7) % (1 << 32)
    digits = []
    for _ in range(7):
        want, d = divmod(want, 31)
        digits.append(chr(d))
    return "".join(reversed(digits))


def test_the_hash_of_integer_min_value_is_zero() -> None:
    # "polygenelubricants".hashCode() is Integer.MIN_VALUE, whose abs RocketMQ maps to 0.
    assert keyhash.index_hashes(["polygenelubricants"]).tolist() == [0]
    key = _key_hashing_to("T#", 1 << 31).encode("utf-8")
    one = np.zeros(1, dtype=np.int64)
    column = (key, np.array([0, len(key)], dtype=np.int64))
    hashes, _ = keyhash.message_key_hashes(["T"], one, one, column, (b"", one[:0]))
    assert hashes.tolist() == [0]


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


# Strings a frame can carry (UTF-8 has no lone surrogates): ASCII, Latin-1, BMP, supplementary
# planes, and spaces, so that KEYS splits into repeated, empty and non-ASCII tokens.
_frame_strings = st.text(
    alphabet=st.one_of(
        st.sampled_from(" ab"),
        st.characters(max_codepoint=0x7F),
        st.characters(min_codepoint=0x80, max_codepoint=0xFF),
        st.characters(min_codepoint=0x100, exclude_categories=["Cs"]),
    ),
    max_size=24,
)


def _column(strings: list[str] | None) -> tuple[bytes, np.ndarray]:
    """A string column as decode_response gives it (None: a frame without the column)."""
    if strings is None:
        return b"", np.zeros(0, dtype=np.int64)
    parts = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in parts])
    return b"".join(parts), offsets


@st.composite
def key_frames(draw: st.DrawFn) -> tuple[list[str], list[int], list[int], list[str], list[str]]:
    """Topics, each row's topic, the rows taken (any order, repeats), unique ids and KEYS
    (either column may be absent: an empty list)."""
    topics = draw(st.lists(st.text(max_size=8) | _keys, min_size=1, max_size=3))
    n = draw(st.integers(0, 12))
    topic_indexes = draw(st.lists(st.integers(0, len(topics) - 1), min_size=n, max_size=n))
    rows = draw(st.lists(st.integers(0, n - 1), max_size=14)) if n else []
    uniq = draw(st.lists(_frame_strings, min_size=n, max_size=n) | st.just([]))
    keys = draw(st.lists(_frame_strings, min_size=n, max_size=n) | st.just([]))
    return topics, topic_indexes, rows, uniq, keys


@settings(max_examples=500, deadline=None)
@given(key_frames())
def test_compiled_message_key_hashes_are_the_reference_key_by_key(
    frame: tuple[list[str], list[int], list[int], list[str], list[str]],
) -> None:
    """keyhash.message_key_hashes, hashing from the frame's UTF-8 bytes, gives what
    message_keys then javahash.index_key_hash give for the decoded strings, in order."""
    topics, topic_indexes, rows, uniq, keys = frame
    hashes, key_rows = keyhash.message_key_hashes(
        topics,
        np.array(topic_indexes, dtype=np.int64),
        np.array(rows, dtype=np.int64),
        _column(uniq if uniq else None),
        _column(keys if keys else None),
    )
    want = keyhash.message_key_hashes_reference(topics, topic_indexes, rows, uniq, keys)
    assert (hashes.tolist(), key_rows.tolist()) == want


# Bytes near UTF-8's edges: every lead byte class and the continuation bounds that the strict
# rules single out (overlong E0/F0, surrogates ED A0.., beyond U+10FFFF F4 90.., F5..FF).
_edge_bytes = st.lists(
    st.sampled_from(
        [
            *(0x00, 0x20, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2),
            *(0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF),
        ]
    ),
    max_size=10,
).map(bytes)


@settings(max_examples=1000, deadline=None)
@given(_edge_bytes | st.binary(max_size=12) | _frame_strings.map(lambda s: s.encode("utf-8")))
def test_a_key_is_hashed_from_its_bytes_when_python_decodes_them_and_refused_when_not(
    raw: bytes,
) -> None:
    """The compiled UTF-8 reading takes exactly the bytes Python's strict decoder takes (the
    verdict decode_response gives a frame), and hashes the str that decoder makes."""
    column = (raw, np.array([0, len(raw)], dtype=np.int64))
    one = np.zeros(1, dtype=np.int64)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(ValueError, match="no UTF-8"):
            keyhash.message_key_hashes(["T"], one, one, column, column)
        return
    hashes, _ = keyhash.message_key_hashes(["T"], one, one, column, column)
    want, _ = keyhash.message_key_hashes_reference(["T"], [0], [0], [text], [text])
    assert hashes.tolist() == want
