"""Producer idempotence in the engine (producers.py): the table, the MQS_PSEQ tag, and what a
kill -9 or a power loss leaves of it. A retry is a duplicate exactly when the first copy's
records survived; never is a request stored twice, never is a lost one reported as stored."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from commitlog_testlib import (
    NEVER_MS,
    kill,
    message,
    open_log,
    reopen,
    scan_all,
    sim_crash,
    sim_write_at,
)

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from commitlog_svc.messages import AppendResult, PutStatus
from commitlog_svc.producer_recovery import rebuild_from_tags
from commitlog_svc.producers import ProducerTable, decode_tag, encode_tag
from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.formats.commitlog_checkpoint import (
    ProducerEntry,
    ProducerRequest,
    decode_checkpoint,
)
from mqstore.formats.properties import decode_properties, encode_properties
from mqstore.formats.record import MAGIC_POS
from mqstore.storage.clock import ManualClock
from mqstore.storage.simdisk import CrashMode, SimDisk
from tests.commitlog.message_in import MessageIn, as_batches


def request(seq: int, size: int = 3, body_bytes: int = 60) -> list[MessageIn]:
    """The messages of request `seq` (bodies name the request and the message)."""
    return [
        MessageIn("T", (seq + k) % 3, f"req-{seq}-msg-{k}-".encode().ljust(body_bytes, b"x"))
        for k in range(size)
    ]


def same(a: AppendResult, b: AppendResult) -> bool:
    return (
        a.statuses == b.statuses
        and a.offsets == b.offsets
        and a.sizes == b.sizes
        and a.queue_offsets == b.queue_offsets
        and a.store_timestamp_ms == b.store_timestamp_ms
        and a.store_host == b.store_host
    )


# -- the tag and the table ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("producer_id", "refused"),
    [("p", ()), ("host:1234:pid", ()), ("日本", ((0, 6), (4, 7))), ("a:b", ((2, 6),))],
)
def test_a_tag_round_trips_even_with_colons_in_the_producer_id(
    producer_id: str, refused: tuple[tuple[int, int], ...]
) -> None:
    raw = encode_tag(producer_id, 2**64 - 1, 5, refused)
    value = decode_properties(raw)["MQS_PSEQ"]
    tag = decode_tag(value)
    assert tag is not None
    assert (tag.producer_id, tag.sequence, tag.count, tag.refused) == (
        producer_id,
        2**64 - 1,
        5,
        refused,
    )


@pytest.mark.parametrize(
    "value",
    ["", "p", "p:1:2", ":1:2:", "p:x:2:", "p:1:0:", "p:1:2:5/6", "p:1:2:0/6,1/6", "p:-1:2:",
     "p:1:2:a/b", f"p:{2**64}:1:"],
)  # fmt: skip
def test_a_malformed_tag_is_ignored_not_trusted(value: str) -> None:
    assert decode_tag(value) is None


def test_the_table_answers_new_retry_or_backwards() -> None:
    table = ProducerTable(producers_max=10, requests_max=2)
    st = table.state("p")
    assert table.check(st, "p", 5) is None
    for seq in (5, 6, 7):
        table.record("p", st, ProducerRequest(seq, 1, seq * 100, seq * 100 + 50))
    assert table.check(st, "p", 7) == ProducerRequest(7, 1, 700, 750)
    assert table.check(st, "p", 8) is None
    with pytest.raises(FailedPrecondition, match=r"remembered ones \(6..7\)"):
        table.check(st, "p", 5)


def test_the_table_forgets_the_least_recently_used_producer() -> None:
    table = ProducerTable(producers_max=2, requests_max=1)
    for pid in ("a", "b"):
        table.record(pid, table.state(pid), ProducerRequest(1, 1, 0, 10))
    table.state("a")  # a is used again: b is now the oldest
    table.record("c", table.state("c"), ProducerRequest(1, 1, 0, 10))
    assert {e.producer_id for e in table.snapshot()} == {"a", "c"}


def test_loading_a_snapshot_drops_requests_recovery_cut_and_rewinds_the_sequence() -> None:
    table = ProducerTable()
    table.load(
        [
            ProducerEntry("kept", 3, [ProducerRequest(3, 1, 0, 100)]),
            ProducerEntry(
                "cut", 9, [ProducerRequest(8, 1, 100, 200), ProducerRequest(9, 1, 200, 300)]
            ),
        ],
        end_offset=200,
    )
    kept = table.state("kept")
    cut = table.state("cut")
    assert kept.last_sequence == 3
    assert cut.last_sequence == 8 and list(cut.requests) == [8]
    assert table.check(cut, "cut", 9) is None  # not stored: its retry is new


# -- through the engine ------------------------------------------------------------------------


def test_a_retry_is_a_duplicate_and_a_bad_producer_id_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = log.append_batch(as_batches(request(1)), producer=("p", 1))
    assert first.ok and not first.duplicate
    retry = log.append_batch(as_batches(request(1)), producer=("p", 1))
    assert retry.duplicate and same(first, retry)
    assert len(scan_all(log)) == 3
    with pytest.raises(InvalidArgument):
        log.append_batch(as_batches(request(2)), producer=("", 2))
    with pytest.raises(InvalidArgument):
        log.append_batch(as_batches(request(2)), producer=("p", -1))
    log.close()


def test_retries_after_kill_9_are_rebuilt_from_the_tagged_records(tmp_path: Path) -> None:
    # No checkpoint after open: every request must be found again from its record's tag.
    log = open_log(tmp_path, checkpoint_interval_ms=NEVER_MS)
    firsts = {
        seq: log.append_batch(as_batches(request(seq)), producer=(f"p{seq % 2}", seq))
        for seq in range(6)
    }
    end = log.max_offset
    kill(log)
    log = reopen(log)
    for seq, first in firsts.items():
        retry = log.append_batch(as_batches(request(seq)), producer=(f"p{seq % 2}", seq))
        assert retry.duplicate and same(first, retry), seq
    assert log.max_offset == end
    with pytest.raises(FailedPrecondition):
        log.append_batch(as_batches(request(0)), producer=("p0", 1))  # behind p0's last (4)
    log.close()


def test_retries_after_a_clean_restart_come_from_the_checkpoint_snapshot(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = log.append_batch(as_batches(request(1)), producer=("p", 1))
    end = log.max_offset
    log.close()
    # The final checkpoint vouches for everything (F = end): the table comes from its snapshot,
    # since the tags are searched only after F.
    ckpt = decode_checkpoint((tmp_path / "checkpoint").read_bytes())
    assert ckpt.flushed_offset == end
    assert ckpt.producers == [ProducerEntry("p", 1, [ProducerRequest(1, 3, 0, end)])]
    log = reopen(log)
    retry = log.append_batch(as_batches(request(1)), producer=("p", 1))
    assert retry.duplicate and same(first, retry)
    log.close()


def test_a_tag_that_pushes_its_carrier_over_the_limit_is_stored_untagged(tmp_path: Path) -> None:
    """The rare fallback: the request is stored as it came, its retry recognised in memory."""
    log = open_log(tmp_path, file_bytes=1 << 20)
    near_limit = encode_properties({"P": "x" * (32_767 - 20 - 10)})  # 20: the record CRC
    messages = [MessageIn("T", 0, b"a", near_limit), MessageIn("T", 0, b"b", b"")]
    first = log.append_batch(as_batches(messages), producer=("p", 1))
    assert first.ok
    carried = [decode_properties(r.properties).get("MQS_PSEQ") for r in scan_all(log)]
    assert carried == [None, None]
    assert log.append_batch(as_batches(messages), producer=("p", 1)).duplicate
    log.close()


@pytest.mark.parametrize("mode", ["drop", "keep", "random"])
@pytest.mark.parametrize("seed", range(8))
def test_after_a_power_loss_each_request_is_stored_once_whether_or_not_it_survived(
    mode: CrashMode, seed: int
) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, flush=FlushMode.ASYNC,
                   checkpoint_interval_ms=NEVER_MS, flush_interval_ms=NEVER_MS,
                   producer_requests_max=30)  # fmt: skip
    sizes = {seq: rng.randint(1, 8) for seq in range(30)}
    for seq, size in sizes.items():
        assert log.append_batch(as_batches(request(seq, size, body_bytes=rng.randint(10, 300))),
                                producer=("p", seq)).ok  # fmt: skip
        if rng.random() < 0.2:
            log._flusher.flush_now()  # part of it reaches the disk
    sim_crash(log, disk, rng, mode)
    log = reopen(log, disk=disk, clock=clock)

    survived = _requests_in(log)
    for seq, count in survived.items():
        assert count == sizes[seq], f"request {seq} survived in part: {count} of {sizes[seq]}"
    for seq, size in sizes.items():
        retry = log.append_batch(as_batches(request(seq, size)), producer=("p", seq))
        assert retry.ok
        assert retry.duplicate == (seq in survived), seq
    assert _requests_in(log) == sizes, "every request exactly once"
    log.close()


def test_a_request_torn_by_a_crash_is_cut_whole_so_its_retry_stores_it_once() -> None:
    clock = ManualClock()
    disk = SimDisk(clock_ms=clock.now_ms)
    log = open_log("/store", disk=disk, clock=clock, checkpoint_interval_ms=NEVER_MS,
                   flush_interval_ms=NEVER_MS)  # fmt: skip
    before = log.append_batch(as_batches(request(0, 2)), producer=("p", 0))
    torn = log.append_batch(as_batches(request(1, 4)), producer=("p", 1))
    table = log.queue_offsets()
    # The crash tears the request's last record (above the durable offset): its first three
    # records survive, the fourth does not.
    sim_write_at(disk, log.config, torn.offsets[3], bytes(torn.sizes[3]))
    sim_crash(log, disk, random.Random(0), "keep")
    log = reopen(log, disk=disk, clock=clock)
    assert log.max_offset == torn.offsets[0], "the whole request is cut, not its last record"
    assert _requests_in(log) == {0: 2}
    assert log.queue_offsets() == next_queue_offsets_before(table, torn)
    retry = log.append_batch(as_batches(request(1, 4)), producer=("p", 1))
    assert not retry.duplicate and retry.offsets == torn.offsets
    assert retry.queue_offsets == torn.queue_offsets
    assert _requests_in(log) == {0: 2, 1: 4}
    assert log.append_batch(as_batches(request(0, 2)), producer=("p", 0)).duplicate
    assert same(before, log.append_batch(as_batches(request(0, 2)), producer=("p", 0)))
    log.close()


def next_queue_offsets_before(
    table: dict[tuple[str, int], int], result: AppendResult
) -> dict[tuple[str, int], int]:
    """The queue-offset table as it was before `result`'s messages took their offsets."""
    before = dict(table)
    for i, qo in enumerate(result.queue_offsets):
        key = ("T", (1 + i) % 3)
        before[key] = min(before[key], qo)
    return {k: v for k, v in before.items() if v > 0}


