"""The compiled log reader (`_core.read_log_columns`, the mqstore-log source's path) gives
record.read_record's verdicts and the rows the source built from its Records.

Over random logs with every record shape and every kind of damage of the recovery walk's
property test (tests/formats/test_record_walk.py), plus properties of every shape
decode_properties meets (pairs, short and malformed segments, a repeated key, bytes that are no
ASCII): the reader stops where the reference does (at `end` or `stop`, after `rows_max` rows, or
at the first record read_record does not return as a Record or whose properties it leaves to
decode_properties), and each row it read, every column, equals the row log_source built with
read_record and decode_properties (`_Columns.add_record`).
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import _core
from mqstore.formats.properties import decode_properties
from mqstore.formats.record import Buffer, Record, encode_blank, encode_record, read_record
from mqstore.spark import log_source
from tests.formats.test_record_walk import DAMAGE, TOPICS, TX, V4, V6, build_log, damage

# Pieces of which random property bytes are made: separators, the keys the source reads into
# columns of their own, other text, and bytes that are no ASCII.
PROPERTY_PIECES = [
    b"\x01",
    b"\x02",
    b"TAGS",
    b"KEYS",
    b"UNIQ_KEY",
    b"k",
    b"v1",
    b"a b",
    b"\xc3\xbc",
]


def random_properties(rng: random.Random) -> bytes:
    shape = rng.random()
    if shape < 0.3:
        return b""
    if shape < 0.6:  # well-formed pairs, keys maybe repeated
        keys = [
            rng.choice(["TAGS", "KEYS", "UNIQ_KEY", "X", "yy"]) for _ in range(rng.randrange(4))
        ]
        return b"".join(f"{k}\x01v{i}\x02".encode() for i, k in enumerate(keys))
    raw = b"".join(rng.choice(PROPERTY_PIECES) for _ in range(rng.randrange(12)))
    return raw + b"\x02"


def props_log(rng: random.Random, base: int, count: int) -> bytearray:
    """Records whose properties are drawn from random_properties."""
    out = bytearray()
    for i in range(count):
        out += encode_record(
            topic=rng.choice(TOPICS),
            queue_id=rng.randrange(4),
            body=rng.randbytes(rng.choice([0, 3, 60])),
            properties=random_properties(rng),
            queue_offset=i,
            physical_offset=base + len(out),
            sys_flag=rng.choice(TX),
            born_host=rng.choice([V4, V6]),
            store_host=rng.choice([V4, V4, V6]),
            store_timestamp_ms=1_700_000_000_000 + i,
            born_timestamp_ms=rng.randrange(1 << 42),
            reconsume_times=rng.randrange(3),
            prepared_tx_offset=rng.randrange(1 << 40),
            flag=rng.randrange(-5, 5),
            record_crc=rng.random() < 0.7,
        )
    return out


def leaves_to_python(rec: Record) -> bool:
    """Properties whose map the compiled reader leaves to decode_properties."""
    raw = rec.properties
    if not raw.isascii():
        return True
    keys = [
        s.split(b"\x01")[0]
        for s in raw.split(b"\x02")
        if len(s) >= 3 and 0 < s.find(b"\x01") < len(s) - 1
    ]
    return len(keys) != len(set(keys))


def reference(
    buf: Buffer,
    pos: int,
    end: int,
    stop: int,
    base: int,
    *,
    check_crc: bool,
    include_body: bool,
    topics: frozenset[str] | None,
    rows_max: int,
) -> tuple[int, int, list[dict[str, Any]]]:
    """(why, position, rows) by read_record and the source's Python row builder."""
    cols = log_source._Columns()
    while True:
        if pos >= end or pos >= stop:
            why = _core.LOG_STOP_END
            break
        if len(cols) == rows_max:
            why = _core.LOG_STOP_FULL
            break
        found = read_record(buf, pos, end, check_crc=check_crc, expected_offset=base + pos)
        if not isinstance(found, Record):
            why = _core.LOG_STOP_RECORD
            break
        if topics is None or found.topic in topics:
            if leaves_to_python(found):
                why = _core.LOG_STOP_RECORD
                break
            cols.add_record(base + pos, found, include_body, None)
        pos += found.total_size
    names = list(cols.cols)
    return (
        why,
        pos,
        [dict(zip(names, row, strict=True)) for row in zip(*cols.cols.values(), strict=True)],
    )


