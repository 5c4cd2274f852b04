"""A pull's answer written as wire bytes with its records spliced in last (formats/pull_wire.py)
pinned to the protobuf runtime: the bytes parse as the message filled field by field, records
and all, alone and as a FollowResponse's answers."""

from __future__ import annotations

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import pull_wire
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
STATUS = st.sampled_from(pb.GetMessageStatus.values())


@st.composite
def answers(draw: st.DrawFn) -> tuple[pb.PullResponse, list[bytes]]:
    """A PullResponse without records_blob (as the servicer fills one) and its records."""
    records = draw(st.lists(st.binary(max_size=300), max_size=8))
    n = len(records)
    response = pb.PullResponse(
        status=draw(STATUS),
        next_begin_offset=draw(INT64),
        min_offset=draw(INT64),
        max_offset=draw(INT64),
        queue_offsets=draw(st.lists(INT64, min_size=n, max_size=n)),
        record_sizes=[len(r) for r in records],
        pull_index=draw(INT32),
    )
    if draw(st.booleans()):
        response.bad_record.CopyFrom(
            pb.BadRecord(
                queue_offset=draw(INT64),
                commit_log_offset=draw(INT64),
                size=draw(INT32),
                reason=draw(st.text(max_size=20)),
            )
        )
    return response, records


def _with_blob(response: pb.PullResponse, records: list[bytes]) -> pb.PullResponse:
    whole = pb.PullResponse()
    whole.CopyFrom(response)
    whole.records_blob = b"".join(records)
    return whole


@settings(max_examples=300, deadline=None)
@given(answers(), st.booleans())
def test_a_pull_answer_parses_as_the_message_with_its_records(
    answer: tuple[pb.PullResponse, list[bytes]], as_views: bool
) -> None:
    response, records = answer
    chunks = [memoryview(r) for r in records] if as_views else records
    wire = pull_wire.pull_answer(response.SerializeToString(), chunks)
    assert pb.PullResponse.FromString(wire) == _with_blob(response, records)
    if not any(records):
        assert wire == response.SerializeToString()  # no empty field, as the runtime writes


@settings(max_examples=200, deadline=None)
@given(st.lists(answers(), max_size=5))
def test_follow_answers_parse_as_the_follow_response(
    answers_: list[tuple[pb.PullResponse, list[bytes]]],
) -> None:
    wire = pull_wire.follow_answers([(r.SerializeToString(), recs) for r, recs in answers_])
    expected = pb.FollowResponse(answers=[_with_blob(r, recs) for r, recs in answers_])
    assert pb.FollowResponse.FromString(wire) == expected
    assert wire == expected.SerializeToString() or any(recs for _, recs in answers_)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, (1 << 64) - 1))
def test_varint_is_the_runtimes(value: int) -> None:
    assert pull_wire.varint(value) == _VarintBytes(value)


@pytest.mark.parametrize("value", [-1, 1 << 64])
def test_varint_refuses_what_is_no_uint64(value: int) -> None:
    with pytest.raises(ValueError):
        pull_wire.varint(value)
