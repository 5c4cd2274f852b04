"""The window of appended runs (commitlog_svc/append_frames.py) on its own: which entries a
subscriber at a given offset gets, and what the window forgets."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog_svc.append_frames import (
    FRAME_ENTRY_BYTES,
    AppendedRun,
    AppendFrames,
    DispatchProperties,
    RunSlice,
    dispatch_properties,
)
from commitlog_svc.dispatch_scan import WireFrame, frame_of_runs
from mqstore.formats._core import dispatch_of_runs
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import encode_properties
from mqstore.formats.record_batch import MessageBatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

SIZE = 100


def run(start: int, count: int, records: bytes | None = None) -> AppendedRun:
    offsets = [start + i * SIZE for i in range(count)]
    return AppendedRun(
        offsets=offsets,
        end=start + count * SIZE,
        topics=["t"],
        topic_indexes=None,
        queue_ids=[0] * count,
        queue_offsets=list(range(count)),
        sizes=[SIZE] * count,
        store_timestamp_ms=1,
        sys_flags=[0] * count,
        props=DispatchProperties([0] * count, [""] * count, [""] * count),
        records=records,
    )


def batch_of(frame: WireFrame) -> pb.DispatchBatch:
    """The frame as its subscriber reads it: the wire bytes parsed."""
    response = pb.SubscribeResponse.FromString(frame.wire)
    assert response.WhichOneof("frame") == "batch"
    assert frame.next_offset == response.batch.next_offset
    assert frame.entries == len(response.batch.commit_log_offsets)
    return response.batch


def records_of(start: int, count: int) -> bytes:
    """Records that name their own offsets, so a slice shows where it came from."""
    return b"".join(f"{start + i * SIZE:0{SIZE}d}".encode() for i in range(count))


def spans(slices: list[RunSlice] | None) -> list[tuple[int, int, int]] | None:
    if slices is None:
        return None
    return [(s.run.start, s.lo, s.hi) for s in slices]


def test_take_follows_runs_that_continue_each_other_up_to_the_bounds() -> None:
    frames = AppendFrames()
    for start in (0, 1000, 2000):
        frames.add(run(start, 10))
    everything = 1 << 40
    assert spans(frames.take(0, everything, 100, everything)) == [
        (0, 0, 10),
        (1000, 0, 10),
        (2000, 0, 10),
    ]
    assert spans(frames.take(300, everything, 12, everything)) == [(0, 3, 10), (1000, 0, 5)]
    # Bytes: entries that start less than bytes_max past the offset; at least one.
    assert spans(frames.take(0, everything, 100, 250)) == [(0, 0, 3)]
    assert spans(frames.take(0, everything, 100, 1)) == [(0, 0, 1)]


def test_only_entries_ending_below_the_visible_end_are_taken() -> None:
    frames = AppendFrames()
    frames.add(run(0, 10))
    frames.add(run(1000, 10))
    assert spans(frames.take(0, 1450, 100, 1 << 40)) == [(0, 0, 10), (1000, 0, 4)]
    assert spans(frames.take(0, 550, 100, 1 << 40)) == [(0, 0, 5)]
    assert frames.take(500, 550, 100, 1 << 40) == []  # held, not visible yet


def test_offsets_that_start_no_held_entry_are_not_held() -> None:
    frames = AppendFrames()
    frames.add(run(1000, 10))
    frames.add(run(3000, 10))  # a gap before it
    assert frames.take(0, 1 << 40, 100, 1 << 40) is None
    assert frames.take(1050, 1 << 40, 100, 1 << 40) is None  # inside a record
    # Inside a run's last record: past its last entry's start, before its end (a fuzzed
    # Subscribe found this raised IndexError, INTERNAL to the subscriber).
    assert frames.take(1950, 1 << 40, 100, 1 << 40) is None
    assert frames.take(2000, 1 << 40, 100, 1 << 40) is None  # the end of a run, in the gap
    assert spans(frames.take(1000, 1 << 40, 100, 1 << 40)) == [(1000, 0, 10)]  # stops at the gap


def test_the_oldest_runs_are_forgotten_beyond_the_bound() -> None:
    one = run(0, 10).nbytes()
    assert one == 10 * FRAME_ENTRY_BYTES
    frames = AppendFrames(bytes_max=4 * one)
    for i in range(5):
        frames.add(run(i * 1000, 10))
    assert frames.take(0, 1 << 40, 100, 1 << 40) is None
    assert spans(frames.take(4000, 1 << 40, 100, 1 << 40)) == [(4000, 0, 10)]
    frames.clear()
    assert frames.take(4000, 1 << 40, 100, 1 << 40) is None
    assert not AppendFrames(bytes_max=0).enabled


def test_dispatch_properties_are_the_parsers_values_per_message() -> None:
    props = [
        encode_properties({"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}),
        b"",
        encode_properties({"UNIQ_KEY": "U3"}),
    ]
    batches = [
        MessageBatch(topic="t", queue_ids=[0, 0, 0], bodies=[b"1", b"2", b"3"], properties=props),
        MessageBatch(topic="u", queue_ids=[1], bodies=[b"4"]),
    ]
    found = dispatch_properties(batches)
    assert found.tags_codes == [tags_code("a"), 0, 0, 0]
    assert found.keys == ["k1 k2", "", "", ""]
    assert found.uniq_keys == ["U1", "", "U3", ""]


def test_a_run_slices_the_records_its_append_wrote() -> None:
    held = run(1000, 5, records_of(1000, 5))
    assert held.records_of(0, 5) == records_of(1000, 5)
    assert held.records_of(1, 3) == records_of(1100, 2)
    assert held.records_of(4, 5) == records_of(1400, 1)
    assert run(0, 2).records_of(0, 2) is None


def test_records_are_held_for_the_newest_runs_only() -> None:
    one = len(records_of(0, 10))
    frames = AppendFrames(records_bytes_max=2 * one)
    runs = [run(i * 1000, 10, records_of(i * 1000, 10)) for i in range(4)]
    for r in runs:
        frames.add(r)
    assert [r.records is not None for r in runs] == [False, False, True, True]
    # The entries stay held without their records: frames without records, no scan.
    assert spans(frames.take(0, 1 << 40, 100, 1 << 40)) == [(i * 1000, 0, 10) for i in range(4)]
    too_big = run(4000, 10, records_of(4000, 10) * 3)
    frames.add(too_big)
    assert too_big.records is None and runs[3].records is not None
    frames.clear()
    assert runs[3].records is None


def test_runs_forgotten_by_the_entries_bound_let_their_records_go() -> None:
    one = run(0, 10).nbytes()
    frames = AppendFrames(bytes_max=2 * one, records_bytes_max=1 << 30)
    runs = [run(i * 1000, 10, records_of(i * 1000, 10)) for i in range(3)]
    for r in runs:
        frames.add(r)
    assert runs[0].records is None and runs[2].records is not None


def test_a_frame_carries_records_only_within_its_bound_and_only_all_of_them() -> None:
    first, second = run(0, 10, records_of(0, 10)), run(1000, 10, records_of(1000, 10))
    both = [RunSlice(first, 2, 10), RunSlice(second, 0, 4)]
    wanted = records_of(200, 8) + records_of(1000, 4)
    assert batch_of(frame_of_runs(both, False, len(wanted))).records == wanted
    assert batch_of(frame_of_runs(both, False, len(wanted) - 1)).records == b""  # over the bound
    assert batch_of(frame_of_runs(both, False)).records == b""  # not asked
    second.records = None  # dropped to bound memory: none at all, not a part
    assert batch_of(frame_of_runs(both, False, 1 << 20)).records == b""
    assert list(batch_of(frame_of_runs(both, False, 1 << 20)).commit_log_offsets) == [
        *range(200, 1000, SIZE),
        *range(1000, 1400, SIZE),
    ]


@st.composite
def held_runs(draw: st.DrawFn) -> list[RunSlice]:
    """Slices of runs that continue each other, each run with its own topics (one: no topic
    indexes), the first slice starting and the last ending anywhere in their runs."""
    slices: list[RunSlice] = []
    start = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 4))):
        count = draw(st.integers(1, 12))
        names = st.sampled_from(["A", "B", "C", "%RETRY%g"])
        topics = draw(st.lists(names, min_size=1, max_size=3, unique=True))
        sizes = draw(st.lists(st.integers(91, 5_000), min_size=count, max_size=count))
        offsets = [start + sum(sizes[:i]) for i in range(count)]
        start += sum(sizes)
        ints = st.lists(st.integers(-(2**31), 2**31 - 1), min_size=count, max_size=count)
        texts = st.lists(st.text(max_size=12), min_size=count, max_size=count)
        held = AppendedRun(
            offsets=offsets,
            end=start,
            topics=topics,
            topic_indexes=None
            if len(topics) == 1
            else draw(st.lists(st.integers(0, len(topics) - 1), min_size=count, max_size=count)),
            queue_ids=draw(st.lists(st.integers(0, 65_535), min_size=count, max_size=count)),
            queue_offsets=draw(st.lists(st.integers(0, 2**62), min_size=count, max_size=count)),
            sizes=sizes,
            store_timestamp_ms=draw(st.integers(0, 2**45)),
            sys_flags=draw(st.lists(st.integers(0, 0x7FF), min_size=count, max_size=count)),
            props=DispatchProperties(draw(ints), draw(texts), draw(texts)),
        )
        slices.append(RunSlice(held, 0, count))
    first, last = slices[0], slices[-1]
    first.lo = draw(st.integers(0, len(first.run.offsets) - 1))
    last.hi = draw(st.integers(last.lo + 1, len(last.run.offsets)))
    return slices


def frame_entry_by_entry(slices: list[RunSlice], include_keys: bool) -> pb.DispatchBatch:
    """The reference: each entry's fields appended one by one. The frame's topics are every
    topic of each run in turn, also one no entry of the slice uses."""
    batch = pb.DispatchBatch()
    topics: dict[str, int] = {}
    for piece in slices:
        held = piece.run
        for topic in held.topics:
            topics.setdefault(topic, len(topics))
        for i in range(piece.lo, piece.hi):
            topic = held.topics[0 if held.topic_indexes is None else held.topic_indexes[i]]
            batch.topic_indexes.append(topics[topic])
            batch.queue_ids.append(held.queue_ids[i])
            batch.queue_offsets.append(held.queue_offsets[i])
            batch.commit_log_offsets.append(held.offsets[i])
            batch.sizes.append(held.sizes[i])
            batch.tags_codes.append(held.props.tags_codes[i])
            batch.store_timestamps_ms.append(held.store_timestamp_ms)
            batch.sys_flags.append(held.sys_flags[i])
            if include_keys:
                batch.keys.append(held.props.keys[i])
                batch.uniq_keys.append(held.props.uniq_keys[i])
    batch.topics.extend(topics)
    return batch


@settings(max_examples=80, deadline=None)
@given(slices=held_runs(), include_keys=st.booleans())
def test_a_frame_of_runs_holds_each_entry_as_appended_one_by_one(
    slices: list[RunSlice], include_keys: bool
) -> None:
    got = batch_of(frame_of_runs(slices, include_keys))
    last = slices[-1]
    wanted = frame_entry_by_entry(slices, include_keys)
    wanted.start_offset = slices[0].run.offsets[slices[0].lo]
    wanted.next_offset = (
        last.run.offsets[last.hi] if last.hi < len(last.run.offsets) else last.run.end
    )
    assert got == wanted
    # A packed field split over several chunks appends them in order, as repeated strings do:
    # the frame sent twice in one message (its batch merged twice) holds every entry twice.
    wire = dispatch_of_runs(slices, include_keys, 0, 0, [])
    twice = pb.SubscribeResponse.FromString(wire + wire).batch
    assert list(twice.tags_codes) == list(got.tags_codes) * 2
    assert list(twice.topic_indexes) == list(got.topic_indexes) * 2
    assert list(twice.uniq_keys) == list(got.uniq_keys) * 2
