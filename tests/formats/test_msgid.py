"""Offset msg ids and unique ids, as RocketMQ builds them."""

from __future__ import annotations

import datetime as dt
import os
import re
import struct
import threading

import pytest

from mqstore.errors import InvalidArgument
from mqstore.formats.msgid import (
    UniqIdGenerator,
    decode_offset_msg_id,
    offset_msg_id,
)
from mqstore.formats.record import pack_host

HEX_UPPER = re.compile(r"^[0-9A-F]+$")


def utc_ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    when = dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


# -- offset msg id ------------------------------------------------------------------------------


def test_offset_msg_id_for_ipv4_is_32_uppercase_hex_of_host_port_offset() -> None:
    msg_id = offset_msg_id(pack_host("10.0.0.1", 10911), 1_073_741_824 + 158)
    # 0A000001 | 00002A9F (10911) | 000000004000009E
    assert msg_id == "0A000001" + "00002A9F" + "000000004000009E"
    assert len(msg_id) == 32 and HEX_UPPER.match(msg_id)


def test_offset_msg_id_for_ipv6_is_56_uppercase_hex() -> None:
    msg_id = offset_msg_id(pack_host("fe80::1", 10911), 255)
    assert msg_id == "FE80" + "0" * 27 + "1" + "00002A9F" + "00000000000000FF"
    assert len(msg_id) == 56 and HEX_UPPER.match(msg_id)


@pytest.mark.parametrize("ip", ["10.0.0.1", "255.255.255.255", "::1", "2001:db8::ff"])
@pytest.mark.parametrize("offset", [0, 158, 2**40 + 3, 2**63 - 1])
def test_decode_offset_msg_id_round_trips(ip: str, offset: int) -> None:
    host = pack_host(ip, 10911)
    assert decode_offset_msg_id(offset_msg_id(host, offset)) == (host, offset)


def test_decode_offset_msg_id_accepts_lowercase_hex() -> None:
    host = pack_host("10.0.0.1", 10911)
    assert decode_offset_msg_id(offset_msg_id(host, 42).lower()) == (host, 42)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "0A000001",
        "0A00000100002A9F000000000000009",  # 31 chars
        "0A00000100002A9F00000000000000900",  # 33 chars
        "ZZ00000100002A9F000000000000009E",  # not hex
        "0A00000100002A9F800000000000009E",  # negative offset
        "0A00000100002A9F00000000000009E",  # odd length: 31
    ],
)
def test_decode_offset_msg_id_refuses_malformed_ids(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        decode_offset_msg_id(bad)


def test_decode_offset_msg_id_refuses_whitespace_inside_an_id() -> None:
    with pytest.raises(InvalidArgument):
        decode_offset_msg_id("0A0000012A9F00 00000000000004D2 ")


# -- unique ids ---------------------------------------------------------------------------------


def test_uniq_id_is_32_uppercase_hex_with_a_fixed_20_char_prefix() -> None:
    now = utc_ms(2024, 3, 10, 12, 0, 0)
    gen = UniqIdGenerator(b"\xc0\xa8\x00\x0a", clock_ms=lambda: now, instance_hash=0x01020304)
    ids = [gen.next_id() for _ in range(5)]
    for uid in ids:
        assert len(uid) == 32 and HEX_UPPER.match(uid)
    expected_prefix = (
        (b"\xc0\xa8\x00\x0a" + struct.pack(">h", os.getpid() & 0x7FFF) + bytes.fromhex("01020304"))
        .hex()
        .upper()
    )
    assert len(expected_prefix) == 20
    assert {uid[:20] for uid in ids} == {expected_prefix}


def test_two_generators_differ_in_their_prefix() -> None:
    a = UniqIdGenerator(clock_ms=lambda: 0)
    b = UniqIdGenerator(clock_ms=lambda: 0)
    # A random 31-bit instance hash each: equal prefixes would be a 1 in 2^31 coincidence.
    assert a.next_id()[:20] != b.next_id()[:20]


def test_uniq_id_counter_increments_by_one_per_id() -> None:
    now = utc_ms(2024, 3, 10)
    gen = UniqIdGenerator(clock_ms=lambda: now)
    counters = [int(gen.next_id()[-4:], 16) for _ in range(10)]
    assert counters == list(range(counters[0], counters[0] + 10))


def test_uniq_id_counter_wraps_at_16_bits() -> None:
    now = utc_ms(2024, 3, 10)
    gen = UniqIdGenerator(clock_ms=lambda: now)
    counters = [int(gen.next_id()[-4:], 16) for _ in range(65_537)]
    assert counters[65_535] == 0xFFFF and counters[65_536] == 0


def test_uniq_ids_are_distinct_across_threads() -> None:
    now = utc_ms(2024, 3, 10)
    gen = UniqIdGenerator(clock_ms=lambda: now)
    out: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [gen.next_id() for _ in range(2000)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 8000


def time_field(uid: str) -> int:
    return int(uid[20:28], 16)


def test_uniq_id_time_field_is_ms_since_the_utc_month_start() -> None:
    now = utc_ms(2024, 3, 10, 1, 2, 3) + 456
    gen = UniqIdGenerator(clock_ms=lambda: now)
    assert time_field(gen.next_id()) == now - utc_ms(2024, 3, 1)


def test_uniq_id_time_field_restarts_at_a_month_roll_over() -> None:
    clock = {"now": utc_ms(2024, 1, 20, 8, 0, 0)}
    gen = UniqIdGenerator(clock_ms=lambda: clock["now"])
    january = gen.next_id()
    assert time_field(january) == clock["now"] - utc_ms(2024, 1, 1)
    clock["now"] = utc_ms(2024, 2, 3, 9, 30, 0)
    february = gen.next_id()
    assert time_field(february) == clock["now"] - utc_ms(2024, 2, 1)
    clock["now"] = utc_ms(2025, 1, 2)  # across a year end too
    assert time_field(gen.next_id()) == utc_ms(2025, 1, 2) - utc_ms(2025, 1, 1)


def test_a_backwards_clock_step_inside_the_month_moves_the_time_field_back() -> None:
    clock = {"now": utc_ms(2024, 3, 10, 12, 0, 1)}
    gen = UniqIdGenerator(clock_ms=lambda: clock["now"])
    first = gen.next_id()
    clock["now"] -= 500  # NTP stepped back: ids stay unique through the counter
    second = gen.next_id()
    assert time_field(second) == time_field(first) - 500
    assert second != first


@pytest.mark.parametrize("day", [25, 28, 31])
def test_uniq_ids_can_be_made_late_in_the_month(day: int) -> None:
    made = utc_ms(2024, 1, day, 23, 59, 59)
    uid = UniqIdGenerator(clock_ms=lambda: made).next_id()
    assert len(uid) == 32
    # RocketMQ writes (int)(now - monthStart), and reads the 4 bytes back as unsigned.
    assert time_field(uid) == made - utc_ms(2024, 1, 1)


def test_generator_refuses_an_ip_that_is_not_4_or_16_bytes() -> None:
    with pytest.raises(InvalidArgument):
        UniqIdGenerator(b"\x01\x02\x03")
