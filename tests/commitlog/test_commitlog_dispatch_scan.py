"""The fast dispatch scan (dispatch_scan.py) gives exactly the frames of the reference path:
CommitLog.scan + entry_from_record + encode_dispatch, over every kind of record the log can
hold, from every record boundary, with every batch bound, around blanks and corruption."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from commitlog_testlib import flip_bit, open_log, write_at

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from commitlog_svc.dispatch_scan import scan_dispatch
from mqstore.dispatch import entry_from_record
from mqstore.errors import InvalidArgument
from mqstore.formats import sysflag
from mqstore.formats._core import property_columns
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import (
    decode_properties,
    encode_properties,
    property_value,
)
from mqstore.formats.record import RECORD_CRC_BYTES, pack_host
from mqstore.rpc.dispatch_codec import encode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog.message_in import MessageIn, as_batches

V6_BORN = pack_host("2001:db8::1", 4242)
LONG_TOPIC = "%RETRY%" + "g" * 150  # over 127 characters: a V2 record


def reference(
    log: CommitLog, offset: int, max_records: int, max_bytes: int, include_keys: bool
) -> pb.DispatchBatch:
    batch = log.scan(offset, max_records=max_records, max_bytes=max_bytes, check_crc=True)
    return encode_dispatch(
        [entry_from_record(r) for r in batch.records],
        start_offset=offset,
        next_offset=batch.next_offset,
        include_keys=include_keys,
        corrupt=[(c.start_offset, c.end_offset) for c in batch.corrupt],
    )


def varied_messages(rng: random.Random, count: int) -> list[MessageIn]:
    props_choices = [
        b"",
        encode_properties({"TAGS": "tagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}),
        encode_properties({"KEYS": "日本 key"}),
        b"TAGS\x01first\x02TAGS\x01second\x02",  # the last one wins
        b"TAGS\x01kept\x02TAGS\x01\x02",  # an empty value is skipped: "kept" wins
        b"xTAGS\x01no\x02KEYS\x01\x01odd\x02",  # not a TAGS segment; KEYS = "\x01odd"
        b"\xff\xfeTAGS\x01bad-utf8\x02",
        b"A\x02TAGS\x01t\x02",
    ]
    out = []
    for i in range(count):
        topic = rng.choice(["alpha", "beta", LONG_TOPIC])
        flag = rng.choice([0, 0, sysflag.TRANSACTION_PREPARED_TYPE, sysflag.TRANSACTION_COMMIT_TYPE,
                           sysflag.TRANSACTION_ROLLBACK_TYPE])  # fmt: skip
        out.append(
            MessageIn(
                topic=topic,
                queue_id=rng.randrange(4),
                body=bytes(rng.randrange(1, 256) for _ in range(rng.choice([0, 1, 30, 200]))),
                properties=rng.choice(props_choices),
                sys_flag=flag,
                born_host=rng.choice([V6_BORN, pack_host("10.0.0.1", i)]),
                born_timestamp_ms=i,
            )
        )
    return out


def fill(log: CommitLog, seed: int, batches: int = 12) -> None:
    rng = random.Random(seed)
    for _ in range(batches):
        result = log.append_batch(as_batches(varied_messages(rng, rng.randint(1, 6))))
        assert result.ok, result.reasons


def boundaries(log: CommitLog) -> list[int]:
    out = []
    offset = log.min_offset
    while offset < log.confirm_offset:
        batch = log.scan(offset, max_records=1)
        if batch.next_offset <= offset:
            break
        out.append(offset)
        offset = batch.next_offset
    return out


def assert_same_everywhere(log: CommitLog, starts: list[int]) -> None:
    for offset in starts:
        for max_records, max_bytes in ((1, 1 << 20), (3, 1 << 20), (1024, 600), (1024, 1 << 20)):
            for keys in (False, True):
                want = reference(log, offset, max_records, max_bytes, keys)
                got = scan_dispatch(
                    log, offset, max_records=max_records, max_bytes=max_bytes, include_keys=keys
                )
                sent = pb.SubscribeResponse.FromString(got.wire(keys))
                assert sent.batch == want, (offset, max_records, max_bytes, keys)
                assert got.next_offset == want.next_offset
                if keys:  # the frame cache's: one scan with keys, sent without them too
                    bare = pb.SubscribeResponse.FromString(got.wire(False))
                    assert bare.batch == reference(log, offset, max_records, max_bytes, False)


@pytest.mark.parametrize("store_v6", [False, True], ids=["store-v4", "store-v6"])
@pytest.mark.parametrize("seed", range(3))
def test_the_fast_scan_equals_the_reference_over_every_kind_of_record(
    tmp_path: Path, seed: int, store_v6: bool
) -> None:
    overrides: dict[str, object] = {"store_ip": "::1"} if store_v6 else {}
    log = open_log(tmp_path, **overrides)  # 4 KiB segments: several end-of-file blanks
    fill(log, seed)
    starts = boundaries(log)
    assert len(starts) > 20 and log.max_offset > 2 * log.config.file_bytes
    assert_same_everywhere(log, starts)
    log.close()


def _has_body(log: CommitLog, offset: int) -> bool:
    """A record with a body starts at `offset` (boundaries() also holds end-of-file blanks)."""
    try:
        return bool(log.read_record(offset).body)
    except InvalidArgument:
        return False


@pytest.mark.parametrize(
    "damage",
    [
        "body-bit",
        "magic",
        "size",
        "topic-nul",
        "tail-zeroed",
        "born-timestamp",
        "queue-id",
        "topic-letter",
        "property",
        "crc-property",
    ],
    ids=str,
)
def test_the_fast_scan_reports_corruption_exactly_as_the_reference(
    tmp_path: Path, damage: str
) -> None:
    """A damaged record is never dispatched: reported as a corrupt range by the fast scan as
    by the reference, whatever field the damage hit (the whole-record CRC covers those the
    body CRC does not: the born time, the queue id, the topic's and properties' bytes)."""
    log = open_log(tmp_path, checkpoint_interval_ms=600_000)
    fill(log, 7, batches=8)
    starts = boundaries(log)
    config: CommitLogConfig = log.config
    victim = next(o for o in starts[len(starts) // 2 :] if _has_body(log, o))
    record = log.read_record(victim)
    body_at = (
        88
        + (12 if record.sys_flag & sysflag.BORNHOST_V6 else 0)
        + (12 if record.sys_flag & sysflag.STOREHOST_V6 else 0)
    )
    if damage == "body-bit":
        flip_bit(config, victim + body_at, 2)
    elif damage == "magic":
        write_at(config, victim + 4, b"\x00\x00\x00\x01")
    elif damage == "size":
        write_at(config, victim, (record.total_size + 7).to_bytes(4, "big"))
    elif damage in ("topic-nul", "topic-letter", "property", "crc-property"):
        assert record.record_crc >= 0 and record.properties
        props_at = victim + record.total_size - RECORD_CRC_BYTES - len(record.properties)
        topic_at = props_at - 2 - len(record.topic.encode())
        if damage == "topic-nul":
            write_at(config, topic_at, b"\x00")
        elif damage == "topic-letter":
            flip_bit(config, topic_at, 0)
        elif damage == "property":
            flip_bit(config, props_at, 1)
        else:
            flip_bit(config, victim + record.total_size - 5, 0)  # a digit of the CRC
    elif damage == "born-timestamp":
        flip_bit(config, victim + 47, 0)
    elif damage == "queue-id":
        flip_bit(config, victim + 15, 1)
    else:
        last = starts[-1]
        write_at(config, last + 20, bytes(30))
    whole = reference(log, starts[0], 1 << 20, 1 << 30, True)
    assert whole.corrupt_starts, "the damage must show as a corrupt range"
    assert_same_everywhere(log, starts)
    log.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"TAGS\x01a\x02",
        b"TAGS\x01a\x02TAGS\x01b\x02",
        b"TAGS\x01a\x02TAGS\x01\x02",
        b"TAGS\x01\x02",
        b"TAGS\x01",
        b"TAGS\x01x",
        b"KTAGS\x01a\x02",
        b"\x02TAGS\x01a",
        b"TAGS\x01a\x01b\x02",
        b"T\x01\x02TAGS\x01z",
        b"\x01TAGS\x01q\x02",
    ],
)
def test_the_property_lookup_follows_the_parser(raw: bytes) -> None:
    parsed = decode_properties(raw)
    for name in ("TAGS", "KEYS"):
        assert property_value(raw, name) == parsed.get(name, "")
    tags_codes, keys, _ = property_columns([raw])  # what the frames carry
    assert tags_codes == [tags_code(parsed.get("TAGS"))] and keys == [parsed.get("KEYS", "")]