def compiled(
    buf: Buffer,
    pos: int,
    end: int,
    stop: int,
    base: int,
    *,
    check_crc: bool,
    include_body: bool,
    topics: frozenset[str] | None,
    rows_max: int,
) -> tuple[int, int, list[dict[str, Any]]]:
    why, after, rows, pairs, cols, names, hosts = _core.read_log_columns(
        buf, pos, end, stop, base, check_crc, include_body, topics, rows_max
    )
    opts = log_source.LogReadOptions("unused", include_body=include_body)
    batch = log_source._record_batch(
        log_source.arrow_schema(), opts, rows, pairs, cols, names, hosts
    )
    assert batch.num_rows == rows
    return why, after, batch.to_pylist()


def both(
    buf: Buffer, pos: int, end: int, stop: int, base: int, **kw: Any
) -> tuple[int, int, list[dict[str, Any]]]:
    ref = reference(buf, pos, end, stop, base, **kw)
    fast = compiled(buf, pos, end, stop, base, **kw)
    assert fast[:2] == ref[:2]
    assert len(fast[2]) == len(ref[2])
    for got, want in zip(fast[2], ref[2], strict=True):
        assert got == want
    return ref


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 40),
    layout=st.sampled_from(["mixed", "same_body", "uniform", "props"]),
    blank=st.booleans(),
    kinds=DAMAGE,
    base=st.sampled_from([0, 4096, (1 << 40) + 12]),
    check_crc=st.booleans(),
    include_body=st.booleans(),
    filtered=st.booleans(),
    rows_max=st.sampled_from([1, 3, 10_000]),
)
def test_compiled_reader_gives_read_records_rows(
    seed: int,
    count: int,
    layout: str,
    blank: bool,
    kinds: list[str],
    base: int,
    check_crc: bool,
    include_body: bool,
    filtered: bool,
    rows_max: int,
) -> None:
    rng = random.Random(seed)
    data = (
        props_log(rng, base, count)
        if layout == "props"
        else build_log(rng, base, count, layout=layout)
    )
    if blank:
        data += encode_blank(64) + bytes(56)
    data = damage(rng, data, kinds)
    end = len(data)
    topics = frozenset(rng.sample(TOPICS, 2)) if filtered else None
    kw = {
        "check_crc": check_crc,
        "include_body": include_body,
        "topics": topics,
        "rows_max": rows_max,
    }
    both(bytes(data), 0, end, end, base, **kw)
    # From anywhere, to a `stop` anywhere, over part of the buffer (a cut inside a record).
    pos = rng.randrange(end + 1)
    both(data, pos, end, rng.randrange(end + 1), base, **kw)
    both(memoryview(data), 0, rng.randrange(end + 1), end, base, **kw)


def test_a_long_run_fills_batches_of_rows_max() -> None:
    rng = random.Random(5)
    data = bytes(build_log(rng, 0, 250, layout="uniform"))
    kw: dict[str, Any] = {"check_crc": True, "include_body": True, "topics": None, "rows_max": 100}
    why, pos, rows = both(data, 0, len(data), len(data), 0, **kw)
    assert (why, len(rows)) == (_core.LOG_STOP_FULL, 100)
    why, pos, rows = both(data, pos, len(data), len(data), 0, **kw)
    assert (why, len(rows)) == (_core.LOG_STOP_FULL, 100)
    why, pos, rows = both(data, pos, len(data), len(data), 0, **kw)
    assert (why, pos, len(rows)) == (_core.LOG_STOP_END, len(data), 50)


def test_properties_are_decode_properties_map_and_columns() -> None:
    props = b"TAGS\x01t1\x02KEYS\x01a b\x02\x01x\x02ab\x02UNIQ_KEY\x01U1\x02z\x01\x02"
    data = encode_record(topic="orders", queue_id=1, body=b"b", properties=props)
    _, _, rows = both(
        data,
        0,
        len(data),
        len(data),
        0,
        check_crc=True,
        include_body=True,
        topics=None,
        rows_max=10,
    )
    (row,) = rows
    assert dict(row["properties"]) == decode_properties(props)
    assert (row["tags"], row["keys"], row["uniqKey"]) == ("t1", "a b", "U1")


def test_properties_the_reader_leaves_to_python_stop_it_before_their_record() -> None:
    first = encode_record(topic="orders", queue_id=1, body=b"b", properties=b"K\x01v\x02")
    for props in (b"K\x01\xc3\xbc\x02", b"K\x01a\x02K\x01b\x02"):
        second = encode_record(
            topic="orders", queue_id=1, body=b"c", properties=props, physical_offset=len(first)
        )
        data = first + second
        why, pos, rows = both(
            data,
            0,
            len(data),
            len(data),
            0,
            check_crc=True,
            include_body=False,
            topics=None,
            rows_max=10,
        )
        assert (why, pos, len(rows)) == (_core.LOG_STOP_RECORD, len(first), 1)
