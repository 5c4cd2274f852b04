"""record_columns.scan_run_fast (the compiled recovery walk, formats/_core.pyx) gives
record.scan_run's verdicts.

Same stopping position, same count, same Blank or Bad (reason included), same queue-table
updates, over random logs with every record shape (V1 and V2 magic, IPv4 and IPv6 born and
store hosts, empty bodies, transaction types, records with and without the whole-record CRC)
and every kind of damage recovery meets: flipped bits, zeroed ranges, torn tails, trailing
garbage, blanks of the right and wrong size, stale records at the wrong place, implausible
sizes, damaged CRC properties, topics made invalid (NUL, bytes that are no UTF-8: a lone
continuation byte, a surrogate, a code point past U+10FFFF) or made another valid topic, and
records stored inside a body at their own position.
"""

from __future__ import annotations

import mmap
import random
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import _core, record, sysflag
from mqstore.formats.properties import RECORD_CRC, encode_properties
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
from mqstore.formats.record_columns import scan_run_fast

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
# What a damaged topic byte may become: a NUL, bytes that are no UTF-8 (a lone continuation
# byte, 0xFF, a surrogate, a code point past U+10FFFF), or valid UTF-8 naming another topic.
TOPIC_DAMAGE = [b"\x00", b"\x80", b"\xff", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3\xbc", b"Z"]


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
        elif kind == "moved":
            # A whole record copied over a later one (same bytes, CRC fine, offset field wrong).
            starts = _boundaries(data)
            if len(starts) >= 2:
                i, j = sorted(rng.sample(range(len(starts)), 2))
                size = _I32.unpack_from(data, starts[i])[0]
                chunk = data[starts[i] : starts[i] + size]
                data[starts[j] : starts[j] + len(chunk)] = chunk
        elif kind == "topic":
            # Bytes of some record's topic (or of a body that happens to spell one).
            found = [m.start() for m in re.finditer(rb"orders|Bb|%RETRY%|%DLQ%", bytes(data))]
            if found:
                at = rng.choice(found) + rng.randrange(2)
                new = rng.choice(TOPIC_DAMAGE)
                data[at : at + len(new)] = new[: len(data) - at]
    return data


def _boundaries(data: bytearray) -> list[int]:
    """Where the records of `data` start, following TOTALSIZE from 0 while it is plausible."""
    starts, pos = [], 0
    while len(data) - pos >= 91:
        size = _I32.unpack_from(data, pos)[0]
        if not 91 <= size <= len(data) - pos:
            break
        starts.append(pos)
        pos += size
    return starts


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
    st.sampled_from(
        ["flip", "zero", "tear", "garbage", "stale", "size", "crc_property", "topic", "moved"]
    ),
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
)
def test_fast_walk_gives_the_reference_verdict(
    seed: int,
    count: int,
    layout: str,
    blank: str,
    kinds: list[str],
    base: int,
    check_crc: bool,
) -> None:
    rng = random.Random(seed)
    data = build_log(rng, base, count, layout=layout)
    if blank != "none":
        rest = rng.randrange(8, 200)
        data += encode_blank(rest if blank == "right" else rest + 5) + bytes(rest - 8)
    data = damage(rng, data, kinds)
    end = len(data)
    apply_from = base + rng.randrange(end + 1)
    both_walks(bytes(data), 0, end, base, check_crc=check_crc, apply_from=apply_from)
    # From a later record boundary (or anywhere), and on a mutable buffer as SimDisk has.
    pos = rng.randrange(end + 1)
    both_walks(data, pos, end, base, check_crc=check_crc, apply_from=apply_from)
    # And over part of the buffer only: `end` anywhere, inside a record included.
    cut = rng.randrange(end + 1)
    both_walks(memoryview(data), 0, cut, base, check_crc=check_crc, apply_from=apply_from)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), cut=st.integers(0, 5_000))
def test_every_torn_tail_stops_both_walks_at_the_same_byte(seed: int, cut: int) -> None:
    rng = random.Random(seed)
    data = build_log(rng, 0, 30, layout=rng.choice(["same_body", "uniform"]))
    kept = cut % (len(data) + 1)
    torn = bytes(data[:kept]) + bytes(rng.randrange(0, 64))
    (pos, _, stop), _ = both_walks(torn, 0, len(torn), 0, check_crc=True, apply_from=0)
    # What is accepted is what was written (a tear inside a record's trailing zero bytes, an
    # empty properties length, leaves the record whole, so pos may pass the cut by that much).
    assert torn[:pos] == data[:pos]
    assert stop is None or isinstance(stop, Bad | Blank)


def test_a_record_planted_in_a_body_at_its_own_position_is_skipped_not_taken() -> None:
    # The outer record is IPv4/IPv4 V1, so its body starts 88 bytes in; the inner record sits
    # 16 bytes into the body with the offset field of that exact position: it frames as a
    # record there, but is no record boundary.
    inner = encode_record(topic="A", queue_id=1, body=b"inner", physical_offset=88 + 16)
    body = bytes(16) + inner + bytes(40)
    log = encode_record(topic="T", queue_id=0, body=body, physical_offset=0)
    log += encode_record(topic="T", queue_id=0, body=b"next", physical_offset=len(log))
    (pos, walked, stop), table = both_walks(log, 0, len(log), 0, check_crc=True, apply_from=0)
    assert (pos, walked, stop) == (len(log), 2, None)
    assert "A" not in table or table["A"] == {0: 3}


