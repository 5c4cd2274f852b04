"""Message and batch limits (rocketmq-store.md §1.6; DefaultMessageStoreTest.testPutLongMessage,
testPutMessage_whenMessagePropertyIsTooLong, testPutMsgExceedsMaxLength).

Every refusal consumes nothing: the commit-log end and the queue's next offset stay where they
were, and the next good append lands exactly there.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from commitlog_testlib import TOPIC, append_each, message, open_log, placed_at, stored_from

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.messages import PutStatus
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import MAGIC_V1, MAGIC_V2
from mqstore.limits import MessageLimits
from tests.commitlog.message_in import MessageIn, as_batches

BIG_FILE = 8 << 20  # room for a 4 MiB body with a 127-byte topic and 32767 bytes of properties
BODY_MAX = 4 * 1024 * 1024


def _props_of(nbytes: int) -> bytes:
    """Encoded properties of exactly `nbytes` bytes: K 0x01 value 0x02."""
    raw = encode_properties({"K": "v" * (nbytes - 3)})
    assert len(raw) == nbytes
    return raw


def _assert_refusal_consumes_nothing(
    log: CommitLog, message_in: MessageIn, status: PutStatus
) -> None:
    assert log.append_batch(as_batches([MessageIn(TOPIC, 0, b"before")])).ok
    end = log.max_offset
    table = log.queue_offsets()
    result = log.append_batch(as_batches([message_in]))
    assert result.statuses == [status], result.reasons
    assert result.offsets == [-1] and result.queue_offsets == [-1]
    assert result.reasons[0]
    assert log.max_offset == end
    assert log.queue_offsets() == table
    # the next good message takes the place the refused one did not
    good = MessageIn(TOPIC, 0, b"after")
    after = log.append_batch(as_batches([good]))
    assert after.ok
    assert after.offsets == [placed_at(end, after.sizes[0], log.config.file_bytes)]
    assert after.queue_offsets == [table.get((TOPIC, 0), 0)]


def _taken(log: CommitLog) -> dict[tuple[str, int], int]:
    """The queues that have given out offsets (a next offset of 0 is no queue yet)."""
    return {key: nxt for key, nxt in log.queue_offsets().items() if nxt}


def test_body_at_the_limit_is_stored_and_one_byte_more_is_message_illegal(tmp_path: Path) -> None:
    log = open_log(tmp_path, file_bytes=BIG_FILE)
    assert log.config.limits.body_bytes_max == BODY_MAX
    [stored] = append_each(log, [MessageIn(TOPIC, 0, b"b" * BODY_MAX)])
    assert log.read_record(stored.offset).body == b"b" * BODY_MAX
    _assert_refusal_consumes_nothing(
        log, MessageIn(TOPIC, 0, b"b" * (BODY_MAX + 1)), PutStatus.MESSAGE_ILLEGAL
    )
    log.close()


@pytest.mark.parametrize(
    ("record_crc", "most"), [(False, 32_767), (True, 32_747)], ids=["body-crc-only", "record-crc"]
)
def test_properties_of_32767_bytes_are_stored_and_32768_exceed(
    tmp_path: Path, record_crc: bool, most: int
) -> None:
    """The int16 length holds 32,767 bytes of properties; the 20 of the whole-record CRC
    property count against them (RocketMQ: the limit applies after its CRC reserve)."""
    log = open_log(tmp_path, file_bytes=BIG_FILE, record_crc=record_crc)
    [stored] = append_each(log, [MessageIn(TOPIC, 1, b"body", _props_of(most))])
    assert log.read_record(stored.offset).properties == _props_of(most)
    _assert_refusal_consumes_nothing(
        log, MessageIn(TOPIC, 1, b"body", _props_of(most + 1)), PutStatus.PROPERTIES_SIZE_EXCEEDED
    )
    log.close()


def test_topic_of_127_bytes_is_stored_with_v1_magic_and_128_is_message_illegal(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    [stored] = append_each(log, [MessageIn("t" * 127, 0, b"body")])
    record = log.read_record(stored.offset)
    assert record.topic == "t" * 127 and record.magic == MAGIC_V1
    _assert_refusal_consumes_nothing(
        log, MessageIn("t" * 128, 0, b"body"), PutStatus.MESSAGE_ILLEGAL
    )
    log.close()


def test_retry_topic_may_take_255_bytes_written_with_v2_magic_and_256_is_illegal(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path)
    topic = "%RETRY%" + "g" * 248
    [stored] = append_each(log, [MessageIn(topic, 0, b"body")])
    record = log.read_record(stored.offset)
    assert record.topic == topic and record.magic == MAGIC_V2  # more than 127 characters
    assert stored.size == 91 + 4 + 255 + 1 + 20  # V2: a 2-byte topic length; the record CRC
    _assert_refusal_consumes_nothing(
        log, MessageIn(topic + "g", 0, b"body"), PutStatus.MESSAGE_ILLEGAL
    )
    log.close()


@pytest.mark.parametrize(
    ("record_crc", "props"), [(False, 32_767), (True, 32_747)], ids=["body-crc-only", "record-crc"]
)
def test_rocketmq_put_long_message_max_body_topic_and_properties_together(
    tmp_path: Path, record_crc: bool, props: int
) -> None:
    log = open_log(tmp_path, file_bytes=BIG_FILE, record_crc=record_crc)
    big = MessageIn("t" * 127, 3, b"x" * BODY_MAX, _props_of(props))
    [stored] = append_each(log, [big])
    assert stored.size == 91 + BODY_MAX + 127 + 32_767
    record = log.read_record(stored.offset)
    assert (record.topic, record.queue_id, record.body, record.properties) == (
        big.topic,
        3,
        big.body,
        big.properties,
    )
    assert log.queue_offset("t" * 127, 3) == 1
    log.close()


@pytest.mark.parametrize(
    ("topic", "queue_id"),
    [
        ("", 0),
        ("a/b", 0),
        ("..", 0),
        ("with space", 0),
        ("t" * 32_767, 0),  # RocketMQ's testPutLongMessage: a 32767-character topic
        (TOPIC, -1),
        (TOPIC, 65_536),
    ],
    ids=["empty", "slash", "dots", "space", "32767-chars", "queue--1", "queue-65536"],
)
def test_illegal_topic_or_queue_id_is_message_illegal_and_consumes_nothing(
    tmp_path: Path, topic: str, queue_id: int
) -> None:
    log = open_log(tmp_path)
    _assert_refusal_consumes_nothing(
        log, MessageIn(topic, queue_id, b"body"), PutStatus.MESSAGE_ILLEGAL
    )
    log.close()


def test_batch_mixing_refused_and_good_messages_stores_the_good_ones_consecutively(
    tmp_path: Path,
) -> None:
    limits = MessageLimits(body_bytes_max=1_000, properties_bytes_max=300)
    log = open_log(tmp_path, limits=limits)
    append_each(log, [MessageIn(TOPIC, 2, b"first")])
    end = log.max_offset
    batch = [
        MessageIn(TOPIC, 2, b"good 0"),
        MessageIn(TOPIC, 2, b"b" * 1_001),
        MessageIn(TOPIC, 2, b"good 1"),
        MessageIn(TOPIC, 2, b"p", _props_of(301)),
        MessageIn("bad topic", 2, b"b"),
        MessageIn(TOPIC, 70_000, b"b"),
        MessageIn(TOPIC, 2, b"good 2"),
    ]
    result = log.append_batch(as_batches(batch))
    ok, illegal, props = (
        PutStatus.PUT_OK,
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
    )
    assert result.statuses == [ok, illegal, ok, props, illegal, illegal, ok]
    good = stored_from(result, batch)
    assert [s.message.body for s in good] == [b"good 0", b"good 1", b"good 2"]
    assert [s.queue_offset for s in good] == [1, 2, 3]
    assert good[0].offset == end
    for a, b in itertools.pairwise(good):
        assert b.offset == a.end  # consecutive in the log: refused ones left no gap
    assert log.max_offset == good[-1].end
    assert log.queue_offset(TOPIC, 2) == 4
    for s in good:
        assert log.read_record(s.offset).body == s.message.body
    for i, status in enumerate(result.statuses):
        if status is not ok:
            assert result.offsets[i] == -1 and result.queue_offsets[i] == -1
    log.close()


def test_batch_larger_than_a_segment_is_refused_whole(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_each(log, [message(0)])
    end, table = log.max_offset, log.queue_offsets()
    batch = [message(i) for i in range(1, 25)]  # 24 records of ~221 bytes > 4 KiB
    result = log.append_batch(as_batches(batch))
    assert result.statuses == [PutStatus.MESSAGE_ILLEGAL] * len(batch)
    assert set(result.offsets) == {-1} and set(result.queue_offsets) == {-1}
    assert log.max_offset == end and _taken(log) == table
    # a single record larger than a segment, though within the body limit, likewise
    result = log.append_batch(as_batches([MessageIn(TOPIC, 0, b"b" * 5_000)]))
    assert result.statuses == [PutStatus.MESSAGE_ILLEGAL]
    assert log.max_offset == end and _taken(log) == table
    [after] = append_each(log, [message(1)])
    assert after.offset == end and after.queue_offset == 0
    log.close()


def test_batch_of_batch_messages_max_is_stored_and_one_more_is_refused_whole(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, limits=MessageLimits(batch_messages_max=4))
    stored = log.append_batch(as_batches([MessageIn(TOPIC, 0, b"m") for _ in range(4)]))
    assert stored.ok
    end, table = log.max_offset, log.queue_offsets()
    result = log.append_batch(as_batches([MessageIn(TOPIC, 0, b"m") for _ in range(5)]))
    assert result.statuses == [PutStatus.MESSAGE_ILLEGAL] * 5
    assert log.max_offset == end and log.queue_offsets() == table
    log.close()


def test_default_batch_limit_refuses_10001_messages(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.config.limits.batch_messages_max == 10_000
    result = log.append_batch(as_batches([MessageIn(TOPIC, 0, b"") for _ in range(10_001)]))
    assert set(result.statuses) == {PutStatus.MESSAGE_ILLEGAL}
    assert len(result.statuses) == 10_001
    assert log.max_offset == 0 and log.queue_offsets() == {}
    log.close()


def test_empty_batch_changes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    result = log.append_batch(as_batches([]))
    assert result.statuses == [] and result.ok
    assert log.max_offset == 0 and log.queue_offsets() == {}
    log.close()


def test_refused_batch_leaves_no_queue_behind(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_each(log, [message(0, queue_id=0)])
    table = log.queue_offsets()
    result = log.append_batch(as_batches([message(i, queue_id=7) for i in range(1, 25)]))
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    try:
        assert log.queue_offsets() == table
    finally:
        log.close()