def _requests_in(log: CommitLog) -> dict[int, int]:
    """Messages in the log per request (bodies start with "req-<seq>-")."""
    found: dict[int, int] = {}
    for record in scan_all(log):
        seq = int(record.body.split(b"-")[1])
        found[seq] = found.get(seq, 0) + 1
    return found


def test_refusal_statuses_inside_a_request_survive_in_its_tag(tmp_path: Path) -> None:
    log = open_log(tmp_path, checkpoint_interval_ms=NEVER_MS)
    messages = [
        MessageIn("bad topic!", 0, b"x"),
        message(1),
        MessageIn("T", 0, b"y", encode_properties({"P": "z" * 33_000})),
    ]
    first = log.append_batch(as_batches(messages), producer=("p", 4))
    assert first.statuses == [
        PutStatus.MESSAGE_ILLEGAL,
        PutStatus.PUT_OK,
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
    ]
    kill(log)
    log = reopen(log)
    retry = log.append_batch(as_batches(messages), producer=("p", 4))
    assert retry.duplicate and same(first, retry)
    log.close()


# -- the tag walk over damaged records (producer_recovery.rebuild_from_tags) -------------------


class _Segment:
    """The attributes rebuild_from_tags reads of a mapped file, over plain bytes."""

    def __init__(self, data: bytearray) -> None:
        self.buf = data
        self.file_from_offset = 0
        self.wrote_position = self.file_end_offset = len(data)