def test_long_uniform_log_walks_whole_to_its_blank() -> None:
    rng = random.Random(7)
    data = build_log(rng, 4096, 3000, layout="uniform") + encode_blank(100) + bytes(92)
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
    (pos, walked, stop), _ = both_walks(bytes(data), 0, len(data), 0, check_crc=True, apply_from=0)
    assert (pos, walked) == (0, 0)
    assert isinstance(stop, Bad) and not stop.no_record


@pytest.mark.parametrize("body_len", [1, 2, 17])
@pytest.mark.parametrize("bit", [0, 7])
def test_a_flipped_bit_in_a_short_body_fails_the_body_crc(body_len: int, bit: int) -> None:
    """Records without the whole-record CRC are checked by the body CRC down to one byte."""
    log = encode_record(topic="T", queue_id=0, body=b"b" * body_len, record_crc=False)
    data = bytearray(log)
    data[88] ^= 1 << bit
    (pos, walked, stop), _ = both_walks(bytes(data), 0, len(data), 0, check_crc=True, apply_from=0)
    assert (pos, walked) == (0, 0)
    assert isinstance(stop, Bad) and stop.reason == record.BODY_CRC_MISMATCH


def test_a_log_walked_at_the_wrong_offset_stops_at_its_first_record() -> None:
    """Records at another offset than their own (a segment renamed or copied) are refused."""
    log = encode_record(topic="T", queue_id=0, body=b"x", physical_offset=4096)
    (pos, walked, stop), _ = both_walks(log, 0, len(log), 0, check_crc=True, apply_from=0)
    assert (pos, walked) == (0, 0) and isinstance(stop, Bad) and stop.record is not None
    (pos, walked, stop), _ = both_walks(log, 0, len(log), 4096, check_crc=True, apply_from=0)
    assert (pos, walked, stop) == (len(log), 1, None)


def test_queue_offsets_run_to_the_top_of_a_java_long() -> None:
    """A queue offset of 2**63 - 1 raises the next one past a signed 64-bit integer: the table
    holds Python ints, as scan_run's does."""
    top = (1 << 63) - 1
    log = encode_record(topic="T", queue_id=2, body=b"a", queue_offset=top)
    log += encode_record(topic="T", queue_id=2, body=b"b", queue_offset=5, physical_offset=len(log))
    (_, walked, _), table = both_walks(log, 0, len(log), 0, check_crc=True, apply_from=0)
    assert walked == 2 and table["T"] == {2: 1 << 63}


def test_a_valid_topic_that_is_not_ascii_is_taken() -> None:
    """A topic is any non-empty UTF-8 without NUL to read_record (the pattern is the producer's
    rule): a record without the whole-record CRC whose topic bytes changed to other valid
    UTF-8 is read under that topic, by both walks."""
    first = encode_record(topic="orders", queue_id=0, body=b"x", record_crc=False)
    data = bytearray(first)
    at = bytes(data).index(b"orders")
    data[at : at + 2] = "ü".encode()
    (pos, walked, stop), table = both_walks(
        bytes(data), 0, len(data), 0, check_crc=True, apply_from=0
    )
    assert (pos, walked, stop) == (len(data), 1, None) and "üders" in table


def test_a_walk_past_the_buffer_is_refused() -> None:
    log = encode_record(topic="T", queue_id=0, body=b"x")
    with pytest.raises(ValueError, match="over a buffer of"):
        scan_run_fast(log, 0, len(log) + 1, 0)
    with pytest.raises(ValueError, match="over a buffer of"):
        scan_run_fast(log, -1, len(log), 0)


def test_the_compiled_header_is_record_pys() -> None:
    """The compiled core's one record-header definition names record.py's positions and
    constants."""
    assert _core.QUEUE_ID_POS == record.QUEUE_ID_POS
    assert _core.QUEUE_OFFSET_POS == record.QUEUE_OFFSET_POS
    assert _core.PHYSICAL_OFFSET_POS == record.PHYSICAL_OFFSET_POS
    assert _core.SYSFLAG_POS == record.SYSFLAG_POS
    assert _core.BORN_HOST_POS == record.BORN_HOST_POS
    assert record.HEADER_V4_V4.size == _core.HEADER_V4_V4_SIZE
    assert record.HEADER_V4_V4.size + 3 == _core.RECORD_BYTES_MIN
    assert (_core.MAGIC_V1, _core.MAGIC_V2) == (record.MAGIC_V1, record.MAGIC_V2)
    assert _core.PROPERTIES_END_BYTE == record.PROPERTIES_END_BYTE
    assert _core.RECORD_CRC_BYTES == record.RECORD_CRC_BYTES
    assert _core.RECORD_CRC_HEAD == record.RECORD_CRC_HEAD == RECORD_CRC.encode() + b"\x01"
    assert (_core.NO_RECORD_CRC, _core.DAMAGED_RECORD_CRC) == (
        record.NO_RECORD_CRC,
        record.DAMAGED_RECORD_CRC,
    )


def test_thousands_of_queues_update_the_table_as_the_reference_does() -> None:
    """More queues than the compiled walk gathers at once (it writes some out mid-walk)."""
    rng = random.Random(11)
    out = bytearray()
    for i in range(6000):
        out += encode_record(
            topic=rng.choice(["A", "Bb", "orders"]),
            queue_id=rng.randrange(3000),
            body=b"m",
            queue_offset=rng.choice([i, rng.randrange(1 << 40), 0]),
            physical_offset=len(out),
            sys_flag=rng.choice(TX),
        )
    (_, walked, stop), table = both_walks(out, 0, len(out), 0, check_crc=True, apply_from=0)
    assert walked == 6000 and stop is None
    assert sum(len(queues) for queues in table.values()) > 2000
