"""A follower checks every replicated record as recovery checks it, before any byte becomes
visible: a chunk with one damaged byte in any field of a record, a torn or padded chunk, a
misplaced blank, a chunk cut inside an idempotent request, or epochs that contradict its
history is refused with a typed error, and nothing of it is stored (issue 24)."""

from __future__ import annotations

import dataclasses
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import Chunk, check_chunk
from mqstore.errors import ChunkRefused, HistoryMismatch, InvalidArgument
from mqstore.formats.properties import RECORD_CRC
from mqstore.formats.record import Blank, encode_blank, field_spans, read_record, scan_run
from mqstore.history import Epoch
from tests.commitlog.message_in import as_batches
from tests.commitlog_svc.replica_support import (
    FILE_BYTES,
    assert_same_log,
    close_all,
    copy,
    follower_of,
    leader,
    message,
    producers_of,
    segments,
)

# How long the follower's flusher may take to flush what it already holds.
FLUSH_SETTLE_S = 10.0
# Every field of a record (record.py's layout), as field_spans names them.
FIELDS = [
    "TOTALSIZE",
    "MAGICCODE",
    "BODYCRC",
    "QUEUEID",
    "FLAG",
    "QUEUEOFFSET",
    "PHYSICALOFFSET",
    "SYSFLAG",
    "BORNTIMESTAMP",
    "BORNHOST",
    "STORETIMESTAMP",
    "STOREHOST",
    "RECONSUMETIMES",
    "PREPAREDTXOFFSET",
    "BODYLENGTH",
    "BODY",
    "TOPICLENGTH",
    "TOPIC",
    "PROPERTIESLENGTH",
    "PROPERTIES",
    RECORD_CRC,
]
# Without the whole-record CRC, recovery checks these fields (lengths, magic, own offset, the
# body CRC); a changed queue id or timestamp passes there, and so it does here.
CHECKED_WITHOUT_RECORD_CRC = [
    "TOTALSIZE",
    "MAGICCODE",
    "BODYCRC",
    "PHYSICALOFFSET",
    "BODYLENGTH",
    "BODY",
    "PROPERTIESLENGTH",
]


def state(log: ReplicaLog) -> tuple[Any, ...]:
    return (
        log.end_offset,
        segments(log),
        log.queue_offsets(),
        producers_of(log),
        log.history,
        log.flushed_offset,
    )


def pair(tmp_path: Path, **overrides: Any) -> tuple[ReplicaLog, ReplicaLog, Chunk]:
    """A leader with three records in a new epoch past what its follower holds, and the chunk
    of those three the follower is to take next."""
    lead = leader(tmp_path / "leader", **overrides)
    rng = random.Random(1)
    for i in range(4):
        lead.append_batch(as_batches([message(rng, i, body_bytes=60)]))
    follower = follower_of(lead, tmp_path / "follower", **overrides)
    copy(lead, follower)
    lead.become_leader(2)
    lead.append_batch(
        as_batches([message(rng, 10 + i, body_bytes=60) for i in range(3)]), producer=("p", 1)
    )
    chunk = lead.read_chunk(follower.end_offset)
    assert chunk.epochs[-1] == Epoch(2, follower.end_offset)
    return lead, follower, chunk


def second_record(chunk: Chunk) -> tuple[int, bytes]:
    first = read_record(chunk.data, 0, len(chunk.data), check_crc=True)
    at = first.total_size  # type: ignore[union-attr]
    second = read_record(chunk.data, at, len(chunk.data), check_crc=True)
    return at, chunk.data[at : at + second.total_size]  # type: ignore[union-attr]


