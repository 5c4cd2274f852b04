"""record_walk.scan_run_fast (the vectorised recovery walk) gives record.scan_run's verdicts.

Same stopping position, same count, same Blank or Bad (reason included), same queue-table
updates, over random logs with every record shape (V1 and V2 magic, IPv4 and IPv6 born and
store hosts, empty bodies, transaction types) and every kind of damage recovery meets: flipped
bits, zeroed ranges, torn tails, trailing garbage, blanks of the right and wrong size, stale
records at the wrong place, and records stored inside a body at their own position (the fast
walk's false candidates). The window, block and topic-comparison sizes are shrunk in most
examples so that every path of the fast walk runs on logs of a few KiB.
"""

from __future__ import annotations

import mmap
import random
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import record_walk, sysflag
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import (
    Bad,
    Blank,
    Buffer,
    ReadResult,
    encode_blank,
    encode_record,
    pack_host,
    scan_run,
)
from mqstore.formats.record_walk import scan_run_fast

V4 = pack_host("10.1.2.3", 10911)
V6 = pack_host("2001:db8::7", 10911)
TOPICS = ["A", "Bb", "orders", "%RETRY%" + "r" * 125, "%DLQ%" + "d" * 200]
TX = [
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_PREPARED_TYPE,
    sysflag.TRANSACTION_COMMIT_TYPE,
    sysflag.TRANSACTION_ROLLBACK_TYPE,
]
_I32 = struct.Struct(">i")


# A last pair a record written without the whole-record CRC may have: two bytes off its property
# (one byte off, it would be read as a damaged property; damage() makes those).
LOOKALIKES = [b"_xCRC3x#\x010123456789\x02"]


