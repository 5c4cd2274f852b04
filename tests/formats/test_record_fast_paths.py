"""record.scan_run (the recovery walk's reference) accepts exactly what record.read_record
accepts. (The append path's encoder is pinned in test_record_encode.py.)
"""

from __future__ import annotations

import random
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import sysflag
from mqstore.formats.record import (
    Bad,
    Blank,
    Record,
    encode_blank,
    encode_record,
    pack_host,
    read_record,
    scan_run,
)

topics = st.from_regex(r"[A-Za-z0-9_%|-]{1,20}", fullmatch=True)
hosts = st.sampled_from([pack_host("10.0.0.7", 9876), pack_host("2001:db8::1", 10911)])
tx_flags = st.sampled_from(
    [
        sysflag.TRANSACTION_NOT_TYPE,
        sysflag.TRANSACTION_PREPARED_TYPE,
        sysflag.TRANSACTION_COMMIT_TYPE,
        sysflag.TRANSACTION_ROLLBACK_TYPE,
    ]
)


def _log_bytes(rng: random.Random, count: int) -> bytes:
    out = b""
    for i in range(count):
        out += encode_record(
            # The long retry topic is written with the V2 magic (2-byte topic length).
            topic=rng.choice(["A", "Bb", "%RETRY%" + "a" * 125]),
            queue_id=rng.randrange(4),
            body=rng.randbytes(rng.randrange(0, 200)),
            properties=b"KEYS\x01k\x02" if i % 2 else b"",
            physical_offset=len(out),
            queue_offset=i,
            born_host=pack_host("::1", 5) if i % 3 == 0 else pack_host("1.2.3.4", 5),
        )
    return out


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), flips=st.lists(st.integers(0, 10_000), max_size=3))
def test_scan_run_accepts_exactly_what_read_record_accepts(seed: int, flips: list[int]) -> None:
    rng = random.Random(seed)
    data = bytearray(_log_bytes(rng, 8) + encode_blank(64) + bytes(56))
    for flip in flips:
        data[flip % len(data)] ^= 1 << (flip % 8)
    end = len(data)
    pos, walked, stop = scan_run(bytes(data), 0, end, 0, check_crc=True)
    # The reference walk.
    ref_pos, ref_walked = 0, 0
    while ref_pos < end:
        found = read_record(bytes(data), ref_pos, end, check_crc=True, expected_offset=ref_pos)
        if not isinstance(found, Record):
            break
        ref_pos += found.total_size
        ref_walked += 1
    assert (pos, walked) == (ref_pos, ref_walked)
    if stop is not None:
        assert isinstance(stop, Bad | Blank)


def test_scan_run_rebuilds_queue_offsets_from_apply_from() -> None:
    data = b""
    for i in range(6):
        data += encode_record(
            topic="T", queue_id=i % 2, body=b"x", queue_offset=i // 2, physical_offset=len(data)
        )
    first_size = struct.unpack_from(">i", data, 0)[0]
    table: dict[str, dict[int, int]] = {"T": {0: 1}}
    pos, walked, stop = scan_run(data, 0, len(data), 0, queue_table=table, apply_from=first_size)
    assert (pos, walked, stop) == (len(data), 6, None)
    assert table == {"T": {0: 3, 1: 3}}
