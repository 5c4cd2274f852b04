"""decode_columns: a frame as numpy columns is the frame decode_dispatch reads, row for row; both
refuse the same malformed frames; queue runs group rows as a dict of lists filled entry by entry.

`dispatch_streams` (a hypothesis strategy) is shared with tests/cq and tests/index, which apply
the same frames both ways and compare what lands on disk: a stream of frames as a follower sees
it, with transactions, several topics and queues, keys and unique ids, corrupt ranges, gaps in
queue offsets, queues that start above 0, store times that go back or out of range, and
rewinds (a reconnect re-sends frames from an earlier offset).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.dispatch import DispatchColumns, DispatchEntry
from mqstore.errors import MalformedFrame
from mqstore.formats import _core, sysflag
from mqstore.rpc.dispatch_codec import (
    decode_columns,
    decode_dispatch,
    decode_response,
    encode_dispatch,
)
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

TOPICS = ["A", "B", "%RETRY%g"]
TIME_BASE_MS = 1_700_000_000_000
_FLAGS = [
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_NOT_TYPE,
    sysflag.TRANSACTION_PREPARED_TYPE,
    sysflag.TRANSACTION_COMMIT_TYPE,
    sysflag.TRANSACTION_ROLLBACK_TYPE,
]
_TOKENS = ["k", "order-1", "é", "", "x" * 30, "B#c"]


@dataclass
class Stream:
    """Frames in the order a follower receives them, each as on the wire."""

    frames: list[pb.DispatchBatch]
    entries: list[DispatchEntry]  # the log, once, in commit-log order

    def __repr__(self) -> str:  # hypothesis prints this on failure: keep it readable
        return f"Stream({len(self.entries)} entries, {len(self.frames)} frames)"


def make_stream(rng: random.Random, *, include_keys: bool, max_entries: int = 150) -> Stream:
    queues = rng.sample([(t, q) for t in TOPICS for q in range(3)], rng.randint(1, 4))
    next_offset = {q: rng.choice([0, 0, 0, 3, 49, 120]) for q in queues}
    phy = rng.randrange(0, 10_000)
    time_ms = TIME_BASE_MS
    keys_share = rng.choice([0.0, 0.0, 0.4])  # most producers set unique ids only
    entries: list[DispatchEntry] = []
    corrupt: list[tuple[int, int]] = []
    for _ in range(rng.randint(0, max_entries)):
        if rng.random() < 0.03:  # a damaged stretch of log: no entry, a corrupt range
            gap = rng.randint(1, 500)
            corrupt.append((phy, phy + gap))
            phy += gap
        topic, queue_id = rng.choice(queues)
        flag = rng.choice(_FLAGS) | rng.choice([0, 0, sysflag.COMPRESSED, sysflag.INNER_BATCH])
        if sysflag.gets_queue_offset(flag):
            if rng.random() < 0.03:  # the log skipped queue offsets: blanks fill them
                next_offset[(topic, queue_id)] += rng.randint(1, 3)
            queue_offset = next_offset[(topic, queue_id)]
            next_offset[(topic, queue_id)] += 1
        else:
            queue_offset = rng.choice([0, next_offset[(topic, queue_id)]])
        roll = rng.random()
        if roll < 0.05:
            time_ms -= rng.randint(1, 5_000)  # the clock stepped back
        elif roll < 0.07:
            time_ms = rng.choice([-5, 0, (1 << 48) + 7])  # clamped by the time file
        else:
            time_ms = max(time_ms, TIME_BASE_MS) + rng.randint(0, 1_500)
        size = rng.randint(60, 400)
        uniq = "" if rng.random() < 0.1 else f"{rng.getrandbits(128):032X}"[: rng.randint(1, 32)]
        keys = (
            ""
            if rng.random() >= keys_share
            else " ".join(rng.choices(_TOKENS, k=rng.randint(1, 3)))
        )
        entries.append(
            DispatchEntry(
                topic=topic,
                queue_id=queue_id,
                queue_offset=queue_offset,
                commit_log_offset=phy,
                size=size,
                tags_code=rng.choice([0, 0, 7, -3, 2**40]),
                store_timestamp_ms=time_ms,
                sys_flag=flag,
                keys=keys,
                uniq_key=uniq,
            )
        )
        phy += size
    frames: list[pb.DispatchBatch] = []
    position = 0
    rewinds = 0
    while position < len(entries) or not frames:
        count = rng.choice([1, 2, 5, 17, 40, 200])
        chunk = entries[position : position + count]
        start = chunk[0].commit_log_offset if chunk else phy
        end = chunk[-1].end_offset if chunk else phy
        frames.append(
            encode_dispatch(
                chunk,
                start_offset=start,
                next_offset=end,
                include_keys=include_keys,
                corrupt=[(a, b) for a, b in corrupt if start <= a < end],
            )
        )
        position += len(chunk)
        if rewinds < 3 and position and rng.random() < 0.15:
            position = rng.randrange(0, position)  # a reconnect: re-sent from an earlier offset
            rewinds += 1
        if not chunk:
            break
    wire = [pb.DispatchBatch.FromString(f.SerializeToString()) for f in frames]
    return Stream(wire, entries)


@st.composite
def dispatch_streams(draw: st.DrawFn, include_keys: bool | None = None) -> Stream:
    seed = draw(st.integers(0, 2**32 - 1))
    keys = draw(st.booleans()) if include_keys is None else include_keys
    return make_stream(random.Random(seed), include_keys=keys)


# -- decode_columns against decode_dispatch ----------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(stream=dispatch_streams())
def test_columns_read_as_the_entries_decode_dispatch_makes(stream: Stream) -> None:
    for frame in stream.frames:
        columns = decode_columns(frame)
        entries = decode_dispatch(frame)
        assert columns.entries() == entries
        assert list(columns) == entries
        assert len(columns) == len(entries)
        assert (columns.start_offset, columns.next_offset) == (
            frame.start_offset,
            frame.next_offset,
        )
        if entries:
            assert columns[-1] == entries[-1]
            assert columns[0] == entries[0]
            assert columns[1:3] == entries[1:3]
        assert columns.queue_keys() == {(e.topic, e.queue_id) for e in entries}


@settings(max_examples=40, deadline=None)
@given(stream=dispatch_streams())
def test_queue_runs_group_as_a_dict_of_lists_filled_entry_by_entry(stream: Stream) -> None:
    for frame in stream.frames:
        entries = decode_dispatch(frame)
        expected: dict[tuple[str, int], list[int]] = {}
        for i, e in enumerate(entries):
            if e.goes_to_consume_queue:
                expected.setdefault((e.topic, e.queue_id), []).append(i)
        runs = decode_columns(frame).queue_runs()
        assert [(key, runs.run(r).tolist()) for r, key in enumerate(runs.keys)] == list(
            expected.items()
        )


def test_from_entries_gives_the_same_columns_as_the_wire() -> None:
    stream = make_stream(random.Random(7), include_keys=True)
    for frame in stream.frames:
        entries = decode_dispatch(frame)
        assert DispatchColumns.from_entries(entries).entries() == entries


def test_an_empty_frame_has_no_rows_and_no_runs() -> None:
    columns = decode_columns(pb.DispatchBatch(start_offset=5, next_offset=9))
    assert len(columns) == 0
    assert columns.entries() == []
    assert len(columns.queue_runs()) == 0
    assert columns.end_offset(9) == 9
    with pytest.raises(IndexError):
        columns[0]


def _frame(**fields: object) -> pb.DispatchBatch:
    base: dict[str, object] = {
        "topics": ["A"],
        "topic_indexes": [0, 0],
        "queue_ids": [0, 1],
        "queue_offsets": [0, 0],
        "commit_log_offsets": [0, 100],
        "sizes": [100, 100],
        "tags_codes": [0, 0],
        "store_timestamps_ms": [1, 2],
        "sys_flags": [0, 0],
    }
    base.update(fields)
    return pb.DispatchBatch(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"sizes": [100]},
        {"queue_ids": [0, 1, 2]},
        {"topic_indexes": [0]},
        {"sys_flags": []},
        {"keys": ["a"]},
        {"uniq_keys": ["a", "b", "c"]},
        {"topic_indexes": [0, 1]},
        {"topic_indexes": [0, -1]},
        {"topics": []},
        {"records": b"x" * 199},
        {"records": b"x" * 201},
        {"records": b"x" * 100, "sizes": [200, -100]},
    ],
    ids=[
        "short-sizes",
        "long-queue-ids",
        "short-topic-indexes",
        "no-sys-flags",
        "one-key-for-two",
        "three-uniq-for-two",
        "topic-index-past-table",
        "negative-topic-index",
        "empty-topic-table",
        "records-short-of-sizes",
        "records-past-sizes",
        "records-of-a-negative-size",
    ],
)
def test_a_malformed_frame_is_refused_alike_by_both_decoders(fields: dict[str, object]) -> None:
    frame = _frame(**fields)
    with pytest.raises(MalformedFrame) as by_entries:
        decode_dispatch(frame)
    with pytest.raises(MalformedFrame) as by_columns:
        decode_columns(frame)
    assert str(by_columns.value) == str(by_entries.value)


def test_a_well_formed_frame_passes_both_decoders() -> None:
    frame = _frame(keys=["a", ""], uniq_keys=[])
    assert decode_columns(frame).entries() == decode_dispatch(frame)
    assert decode_columns(frame).records == b""
    with_records = _frame(records=b"r" * 200)
    assert decode_columns(with_records).records == b"r" * 200
    assert decode_columns(with_records).entries() == decode_dispatch(with_records)
    assert np.array_equal(decode_columns(frame).queue_ids, [0, 1])


@pytest.mark.parametrize(
    "queues",
    [
        [0] * 5 + [1] * 5 + [2] * 5,  # a block a queue: found from where the key changes
        [0] * 5 + [1] * 5 + [0] * 5,  # a queue again later: grouped by sorting
        [2, 0, 2, 1, 0, 1],
        [3] * 4,
    ],
)
def test_queue_runs_of_blocks_and_of_mixed_frames_are_a_dict_of_lists(queues: list[int]) -> None:
    entries = [
        DispatchEntry("T" if i % 7 else "U", q, i, 100 * i, 100, 0, 1_000 + i, sys_flag=flag)
        for i, (q, flag) in enumerate(zip(queues, [0, 0, 0, 0xC, 0] * 4, strict=False))
    ]
    # with a rolled-back message among them (no unit), and without
    for frame in (entries, [e for e in entries if e.goes_to_consume_queue]):
        want: dict[tuple[str, int], list[int]] = {}
        for i, e in enumerate(frame):
            if e.goes_to_consume_queue:
                want.setdefault((e.topic, e.queue_id), []).append(i)
        runs = DispatchColumns.from_entries(frame).queue_runs()
        assert [(key, runs.run(r).tolist()) for r, key in enumerate(runs.keys)] == list(
            want.items()
        )


def _reference(raw: bytes) -> object:
    """What protobuf's own parser and decode_dispatch make of a stream message's bytes: the
    entries, the frame's other fields, or the typed refusal."""
    try:
        message = pb.SubscribeResponse.FromString(raw)
    except DecodeError:
        return MalformedFrame
    if message.WhichOneof("frame") != "batch":
        return message
    b = message.batch
    try:
        entries = decode_dispatch(b)
    except MalformedFrame as err:
        return str(err)
    return (entries, b.start_offset, b.next_offset, list(b.topics), b.records)


