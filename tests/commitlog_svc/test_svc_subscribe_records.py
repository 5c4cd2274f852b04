"""Subscribe with include_records: a frame built from the appends the commit log still holds in
memory (append_frames.py) carries every entry's record, back to back in entry order; any other
frame (a scan: the subscriber is behind the window, the process restarted, the records were
dropped to bound memory) carries none. All or none per frame.

The reference for the bytes is the log itself: the segment file and the Read RPC at each
entry's (offset, size)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from commitlog_svc.append_frames import APPEND_RECORDS_BYTES_MAX
from mqstore.errors import MalformedFrame
from mqstore.formats.record_columns import split_records
from mqstore.rpc.dispatch_codec import decode_columns, decode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.storage.mapped_file import offset_to_file_name
from tests.commitlog_svc.support import (
    FILE_BYTES,
    RPC_TIMEOUT_S,
    Running,
    batch,
    parse,
    subscribe,
)


def _end(response: pb.AppendResponse) -> int:
    return int(response.commit_log_offsets[-1] + response.sizes[-1])


def _read(svc: Running, offsets: Sequence[int], sizes: Sequence[int]) -> bytes:
    """The records at (offsets[i], sizes[i]) back to back, as the Read RPC serves them."""
    response = svc.stub.Read(
        pb.ReadRequest(offsets=list(offsets), sizes=list(sizes)),
        timeout=RPC_TIMEOUT_S,
    )
    assert list(response.statuses) == [pb.READ_OK] * len(offsets)
    return bytes(response.records_blob)


def _segment_bytes(svc: Running, offset: int, size: int) -> bytes:
    """The bytes at `offset` in the segment file that holds it (files named by their start)."""
    file_bytes = svc.settings.file_bytes
    start = offset - offset % file_bytes
    path = Path(svc.data_dir) / "commitlog" / offset_to_file_name(start)
    with open(path, "rb") as f:
        f.seek(offset - start)
        return f.read(size)


def _check_records(svc: Running, frame: pb.DispatchBatch) -> None:
    """The frame's records are the log's bytes at its entries: per entry from the segment
    file, and all at once from the Read RPC; each parses as the record its entry names."""
    offsets, sizes = list(frame.commit_log_offsets), list(frame.sizes)
    assert len(frame.records) == sum(sizes)
    assert frame.records == _read(svc, offsets, sizes)
    columns = decode_columns(frame)  # the subscriber's decoder takes it as it is
    assert columns.records == frame.records
    entries = decode_dispatch(frame)
    pieces = split_records(frame.records, sizes)
    for entry, raw in zip(entries, pieces, strict=True):
        assert raw == _segment_bytes(svc, entry.commit_log_offset, entry.size)
        record = parse(raw)
        assert (record.topic, record.queue_id, record.queue_offset, record.physical_offset) == (
            entry.topic,
            entry.queue_id,
            entry.queue_offset,
            entry.commit_log_offset,
        )


def _entries_of(frames: Sequence[pb.DispatchBatch]) -> list[tuple[int, int]]:
    return [(o, s) for f in frames for o, s in zip(f.commit_log_offsets, f.sizes, strict=True)]


def _stored(responses: Sequence[pb.AppendResponse]) -> list[tuple[int, int]]:
    return [(o, s) for r in responses for o, s in zip(r.commit_log_offsets, r.sizes, strict=True)]


def _without_records(frame: pb.DispatchBatch) -> pb.DispatchBatch:
    plain = pb.DispatchBatch()
    plain.CopyFrom(frame)
    plain.ClearField("records")
    return plain


# -- frames of held appends carry their records ----------------------------------------------


@pytest.mark.parametrize("include_keys", [False, True])
def test_a_tailing_subscriber_gets_each_appends_records_as_written(
    svc: Running, include_keys: bool
) -> None:
    reader = subscribe(svc, "tail", include_records=True, include_keys=include_keys)
    plain = subscribe(svc, "plain", include_keys=include_keys)
    assert reader.handshake.max_offset == plain.handshake.max_offset == 0
    stored = []
    for i, count in enumerate((1, 10, 3, 25)):
        stored.append(svc.append_ok(batch(i * 100, count)))
        reader.wait_reaching(_end(stored[-1]))
        plain.wait_reaching(_end(stored[-1]))
    frames = reader.batches()
    assert _entries_of(frames) == _stored(stored)
    assert all(f.records for f in frames)
    for frame in frames:
        _check_records(svc, frame)
    # Without include_records the same frames, with no records.
    others = plain.batches()
    assert all(not f.records for f in others)
    assert [_without_records(f) for f in frames] == others
    reader.cancel()
    plain.cancel()


def test_a_confirm_turns_the_records_on_and_off_while_the_stream_runs(svc: Running) -> None:
    reader = subscribe(svc, "toggled")

    def confirm(include: bool | None) -> None:
        request = pb.ConfirmRequest(
            subscriber_id="toggled", store_id=reader.handshake.store_id, confirmed_offset=0
        )
        if include is not None:
            request.include_records = include
        svc.stub.Confirm(request, timeout=RPC_TIMEOUT_S)

    carried = []
    for include in (None, True, None, False, True):
        confirm(include)
        done = svc.append_ok(batch(len(carried) * 10, 4))
        reader.wait_reaching(_end(done))
        frame = reader.batches()[-1]
        assert _entries_of([frame]) == _stored([done])
        carried.append(bool(frame.records))
        if frame.records:
            _check_records(svc, frame)
    # Unset leaves it as it was: off from the Subscribe, then on, on, off, on.
    assert carried == [False, True, True, False, True]
    reader.cancel()


def test_one_frame_holds_several_appends_of_several_topics_back_to_back(svc: Running) -> None:
    stored = [
        svc.append_ok(batch(0, 5, topic="A"), batch(5, 3, topic="B"), batch(8, 4, topic="A")),
        svc.append_ok(batch(20, 7, topic="C", body_bytes=300)),
        svc.append_ok(batch(30, 2, topic="B"), producer_id="p1", sequence=1),  # tagged
    ]
    streamed = list(
        svc.stub.AppendStream(
            iter(
                [
                    pb.AppendRequest(batches=[batch(40, 6, topic="A", keys=False)]),
                    pb.AppendRequest(batches=[batch(50, 1, topic="D"), batch(51, 2, topic="A")]),
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )
    )
    assert all(s == pb.PUT_OK for r in streamed for s in r.statuses)
    stored += streamed
    end = _end(stored[-1])
    # Subscribing late: the held runs are taken together, several appends a frame.
    reader = subscribe(svc, "late", include_records=True, include_keys=True)
    frames = reader.wait_reaching(end)
    assert len(frames) < len(stored), "a frame spans appends"
    assert _entries_of(frames) == _stored(stored)
    assert {t for f in frames for t in f.topics} == {"A", "B", "C", "D"}
    for frame in frames:
        assert frame.records
        _check_records(svc, frame)
    # Cut small, the frames still carry exactly their own entries' records.
    small = subscribe(svc, "small", include_records=True, max_batch_entries=4)
    cut = small.wait_reaching(end)
    assert [len(f.sizes) for f in cut[:-1]] == [4] * (len(cut) - 1)
    assert b"".join(f.records for f in cut) == b"".join(f.records for f in frames)
    for frame in cut:
        _check_records(svc, frame)
    reader.cancel()
    small.cancel()


def test_under_sync_flush_durable_frames_carry_their_records(
    start: Callable[..., Running],
) -> None:
    svc = start(flush="sync")
    reader = subscribe(svc, "sync", include_records=True, max_batch_entries=16)
    assert reader.handshake.max_offset == 0
    stored = [svc.append_ok(batch(i, 10)) for i in range(0, 40, 10)]
    frames = reader.wait_reaching(_end(stored[-1]))
    assert _entries_of(frames) == _stored(stored)
    for frame in frames:
        assert frame.records
        _check_records(svc, frame)
    reader.cancel()


def test_the_decoder_refuses_records_that_do_not_add_up_to_the_sizes(svc: Running) -> None:
    reader = subscribe(svc, "codec", include_records=True)
    end = _end(svc.append_ok(batch(0, 3)))
    (frame,) = reader.wait_reaching(end)
    assert len(decode_columns(frame).records) == sum(frame.sizes)
    for damaged in (frame.records[:-1], frame.records + b"\x00"):
        bad = pb.DispatchBatch()
        bad.CopyFrom(frame)
        bad.records = damaged
        with pytest.raises(MalformedFrame, match="records"):
            decode_columns(bad)
    reader.cancel()


# -- frames with no records ------------------------------------------------------------------


def test_behind_the_window_the_scanned_frames_carry_no_records_then_held_ones_do(
    start: Callable[..., Running],
) -> None:
    svc = start(dispatch_append_bytes=8192)  # a few runs of 40 entries are held
    stored = [svc.append_ok(batch(i, 40)) for i in range(0, 800, 40)]
    reader = subscribe(svc, "behind", include_records=True, include_keys=True)
    frames = reader.wait_reaching(_end(stored[-1]))
    assert _entries_of(frames) == _stored(stored)
    assert not frames[0].records, "the oldest appends are no longer held: scanned"
    for frame in frames:
        if frame.records:
            _check_records(svc, frame)
    caught_up = len(frames)
    more = svc.append_ok(batch(1000, 40))
    fresh = reader.wait_reaching(_end(more))[caught_up:]
    assert _entries_of(fresh) == _stored([more])
    assert all(f.records for f in fresh)
    for frame in fresh:
        _check_records(svc, frame)
    reader.cancel()


def test_after_a_restart_nothing_is_held_so_old_entries_come_without_records(
    start: Callable[..., Running], tmp_path: Path
) -> None:
    first = start(tmp_path / "log")
    before = [first.append_ok(batch(i, 10, topic=f"T{i % 3}")) for i in range(0, 50, 10)]
    first.stop()
    svc = start(tmp_path / "log")
    reader = subscribe(svc, "again", include_records=True)
    frames = reader.wait_reaching(_end(before[-1]))
    assert _entries_of(frames) == _stored(before)
    assert all(not f.records for f in frames)
    after = svc.append_ok(batch(100, 10))
    fresh = reader.wait_reaching(_end(after))[len(frames) :]
    assert _entries_of(fresh) == _stored([after])
    assert all(f.records for f in fresh)
    for frame in fresh:
        _check_records(svc, frame)
    reader.cancel()


def test_records_past_the_records_bound_are_dropped_oldest_first(
    start: Callable[..., Running],
) -> None:
    # Appends of ~770 KiB into one segment (no end-of-file blank to cross): the newest that
    # fit APPEND_RECORDS_BYTES_MAX keep their records; the window of entries (32 MiB of
    # columns) still holds every run, so every frame is built from held runs.
    svc = start(file_bytes=32 << 20)
    stored: list[pb.AppendResponse] = []
    total = 0
    while total <= APPEND_RECORDS_BYTES_MAX + (2 << 20):
        stored.append(svc.append_ok(batch(len(stored) * 200, 200, body_bytes=3800)))
        total += sum(stored[-1].sizes)
    run_bytes = [sum(r.sizes) for r in stored]
    held_from = len(stored)  # the oldest run still holding its records
    while held_from > 0 and sum(run_bytes[held_from - 1 :]) <= APPEND_RECORDS_BYTES_MAX:
        held_from -= 1
    assert 0 < held_from < len(stored) - 1
    held_start = stored[held_from].commit_log_offsets[0]
    reader = subscribe(svc, "bound", include_records=True)
    frames = reader.wait_reaching(_end(stored[-1]))
    assert _entries_of(frames) == _stored(stored)
    assert all(f.start_offset == f.commit_log_offsets[0] for f in frames)
    for frame in frames:
        if frame.start_offset < held_start:
            assert not frame.records, "a frame with any dropped run carries no records"
        else:
            assert frame.records
            _check_records(svc, frame)
    assert not frames[0].records and frames[-1].records
    reader.cancel()


def test_the_frame_that_crosses_an_end_of_file_blank_is_scanned_and_carries_no_records(
    svc: Running,
) -> None:
    # A tailing subscriber at the end of a segment is at no held run's entry: it scans across
    # the blank (append_frames.py), so the new segment's first append comes without records;
    # the following appends are held again and carry theirs.
    reader = subscribe(svc, "roll", include_records=True)
    assert reader.handshake.max_offset == 0
    stored: list[pb.AppendResponse] = []
    while not stored or _end(stored[-1]) < FILE_BYTES:
        stored.append(svc.append_ok(batch(len(stored) * 20, 20, body_bytes=500)))
        reader.wait_reaching(_end(stored[-1]))
    first_in_new = len(stored) - 1
    assert stored[first_in_new].commit_log_offsets[0] == FILE_BYTES
    stored.append(svc.append_ok(batch(10_000, 20, body_bytes=500)))
    frames = reader.wait_reaching(_end(stored[-1]))
    assert _entries_of(frames) == _stored(stored)
    crossing = [f for f in frames if f.start_offset != f.commit_log_offsets[0]]
    assert len(crossing) == 1 and crossing[0].commit_log_offsets[0] == FILE_BYTES
    assert not crossing[0].records
    for frame in frames:
        if frame is not crossing[0]:
            assert frame.records
            _check_records(svc, frame)
    assert frames[-1].commit_log_offsets[0] == stored[-1].commit_log_offsets[0]
    reader.cancel()
