"""The compiled core's AppendRequest and AppendResponse writers and its AppendResponse reader
(formats/_core_append.pxi) pinned to the protobuf runtime: what it serializes from the same
fields, and what it parses out of any bytes; its share cutting and measuring pinned to their
plain-Python references (formats/append_wire.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import _core, append_wire
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT64 = st.integers(0, (1 << 64) - 1)
TEXT = st.text(max_size=40)
BLOB = st.binary(max_size=300)
Batch = tuple[str, list[int], list[bytes], list[bytes], list[int], int]


@st.composite
def wire_batches(draw: st.DrawFn) -> Batch:
    n = draw(st.integers(0, 12))
    flags = draw(st.lists(INT32, min_size=n, max_size=n)) if draw(st.booleans()) else []
    return (
        draw(TEXT),
        draw(st.lists(INT32, min_size=n, max_size=n)),
        draw(st.lists(BLOB, min_size=n, max_size=n)),
        draw(st.lists(BLOB, min_size=0, max_size=n)),
        flags,
        draw(INT64),
    )


@settings(max_examples=300, deadline=None)
@given(producer_id=TEXT, sequence=UINT64, batches=st.lists(wire_batches(), max_size=4))
def test_append_request_wire_is_protobufs(
    producer_id: str,
    sequence: int,
    batches: list[Batch],
) -> None:
    wire = _core.append_request_wire(producer_id, sequence, batches)
    request = pb.AppendRequest(producer_id=producer_id, sequence=sequence)
    for topic, queue_ids, bodies, properties, flags, born_ms in batches:
        request.batches.add(
            topic=topic,
            queue_ids=queue_ids,
            bodies=bodies,
            properties=properties,
            sys_flags=flags,
            born_timestamp_ms=born_ms,
        )
    assert wire == request.SerializeToString()
    assert pb.AppendRequest.FromString(wire) == request


@st.composite
def answers(draw: st.DrawFn) -> tuple[object, ...]:
    n = draw(st.integers(0, 30))
    column = st.lists(INT64, min_size=n, max_size=n)
    refusals = draw(st.lists(st.tuples(INT32, INT32, TEXT, TEXT), max_size=3))
    return (
        draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)),
        draw(column),
        draw(st.lists(INT32, min_size=n, max_size=n)),
        draw(column),
        draw(INT64),
        draw(st.binary(max_size=20)),
        refusals,
        draw(st.booleans()),
        draw(UINT64),
    )


@settings(max_examples=300, deadline=None)
@given(answer=answers())
def test_append_response_wire_is_protobufs(answer: tuple[object, ...]) -> None:
    statuses, offsets, sizes, queue_offsets, ts, host, refusals, duplicate, sequence = answer
    wire = _core.append_response_wire(*answer)  # type: ignore[arg-type]
    response = pb.AppendResponse(
        statuses=statuses,  # type: ignore[arg-type]
        commit_log_offsets=offsets,  # type: ignore[arg-type]
        sizes=sizes,  # type: ignore[arg-type]
        queue_offsets=queue_offsets,  # type: ignore[arg-type]
        store_timestamp_ms=ts,  # type: ignore[arg-type]
        store_host=host,  # type: ignore[arg-type]
        duplicate=duplicate,  # type: ignore[arg-type]
        sequence=sequence,  # type: ignore[arg-type]
    )
    for index, status, reason, field in refusals:  # type: ignore[attr-defined]
        response.refusals.add(index=index, status=status, reason=reason, field=field)
    assert wire == response.SerializeToString()
    assert pb.AppendResponse.FromString(wire) == response


@pytest.mark.parametrize(
    "bad",
    [
        ("t", [1 << 31], [b"x"], [b""], [], 0),  # a queue id past int32
        ("t", [0], [b"x"], [b""], [], 1 << 63),  # a born time past int64
    ],
)
def test_a_number_out_of_its_fields_range_is_refused(bad: Batch) -> None:
    with pytest.raises((ValueError, OverflowError)):
        _core.append_request_wire("p", 1, [bad])


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(st.tuples(st.binary(max_size=60), st.binary(max_size=30)), max_size=40),
    overhead=st.integers(0, 20),
    share_messages=st.integers(1, 12),
    share_bytes=st.integers(0, 300),
)
def test_share_bounds_are_the_references(
    messages: list[tuple[bytes, bytes]], overhead: int, share_messages: int, share_bytes: int
) -> None:
    bodies = [b for b, _ in messages]
    props = [p for _, p in messages]
    shares = _core.share_bounds(bodies, props, overhead, share_messages, share_bytes)
    assert shares == append_wire.share_bounds(bodies, props, overhead, share_messages, share_bytes)
    # The shares cover the messages in order, each within its bounds (or one heavy message).
    assert [i for first, end, _ in shares for i in range(first, end)] == list(range(len(bodies)))
    for first, end, weight in shares:
        assert 0 < end - first <= share_messages
        assert weight == sum(len(bodies[i]) + len(props[i]) + overhead for i in range(first, end))
        assert weight <= share_bytes or end - first == 1


def test_share_bounds_refuse_columns_of_different_lengths() -> None:
    for share_bounds in (_core.share_bounds, append_wire.share_bounds):
        with pytest.raises(ValueError):
            share_bounds([b"a", b"b"], [b""], 0, 10, 100)


@settings(max_examples=300, deadline=None)
@given(answer=answers(), error=st.none() | st.tuples(INT32, TEXT, TEXT), unpacked=st.booleans())
def test_read_append_response_is_protobufs(
    answer: tuple[object, ...], error: tuple[int, str, str] | None, unpacked: bool
) -> None:
    wire = _core.append_response_wire(*answer)  # type: ignore[arg-type]
    if error is not None:
        wire += pb.AppendResponse(
            error=pb.RequestError(code=error[0], message=error[1], field=error[2])
        ).SerializeToString()
    if unpacked:  # a status as one varint, not packed: read as protobuf reads it
        wire += b"\x08\x03"
    assert _core.read_append_response(wire) == _columns(pb.AppendResponse.FromString(wire))


def _columns(parsed: pb.AppendResponse) -> tuple[object, ...]:
    return (
        list(parsed.statuses),
        list(parsed.commit_log_offsets),
        list(parsed.sizes),
        list(parsed.queue_offsets),
        parsed.store_timestamp_ms,
        parsed.store_host,
        [(r.index, r.status, r.reason, r.field) for r in parsed.refusals],
        parsed.duplicate,
        parsed.sequence,
        (parsed.error.code, parsed.error.message, parsed.error.field)
        if parsed.HasField("error")
        else None,
    )


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=80))
def test_read_append_response_takes_any_bytes_as_protobuf_does(data: bytes) -> None:
    try:
        expected = _columns(pb.AppendResponse.FromString(data))
    except DecodeError:
        with pytest.raises(ValueError):
            _core.read_append_response(data)
        return
    assert _core.read_append_response(data) == expected


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(
        st.binary(max_size=50)
        | st.binary(max_size=5).map(bytearray)
        | st.text(max_size=5)
        | st.integers(0, 9),
        max_size=12,
    )
)
def test_widest_bytes_is_the_references(items: list[object]) -> None:
    assert _core.widest_bytes(items) == append_wire.widest_bytes(items)


@settings(max_examples=500, deadline=None)
@given(
    answer=answers(),
    cut=st.integers(0, 1 << 16),
    at=st.integers(0, 1 << 16),
    byte=st.integers(0, 255),
)
def test_read_append_response_takes_damaged_answers_as_protobuf_does(
    answer: tuple[object, ...], cut: int, at: int, byte: int
) -> None:
    wire = bytearray(_core.append_response_wire(*answer))  # type: ignore[arg-type]
    if wire:
        wire[at % len(wire)] = byte
        del wire[cut % (len(wire) + 1) :]
    test_read_append_response_takes_any_bytes_as_protobuf_does.hypothesis.inner_test(bytes(wire))  # type: ignore[attr-defined]


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


# Fields no AppendRequest or MessageBatch has (or a known number of another wire type, which
# protobuf skips as unknown too): varints, fixed widths, blobs and groups.
UNKNOWN = st.one_of(
    st.tuples(st.integers(12, 500), UINT64).map(lambda f: _varint(f[0] << 3) + _varint(f[1])),
    st.tuples(st.integers(12, 500), st.binary(min_size=8, max_size=8)).map(
        lambda f: _varint(f[0] << 3 | 1) + f[1]
    ),
    st.tuples(st.integers(12, 500), st.binary(max_size=8)).map(lambda f: _delimited(*f)),
    st.tuples(st.integers(12, 500), UINT64).map(
        lambda f: _varint(f[0] << 3 | 3) + _varint(7 << 3) + _varint(f[1]) + _varint(f[0] << 3 | 4)
    ),
    st.sampled_from([b"\x18\x05", b"\x30\x01", b"\x1d\x00\x00\x00\x00", b"\x42\x00"]),
)


@st.composite
def batch_parts(draw: st.DrawFn) -> bytes:
    """One MessageBatch field's bytes as a sender may write it: any fields, repeated ones
    unpacked too, scalars more than once (the last wins), unknown fields between."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 6))
        parts.append(
            pb.MessageBatch(
                topic=draw(TEXT),
                queue_ids=draw(st.lists(INT32, max_size=n)),
                bodies=draw(st.lists(BLOB, max_size=n)),
                properties=draw(st.lists(BLOB, max_size=n)),
                sys_flags=draw(st.lists(INT32, max_size=n)),
                sys_flag=draw(INT32),
                flag=draw(INT32),
                born_timestamp_ms=draw(INT64),
                born_host=draw(TEXT),
                reconsume_times=draw(INT32),
                prepared_tx_offset=draw(INT64),
            ).SerializeToString()
        )
    for value in draw(st.lists(INT64, max_size=3)):  # unpacked queue ids and sys flags
        parts.append(_varint(draw(st.sampled_from([2, 5])) << 3) + _varint(value))
    for value in draw(st.lists(UINT64, max_size=3)):  # a scalar of any width: int32 truncates
        field = draw(st.sampled_from([6, 7, 8, 10, 11]))
        parts.append(_varint(field << 3) + _varint(value))
    parts += draw(st.lists(UNKNOWN, max_size=3))
    return _delimited(1, b"".join(draw(st.permutations(parts))))