def damaged(chunk: Chunk, field: str) -> Chunk:
    """The chunk with one byte changed in the middle of `field` of its second record."""
    at, raw = second_record(chunk)
    spans = {name: (a, b) for name, a, b in field_spans(raw)}
    a, b = spans[field]
    data = bytearray(chunk.data)
    data[at + (a + b) // 2] ^= 0x5A
    return dataclasses.replace(chunk, data=bytes(data))


def assert_refused(follower: ReplicaLog, bad: Chunk, error: type[Exception] = ChunkRefused) -> None:
    # The flusher settles first: a flush of what the follower already held is not a change.
    deadline = time.monotonic() + FLUSH_SETTLE_S
    while follower.flushed_offset < follower.end_offset and time.monotonic() < deadline:
        time.sleep(0.005)
    before = state(follower)
    with pytest.raises(error):
        follower.append_replicated(bad)
    assert state(follower) == before, "a refused chunk changed the follower"


@pytest.mark.parametrize("field", FIELDS)
def test_a_changed_byte_in_any_field_refuses_the_chunk(tmp_path: Path, field: str) -> None:
    lead, follower, chunk = pair(tmp_path)
    assert_refused(follower, damaged(chunk, field))
    follower.append_replicated(chunk)  # the intact chunk is taken
    copy(lead, follower)
    assert_same_log(lead, follower)


@pytest.mark.parametrize("field", CHECKED_WITHOUT_RECORD_CRC)
def test_without_the_record_crc_the_fields_recovery_checks_refuse_the_chunk(
    tmp_path: Path, field: str
) -> None:
    _, follower, chunk = pair(tmp_path, record_crc=False)
    assert_refused(follower, damaged(chunk, field))


def test_the_refusal_names_where_and_why(tmp_path: Path) -> None:
    _, follower, chunk = pair(tmp_path)
    at, _ = second_record(chunk)
    with pytest.raises(ChunkRefused, match="record CRC mismatch") as refused:
        follower.append_replicated(damaged(chunk, "QUEUEOFFSET"))
    assert refused.value.offset == chunk.offset + at
    assert "none stored" in str(refused.value)


def test_torn_padded_and_misplaced_chunks_are_refused(tmp_path: Path) -> None:
    lead, follower, chunk = pair(tmp_path)
    data = chunk.data
    end = follower.end_offset
    bad = [
        dataclasses.replace(chunk, data=data[:-10], next_offset=chunk.next_offset - 10),
        dataclasses.replace(chunk, data=data[:7], next_offset=end + 7),
        dataclasses.replace(chunk, data=data + b"\x00" * 12, next_offset=chunk.next_offset + 12),
        dataclasses.replace(
            chunk, data=data + bytes(range(1, 40)), next_offset=chunk.next_offset + 39
        ),
        # A blank must span the rest of the segment, and come last.
        dataclasses.replace(
            chunk, data=data + encode_blank(100), next_offset=chunk.next_offset + 8
        ),
        dataclasses.replace(
            chunk,
            data=data + encode_blank(FILE_BYTES - chunk.next_offset % FILE_BYTES) + data[:8],
            next_offset=chunk.next_offset + 16,
        ),
        # More bytes than the segment has room for.
        dataclasses.replace(chunk, data=data * 40, next_offset=end + len(data) * 40),
        # Bytes that say one end, a chunk that says another.
        dataclasses.replace(chunk, next_offset=chunk.next_offset + 1),
    ]
    for chunk_bad in bad:
        assert_refused(follower, chunk_bad)
    assert_refused(follower, dataclasses.replace(chunk, epochs=()), InvalidArgument)
    follower.append_replicated(chunk)
    copy(lead, follower)
    assert_same_log(lead, follower)


def test_a_chunk_cut_inside_an_idempotent_request_is_refused(tmp_path: Path) -> None:
    """The leader never sends one (a promoted follower holding part of a request would store
    its retry's messages twice): a follower refuses one from anywhere."""
    _, follower, chunk = pair(tmp_path)
    at, raw = second_record(chunk)
    cut = dataclasses.replace(chunk, data=chunk.data[: at + len(raw)])
    cut = dataclasses.replace(cut, next_offset=chunk.offset + len(cut.data))
    with pytest.raises(ChunkRefused, match="run past the chunk"):
        follower.append_replicated(cut)
    assert_refused(follower, cut)


def test_epochs_that_contradict_the_followers_history_are_refused(tmp_path: Path) -> None:
    lead, follower, chunk = pair(tmp_path)
    # The chunk's bytes are epoch 2's; a leader claiming them for an epoch the follower's
    # history places elsewhere is one the follower has not been truncated against.
    older = dataclasses.replace(chunk, epochs=(Epoch(1, 0), Epoch(2, chunk.offset + 1)))
    follower.become_leader(3)  # the follower's own epoch 3 begins at its end
    follower.become_follower()
    assert_refused(follower, chunk, HistoryMismatch)
    assert_refused(follower, older, HistoryMismatch)
    assert lead.end_offset > follower.end_offset


def _sample_chunk() -> tuple[bytes, int]:
    """Records of idempotent requests and plain appends, then the segment's blank, as a leader
    sends them (built once, through a real leader)."""
    with tempfile.TemporaryDirectory() as root:
        lead = leader(f"{root}/leader")
        rng = random.Random(3)
        lead.append_batch(
            as_batches([message(rng, i, body_bytes=40) for i in range(3)]), producer=("p", 1)
        )
        lead.append_batch(as_batches([message(rng, 9, body_bytes=40)]))
        lead.append_batch(
            as_batches([message(rng, i, body_bytes=40) for i in range(2)]), producer=("q", 5)
        )
        while lead.max_offset < FILE_BYTES:
            lead.append_batch(as_batches([message(rng, 10, body_bytes=700)]))
        chunk = lead.read_chunk(0)
        close_all()
    assert chunk.next_offset == FILE_BYTES
    return chunk.data, chunk.offset


SAMPLE, SAMPLE_AT = _sample_chunk()


@settings(max_examples=300, deadline=None)
@given(
    changes=st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), max_size=3),
    cut=st.integers(0, len(SAMPLE)),
    tail=st.binary(max_size=30),
)
def test_a_damaged_chunk_is_refused_or_is_one_recovery_would_keep_whole(
    changes: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    """check_chunk never fails otherwise than ChunkRefused, and what it accepts the reference
    walk (record.scan_run, recovery's verdicts) reads whole: records to the end, or records
    and the blank sized to the segment's end."""
    data = bytearray(SAMPLE)
    for pos, value in changes:
        data[pos] = value
    data = bytes(data[:cut]) + tail
    try:
        checked = check_chunk(data, SAMPLE_AT, FILE_BYTES)
    except ChunkRefused:
        return
    end, _, stop = scan_run(data, 0, len(data), SAMPLE_AT, check_crc=True)
    if checked.blank:
        assert isinstance(stop, Blank) and end + 8 == len(data)
        assert stop.total_size == FILE_BYTES - end
    else:
        assert stop is None and end == len(data)


def test_a_refused_chunk_at_a_segments_start_creates_no_segment(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    rng = random.Random(6)
    while lead.max_offset < FILE_BYTES:
        lead.append_batch(as_batches([message(rng, 0, body_bytes=600)]))
    follower = follower_of(lead, tmp_path / "follower")
    while follower.end_offset < FILE_BYTES:
        follower.append_replicated(lead.read_chunk(follower.end_offset))
    assert follower.end_offset == FILE_BYTES
    lead.become_leader(2)
    follower.become_leader(3)
    follower.become_follower()
    chunk = lead.read_chunk(FILE_BYTES)
    assert chunk.data and chunk.offset == FILE_BYTES
    assert_refused(follower, chunk, HistoryMismatch)
    assert list(segments(follower)) == ["00000000000000000000"]