def build_log(rng: random.Random, base: int, count: int, *, layout: str) -> bytearray:
    """`count` records written at commit-log offset `base` onward, as the engine lays them.
    layout "mixed": every field drawn per record; "same_body": one body length; "uniform":
    records of one size laid out alike (fixed-size messages: the fast walk's shortcut). Records
    carry the whole-record CRC (the store's default) or not (older and RocketMQ's records), one
    way for a whole log or, in "mixed", drawn per record."""
    out = bytearray()
    body_len = rng.randrange(0, 120)
    hosts = (rng.choice([V4, V6]), rng.choice([V4, V6]))
    topic = rng.choice(TOPICS)
    log_crc = rng.random() < 0.7
    for i in range(count):
        record_crc = rng.random() < 0.7 if layout == "mixed" else log_crc
        mixed = layout == "mixed"
        size = rng.choice([0, 1, 7, 40, 100, rng.randrange(300)]) if mixed else body_len
        body = bytearray(rng.randbytes(size))
        if size >= 200 and rng.random() < 0.5:
            _plant_record(rng, body, base + len(out))
        if layout == "uniform":
            props = encode_properties({"KEYS": f"k{i % 10}", "TAGS": "t"})
            born, store = hosts
        else:
            props = b"" if rng.random() < 0.3 else encode_properties({"KEYS": f"k{i}"})
            if not record_crc and rng.random() < 0.2:
                props += rng.choice(LOOKALIKES)
            born, store = rng.choice([V4, V6]), rng.choice([V4, V4, V6])
            topic = rng.choice(TOPICS) if mixed else rng.choice(TOPICS[:2])
        out += encode_record(
            topic=topic,
            queue_id=rng.randrange(5),
            body=bytes(body),
            properties=props,
            queue_offset=rng.choice([i, i // 2, rng.randrange(1 << 40)]),
            physical_offset=base + len(out),
            sys_flag=rng.choice(TX),
            born_host=born,
            store_host=store,
            store_timestamp_ms=1_700_000_000_000 + i,
            record_crc=record_crc,
        )
    return out


def _plant_record(rng: random.Random, body: bytearray, record_at: int) -> None:
    """Put a valid record inside `body`, with the offset field of the place it lands on when
    the outer record has IPv4 hosts (88 header bytes; the hosts are drawn after this, so the
    planted record sits exactly at its own position only sometimes, as in real data)."""
    inner_at = rng.randrange(0, len(body) - 120)
    inner = encode_record(
        topic="A", queue_id=1, body=b"x" * 8, physical_offset=record_at + 88 + inner_at
    )
    body[inner_at : inner_at + len(inner)] = inner


def damage(rng: random.Random, data: bytearray, kinds: list[str]) -> bytearray:
    for kind in kinds:
        if not data:
            break
        at = rng.randrange(len(data))
        if kind == "flip":
            data[at] ^= 1 << rng.randrange(8)
        elif kind == "zero":
            n = rng.randrange(1, 300)
            data[at : at + n] = bytes(len(data[at : at + n]))
        elif kind == "tear":
            del data[at:]
        elif kind == "garbage":
            data += rng.randbytes(rng.randrange(1, 200))
        elif kind == "stale":
            # A copy of the log's first bytes somewhere else: magic fine, offset field wrong.
            chunk = data[: rng.randrange(1, 400)]
            data[at : at + len(chunk)] = chunk
        elif kind == "size" and at + 4 <= len(data):
            # A plausible TOTALSIZE at a record-looking place.
            _I32.pack_into(data, at, rng.randrange(-5, 600))
        elif kind == "crc_property":
            # One byte of some record's whole-record CRC property (or of a look-alike).
            found = [m.start() for m in re.finditer(rb"__CRC3", bytes(data))]
            if found:
                at = rng.choice(found) + rng.randrange(20)
                if at < len(data):
                    data[at] ^= rng.randrange(1, 256)
    return data


@contextmanager
def tiny_windows(rng: random.Random, shrink: bool) -> Iterator[None]:
    if not shrink:
        yield
        return
    with (
        mock.patch.object(record_walk, "WINDOW_BYTES", rng.choice([97, 200, 512, 1500, 4096])),
        mock.patch.object(record_walk, "SMALL_RUN_BYTES", rng.choice([0, 0, 50, 400])),
        mock.patch.object(record_walk, "CRC_BLOCK_GROUP_MIN", rng.choice([1, 2, 3, 32])),
        mock.patch.object(record_walk, "TOPIC_COMPARE_MAX", rng.choice([0, 1, 2, 8])),
        mock.patch.object(record_walk, "STRIDE_RUN_MIN", rng.choice([1, 2, 3, 16])),
    ):
        yield


def both_walks(
    buf: Buffer, pos: int, end: int, base: int, *, check_crc: bool, apply_from: int
) -> tuple[tuple[int, int, ReadResult | None], dict[str, dict[int, int]]]:
    """Run both walks; assert they agree; return the verdict and the table."""
    start_table = {"A": {0: 3}, "orders": {4: 1 << 41}}
    ref_table = {t: dict(q) for t, q in start_table.items()}
    fast_table = {t: dict(q) for t, q in start_table.items()}
    ref = scan_run(
        buf, pos, end, base, check_crc=check_crc, queue_table=ref_table, apply_from=apply_from
    )
    fast = scan_run_fast(
        buf, pos, end, base, check_crc=check_crc, queue_table=fast_table, apply_from=apply_from
    )
    assert fast == ref
    assert fast_table == ref_table
    return ref, ref_table


DAMAGE = st.lists(
    st.sampled_from(["flip", "zero", "tear", "garbage", "stale", "size", "crc_property"]),
    max_size=4,
)


@settings(max_examples=250, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 60),
    layout=st.sampled_from(["mixed", "same_body", "uniform", "uniform"]),
    blank=st.sampled_from(["none", "right", "short"]),
    kinds=DAMAGE,
    base=st.sampled_from([0, 4096, 1 << 30, (1 << 40) + 12]),
    check_crc=st.booleans(),
    shrink=st.booleans(),
)
def test_fast_walk_gives_the_reference_verdict(
    seed: int,
    count: int,
    layout: str,
    blank: str,
    kinds: list[str],
    base: int,
    check_crc: bool,
    shrink: bool,
) -> None:
    rng = random.Random(seed)
    data = build_log(rng, base, count, layout=layout)
    if blank != "none":
        rest = rng.randrange(8, 200)
        data += encode_blank(rest if blank == "right" else rest + 5) + bytes(rest - 8)
    data = damage(rng, data, kinds)
    end = len(data)
    apply_from = base + rng.randrange(end + 1)
    with tiny_windows(rng, shrink):
        both_walks(bytes(data), 0, end, base, check_crc=check_crc, apply_from=apply_from)
        # From a later record boundary (or anywhere), and on a mutable buffer as SimDisk has.
        pos = rng.randrange(end + 1)
        both_walks(data, pos, end, base, check_crc=check_crc, apply_from=apply_from)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 5_000))
def test_every_torn_tail_stops_both_walks_at_the_same_byte(seed: int, cut: int) -> None:
    rng = random.Random(seed)
    data = build_log(rng, 0, 30, layout=rng.choice(["same_body", "uniform"]))
    kept = cut % (len(data) + 1)
    torn = bytes(data[:kept]) + bytes(rng.randrange(0, 64))
    with tiny_windows(rng, True):
        (pos, _, stop), _ = both_walks(torn, 0, len(torn), 0, check_crc=True, apply_from=0)
    # What is accepted is what was written (a tear inside a record's trailing zero bytes, an
    # empty properties length, leaves the record whole, so pos may pass the cut by that much).
    assert torn[:pos] == data[:pos]
    assert stop is None or isinstance(stop, Bad | Blank)