class _Queue:
    def __init__(self, data: bytearray) -> None:
        self.files = [_Segment(data)]


def _tag_walk_case(tmp_path: Path, damage: str) -> tuple[list[int], int, list[int]]:
    """Requests 0-2 (3 records each) in one segment, `damage` done to their bytes; the requests
    rebuild_from_tags remembers, what it returns, and where each request begins."""
    log = open_log(tmp_path, checkpoint_interval_ms=NEVER_MS)
    results = [log.append_batch(as_batches(request(seq)), producer=("p", seq)) for seq in range(3)]
    end = log.max_offset
    data = bytearray(log.queue.files[0].buf[:end])
    log.close()
    if damage == "framing inside request 1":  # its second record's magic
        data[results[1].offsets[1] + MAGIC_POS] ^= 0xFF
    elif damage == "crc of request 0's tagged record":  # a body byte: framing intact
        data[data.find(b"req-0-msg-0-")] ^= 0xFF
    elif damage == "log ends inside request 2":
        end = results[2].offsets[2]
    producers = ProducerTable()
    cut = rebuild_from_tags(_Queue(data), producers, 0, end)  # type: ignore[arg-type]
    remembered = [r.sequence for e in producers.snapshot() for r in e.requests]
    return remembered, cut, [r.offsets[0] for r in results]


@pytest.mark.parametrize(
    ("damage", "remembered", "cut_request"),
    [
        ("none", [0, 1, 2], None),
        ("framing inside request 1", [0, 2], None),  # stepped over; the next tag still counts
        ("crc of request 0's tagged record", [1, 2], None),
        ("log ends inside request 2", [0, 1], 2),  # cut from its first record on
    ],
)
def test_the_tag_walk_steps_over_damage_and_cuts_a_torn_last_request(
    tmp_path: Path, damage: str, remembered: list[int], cut_request: int | None
) -> None:
    got, cut, firsts = _tag_walk_case(tmp_path, damage)
    assert got == remembered
    assert cut == (-1 if cut_request is None else firsts[cut_request])