@st.composite
def request_wires(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(batch_parts(), max_size=4))
    for _ in range(draw(st.integers(0, 2))):
        parts.append(
            pb.AppendRequest(producer_id=draw(TEXT), sequence=draw(UINT64)).SerializeToString()
        )
    parts += draw(st.lists(UNKNOWN, max_size=3))
    return b"".join(draw(st.permutations(parts)))


def _request_columns(parsed: pb.AppendRequest) -> tuple[object, ...]:
    batches = [
        (
            b.topic,
            list(b.queue_ids),
            list(b.bodies),
            list(b.properties),
            list(b.sys_flags),
            b.sys_flag,
            b.flag,
            b.born_timestamp_ms,
            b.born_host,
            b.reconsume_times,
            b.prepared_tx_offset,
        )
        for b in parsed.batches
    ]
    return batches, parsed.producer_id, parsed.sequence


@settings(max_examples=500, deadline=None)
@given(wire=request_wires())
def test_read_append_request_is_protobufs(wire: bytes) -> None:
    assert _core.read_append_request(wire) == _request_columns(pb.AppendRequest.FromString(wire))


@settings(max_examples=300, deadline=None)
@given(producer_id=TEXT, sequence=UINT64, batches=st.lists(wire_batches(), max_size=4))
def test_read_append_request_reads_what_the_sdk_writes(
    producer_id: str, sequence: int, batches: list[Batch]
) -> None:
    wire = _core.append_request_wire(producer_id, sequence, batches)
    read, read_producer, read_sequence = _core.read_append_request(wire)
    assert (read_producer, read_sequence) == (producer_id, sequence)
    assert [(b[0], b[1], b[2], b[3], b[4], b[7]) for b in read] == batches


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=80))
def test_read_append_request_takes_any_bytes_as_protobuf_does(data: bytes) -> None:
    try:
        expected = _request_columns(pb.AppendRequest.FromString(data))
    except DecodeError:
        with pytest.raises(ValueError):
            _core.read_append_request(data)
        return
    assert _core.read_append_request(data) == expected