def test_a_record_planted_in_a_body_at_its_own_position_is_skipped_not_taken() -> None:
    # The outer record is IPv4/IPv4 V1, so its body starts 88 bytes in; the inner record sits
    # 16 bytes into the body with the offset field of that exact position: a true candidate
    # for the fast pass that is not a record boundary.
    inner = encode_record(topic="A", queue_id=1, body=b"inner", physical_offset=88 + 16)
    body = bytes(16) + inner + bytes(40)
    log = encode_record(topic="T", queue_id=0, body=body, physical_offset=0)
    log += encode_record(topic="T", queue_id=0, body=b"next", physical_offset=len(log))
    with mock.patch.object(record_walk, "SMALL_RUN_BYTES", 0):
        (pos, walked, stop), table = both_walks(log, 0, len(log), 0, check_crc=True, apply_from=0)
    assert (pos, walked, stop) == (len(log), 2, None)
    assert "A" not in table or table["A"] == {0: 3}


def test_long_uniform_log_walks_whole_across_windows() -> None:
    rng = random.Random(7)
    data = build_log(rng, 4096, 3000, layout="uniform") + encode_blank(100) + bytes(92)
    with mock.patch.object(record_walk, "WINDOW_BYTES", 64 << 10):
        (_, walked, stop), _ = both_walks(data, 0, len(data), 4096, check_crc=True, apply_from=0)
    assert walked == 3000
    assert stop == Blank(100)


def test_fast_walk_on_a_real_map_leaves_it_closable(tmp_path: Path) -> None:
    """MappedFile.shutdown closes the map: the walk must hold no export of it afterwards."""
    rng = random.Random(3)
    data = build_log(rng, 0, 200, layout="mixed")
    path = tmp_path / "segment"
    path.write_bytes(bytes(data) + bytes(8192))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
    (pos, walked, _), _ = both_walks(mm, 0, len(mm), 0, check_crc=True, apply_from=0)
    assert (pos, walked) == (len(data), 200)
    mm.close()  # raises BufferError if a view of the map were still alive


@pytest.mark.parametrize("damaged", ["body", "topic_nul", "topic_not_utf8", "props_end"])
def test_damage_the_body_crc_does_not_cover_is_still_caught(damaged: str) -> None:
    # IPv4/IPv4 V1: the body starts at 88, the topic length byte follows it, then the topic.
    first = encode_record(topic="orders", queue_id=0, body=b"x" * 50, properties=b"K\x01v\x02")
    second = encode_record(topic="orders", queue_id=1, body=b"y", physical_offset=len(first))
    data = bytearray(first + second)
    topic_at = 88 + 50 + 1
    if damaged == "body":
        data[90] ^= 0x10
    elif damaged == "topic_nul":
        data[topic_at] = 0
    elif damaged == "topic_not_utf8":
        data[topic_at] = 0xFF
    else:
        data[len(first) - 1] = 0x01
    with mock.patch.object(record_walk, "SMALL_RUN_BYTES", 0):
        (pos, walked, stop), _ = both_walks(
            bytes(data), 0, len(data), 0, check_crc=True, apply_from=0
        )
    assert (pos, walked) == (0, 0)
    assert isinstance(stop, Bad) and not stop.no_record


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), kinds=DAMAGE)
def test_records_the_fast_checks_doubt_are_decided_by_read_record(
    seed: int, kinds: list[str]
) -> None:
    """The safety net: with every fast check made to doubt, each record goes to read_record
    one by one, and the walk still gives the reference verdict."""
    rng = random.Random(seed)
    data = bytes(damage(rng, build_log(rng, 0, 25, layout=rng.choice(["mixed", "uniform"])), kinds))
    checks = record_walk._checks

    def doubt_all(*args: object, **kwargs: object) -> object:
        good, topic_ids = checks(*args, **kwargs)  # type: ignore[arg-type]
        return good & False, topic_ids

    with (
        mock.patch.object(record_walk, "_checks", doubt_all),
        mock.patch.object(record_walk, "SMALL_RUN_BYTES", 0),
        mock.patch.object(record_walk, "STRIDE_RUN_MIN", rng.choice([2, 16])),
        mock.patch.object(record_walk, "WINDOW_BYTES", rng.choice([100, 1000, 1 << 20])),
    ):
        both_walks(data, 0, len(data), 0, check_crc=True, apply_from=rng.randrange(len(data) + 1))