def _compiled(raw: bytes) -> object:
    try:
        got = decode_response(raw)
    except MalformedFrame as err:
        return MalformedFrame if _core_error(err) else str(err)
    if not isinstance(got, DispatchColumns):
        return got
    return (got.entries(), got.start_offset, got.next_offset, got.topics, got.records)


def _core_error(err: MalformedFrame) -> bool:
    return isinstance(err.__cause__, (_core.WireError, DecodeError))


@settings(max_examples=60, deadline=None)
@given(stream=dispatch_streams(include_keys=True), data=st.data())
def test_the_compiled_decode_of_wire_bytes_is_protobufs_damaged_bytes_included(
    stream: Stream, data: st.DataObject
) -> None:
    """decode_response (the compiled decode the subscribers run) gives what protobuf's parser
    and decode_dispatch give, for every frame and for the frame's bytes damaged: flipped
    bytes, cut short, garbage appended, a handshake; a refusal is MalformedFrame either way."""
    for frame in stream.frames:
        raw = bytearray(pb.SubscribeResponse(batch=frame).SerializeToString())
        assert _compiled(bytes(raw)) == _reference(bytes(raw))
        for _ in range(data.draw(st.integers(0, 3))):
            kind = data.draw(st.sampled_from(["flip", "cut", "append", "handshake"]))
            if kind == "flip" and raw:
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
            elif kind == "cut":
                raw = raw[: data.draw(st.integers(0, len(raw)))]
            elif kind == "append":
                raw += data.draw(st.binary(max_size=12))
            else:
                raw += pb.SubscribeResponse(
                    handshake=pb.Handshake(min_offset=3)
                ).SerializeToString()
        assert _compiled(bytes(raw)) == _reference(bytes(raw)), bytes(raw)