@settings(max_examples=500, deadline=None)
@given(
    wire=request_wires(),
    cut=st.integers(0, 1 << 16),
    at=st.integers(0, 1 << 16),
    byte=st.integers(0, 255),
)
def test_read_append_request_takes_damaged_requests_as_protobuf_does(
    wire: bytes, cut: int, at: int, byte: int
) -> None:
    damaged = bytearray(wire)
    if damaged:
        damaged[at % len(damaged)] = byte
        del damaged[cut % (len(damaged) + 1) :]
    test_read_append_request_takes_any_bytes_as_protobuf_does.hypothesis.inner_test(bytes(damaged))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "bad",
    [
        b"\x12\x02\xc3\x28",  # a producer id that is no UTF-8
        b"\x0a\x03\x0a\x01\xff",  # a topic that is no UTF-8
        b"\x0a\x03\x4a\x01\xff",  # a born host that is no UTF-8
        b"\x0a\x02\x12\x01",  # a batch cut short
        b"\x0a\x03\x12\x01\x80",  # packed queue ids ending in a varint's middle
        b"\x0c",  # a group's end with no start
        b"\x0a\x01\x0c",  # the same inside a batch
    ],
)
def test_read_append_request_refuses_what_protobuf_refuses(bad: bytes) -> None:
    with pytest.raises(DecodeError):
        pb.AppendRequest.FromString(bad)
    with pytest.raises(ValueError):
        _core.read_append_request(bad)


def _groups(depth: int) -> bytes:
    """`depth` nested groups of an unknown field (20)."""
    return _varint(20 << 3 | 3) * depth + _varint(20 << 3 | 4) * depth


@pytest.mark.parametrize("depth", [99, 100, 101])
def test_groups_nest_as_deep_as_protobuf_lets_them_in_a_sub_message_too(depth: int) -> None:
    """Protobuf's nesting limit counts sub-messages and groups alike: a batch, a refusal or a
    request error holds one group fewer than the top level."""
    cases: list[tuple[Callable[[bytes], object], Callable[[bytes], object], bytes]] = [
        (pb.AppendRequest.FromString, _core.read_append_request, _groups(depth)),
        (pb.AppendRequest.FromString, _core.read_append_request, _delimited(1, _groups(depth))),
        (pb.AppendResponse.FromString, _core.read_append_response, _delimited(7, _groups(depth))),
        (pb.AppendResponse.FromString, _core.read_append_response, _delimited(10, _groups(depth))),
    ]
    for parse, read, wire in cases:
        try:
            parse(wire)
        except DecodeError:
            with pytest.raises(ValueError):
                read(wire)
        else:
            read(wire)
