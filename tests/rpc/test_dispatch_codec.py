"""A dispatch batch survives the trip through its columnar frame unchanged."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.dispatch import DispatchEntry
from mqstore.rpc.dispatch_codec import decode_dispatch, encode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

entries = st.builds(
    DispatchEntry,
    topic=st.sampled_from(["A", "B", "%RETRY%g"]),
    queue_id=st.integers(0, 65_535),
    queue_offset=st.integers(0, 2**40),
    commit_log_offset=st.integers(0, 2**50),
    size=st.integers(91, 5_000_000),
    tags_code=st.integers(-(2**31), 2**31 - 1),
    store_timestamp_ms=st.integers(0, 2**45),
    sys_flag=st.integers(0, 0x7FF),
    keys=st.text(max_size=20),
    uniq_key=st.text(alphabet="0123456789ABCDEF", max_size=32),
)


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(entries, max_size=30), include_keys=st.booleans())
def test_round_trip_through_the_wire(batch: list[DispatchEntry], include_keys: bool) -> None:
    frame = encode_dispatch(batch, start_offset=7, next_offset=99, include_keys=include_keys)
    wire = pb.DispatchBatch.FromString(frame.SerializeToString())
    decoded = decode_dispatch(wire)
    if include_keys:
        assert decoded == batch
    else:
        assert decoded == [dataclasses.replace(e, keys="", uniq_key="") for e in batch]
    assert (wire.start_offset, wire.next_offset) == (7, 99)
    assert len(wire.topics) == len({e.topic for e in batch})
