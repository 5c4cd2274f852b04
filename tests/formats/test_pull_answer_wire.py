"""The compiled core's writer of a FOUND pull's queue offsets and record sizes as PullResponse
wire bytes (formats/_core_pull_answer.pxi) pinned to the protobuf runtime: the bytes it
serializes from the same fields, and the message they merge into."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.formats import _core
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


@st.composite
def columns(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    n = draw(st.integers(0, 40))
    return (
        draw(st.lists(INT64, min_size=n, max_size=n)),
        draw(st.lists(INT32, min_size=n, max_size=n)),
    )


def _arr(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(columns())
def test_the_bytes_are_the_runtimes(cols: tuple[list[int], list[int]]) -> None:
    offsets, sizes = cols
    wire = _core.pull_answer_wire(_arr(offsets), _arr(sizes))
    assert wire == pb.PullResponse(queue_offsets=offsets, record_sizes=sizes).SerializeToString()
    merged = pb.PullResponse(status=pb.FOUND, records_blob=b"x", next_begin_offset=7)
    merged.MergeFromString(wire)
    assert list(merged.queue_offsets) == offsets
    assert list(merged.record_sizes) == sizes
    assert merged.records_blob == b"x" and merged.next_begin_offset == 7


def test_columns_of_one_pull_from_a_unit_columns_row() -> None:
    """The rows decide_pull hands out are views of one (4, n) array: read as they are."""
    out = np.arange(4 * 5, dtype=np.int64).reshape(4, 5)
    wire = _core.pull_answer_wire(out[0, :3], out[2, :3])
    assert (
        wire
        == pb.PullResponse(queue_offsets=[0, 1, 2], record_sizes=[10, 11, 12]).SerializeToString()
    )


def test_refuses_what_the_runtime_refuses() -> None:
    with pytest.raises(ValueError):
        pb.PullResponse(record_sizes=[1 << 31])
    with pytest.raises(ValueError):
        _core.pull_answer_wire(_arr([0]), _arr([1 << 31]))
    with pytest.raises(ValueError):
        _core.pull_answer_wire(_arr([0, 1]), _arr([5]))
    with pytest.raises(ValueError):
        _core.pull_answer_wire(np.asarray([0], dtype=np.int32), _arr([5]))
    with pytest.raises(ValueError):
        _core.pull_answer_wire(np.arange(4, dtype=np.int64)[::2], _arr([5, 6]))