def test_an_int32_field_keeps_the_low_32_bits_of_a_wider_varint_as_protobuf_does() -> None:
    batch = _frame(queue_ids=[0]).SerializeToString()  # the second queue id added wide:
    wide = batch + bytes([5 << 3, 0x87, 0x80, 0x80, 0x80, 0x10])  # 2**32 + 7
    raw = bytes([2 << 3 | 2]) + _varint_bytes(len(wide)) + wide
    assert _compiled(raw) == _reference(raw)
    assert decode_response(raw).queue_ids.tolist() == [0, 7]  # type: ignore[union-attr]


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string_field(number: int, value: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint_bytes(len(value)) + value


# Bytes near UTF-8's edges (lead byte classes, the strict rules' continuation bounds), any
# bytes, and UTF-8 text with spaces and characters of every width.
_EDGES = (0x20, 0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC1, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xF5)
_string_bytes = (
    st.lists(st.sampled_from(_EDGES), max_size=9).map(bytes)
    | st.binary(max_size=10)
    | st.text(max_size=10).map(lambda s: s.encode("utf-8", "surrogatepass"))
)


@settings(max_examples=600, deadline=None)
@given(number=st.sampled_from([12, 13]), value=_string_bytes)
def test_a_key_or_unique_id_is_refused_exactly_when_python_will_not_decode_it(
    number: int, value: bytes
) -> None:
    """The frame's strings stay bytes (no str per message), yet a frame whose key or unique id
    is no UTF-8 by Python's strict decoder (overlong forms, surrogates, past U+10FFFF, cut
    sequences) is refused whole as before, and one that is reads back as the decoded str."""
    one = {name: values[:1] for name, values in _FRAME_COLUMNS.items()}
    batch = _frame(**one).SerializeToString() + _string_field(number, value)
    raw = _string_field(2, batch)
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(MalformedFrame, match="no UTF-8"):
            decode_response(raw)
        return
    got = decode_response(raw)
    assert isinstance(got, DispatchColumns)
    assert list(got.keys if number == 12 else got.uniq_keys) == [text]
    field = {"keys": text} if number == 12 else {"uniq_key": text}
    assert got.entries() == [DispatchEntry("A", 0, 0, 0, 100, 0, 1, **field)]  # type: ignore[arg-type]


_FRAME_COLUMNS: dict[str, list[int]] = {
    "topic_indexes": [0],
    "queue_ids": [0],
    "queue_offsets": [0],
    "commit_log_offsets": [0],
    "sizes": [100],
    "tags_codes": [0],
    "store_timestamps_ms": [1],
    "sys_flags": [0],
}
