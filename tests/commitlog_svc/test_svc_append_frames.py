"""Dispatch frames from the appends' own columns (commitlog_svc/append_frames.py).

Subscribers whose position is held get their frames from memory; every frame must be exactly
what a scan of the same range of the segment gives (the scan is the reference: it reads the
records back and checks each one). Where nothing is held (behind the window, a refused
message's gap, an end-of-file blank) the subscriber scans and comes back to the held runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from commitlog_svc import metrics
from commitlog_svc.dispatch_scan import scan_dispatch
from mqstore.formats.properties import encode_properties
from mqstore.rpc.dispatch_codec import decode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog_svc.support import FILE_BYTES, Running, batch, subscribe


def _sources() -> dict[str, float]:
    return {
        source: metrics.DISPATCH_FRAMES.labels(source)._value.get()
        for source in ("appended", "scan", "shared")
    }


def _delta(before: dict[str, float]) -> dict[str, float]:
    after = _sources()
    return {k: after[k] - before[k] for k in after}


def _as_scanned(svc: Running, frames: list[pb.DispatchBatch], include_keys: bool) -> None:
    """Each frame is the frame a scan of its range gives, byte for byte."""
    for got in frames:
        fresh = scan_dispatch(
            svc.engine,
            got.start_offset,
            max_records=max(1, len(got.commit_log_offsets)),
            max_bytes=1 << 30,
            include_keys=include_keys,
        )
        assert fresh.next_offset == got.next_offset
        assert pb.SubscribeResponse.FromString(fresh.wire(include_keys)).batch == got


def _entries(frames: list[pb.DispatchBatch]) -> list[object]:
    return [e for f in frames for e in decode_dispatch(f)]


def _scanned_entries(svc: Running, start: int, end: int, include_keys: bool) -> list[object]:
    entries: list[object] = []
    offset = start
    while offset < end:
        found = scan_dispatch(
            svc.engine, offset, max_records=1 << 20, max_bytes=1 << 30, include_keys=include_keys
        )
        entries.extend(decode_dispatch(pb.SubscribeResponse.FromString(found.wire(True)).batch))
        assert found.next_offset > offset
        offset = found.next_offset
    return entries


@pytest.mark.parametrize("entries_max", [7, 10, 64, 1024])
@pytest.mark.parametrize("include_keys", [False, True])
def test_tailing_subscribers_get_the_scans_frames_without_scanning(
    svc: Running, entries_max: int, include_keys: bool
) -> None:
    reader = subscribe(svc, "tail", max_batch_entries=entries_max, include_keys=include_keys)
    hs = reader.handshake
    before = _sources()
    end = hs.max_offset
    for i, count in enumerate((10, 1, 25, 3, 40, 10)):
        end = svc.append_ok(batch(i * 100, count)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(end)
    assert all(len(f.commit_log_offsets) <= entries_max for f in frames)
    _as_scanned(svc, frames, include_keys)
    assert sum(len(f.commit_log_offsets) for f in frames) == 89
    delta = _delta(before)
    assert delta["appended"] == len(frames) and delta["scan"] == 0
    reader.cancel()


def test_a_frame_spans_appends_up_to_its_bounds_like_a_scan(svc: Running) -> None:
    end = 0
    for i in range(0, 30, 10):
        end = svc.append_ok(batch(i, 10)).commit_log_offsets[-1] + 1
    before = _sources()
    reader = subscribe(svc, "late", max_batch_entries=7)
    frames = reader.wait_reaching(end)
    assert [len(f.commit_log_offsets) for f in frames] == [7, 7, 7, 7, 2]
    _as_scanned(svc, frames, include_keys=False)
    assert _delta(before)["scan"] == 0
    reader.cancel()


def test_the_byte_bound_cuts_where_the_scan_cuts(svc: Running) -> None:
    end = svc.append_ok(batch(0, 40, body_bytes=1000)).commit_log_offsets[-1] + 1
    reader = subscribe(svc, "bytes", max_batch_bytes=4096, include_keys=True)
    frames = reader.wait_reaching(end)
    assert len(frames) == 10  # 4 records of ~1.1 KB reach 4,096 bytes
    _as_scanned(svc, frames, include_keys=True)
    reader.cancel()


def test_appends_of_several_topics_and_flags_dispatch_every_entry_as_scanned(
    svc: Running,
) -> None:
    reader = subscribe(svc, "mixed", max_batch_entries=9, include_keys=True)
    hs = reader.handshake
    before = _sources()
    plain = pb.MessageBatch(topic="NoProps", queue_ids=[0, 1, 2], bodies=[b"x", b"y", b"z"])
    tagged_only = pb.MessageBatch(
        topic="TagsOnly",
        queue_ids=[5] * 4,
        bodies=[b"t"] * 4,
        properties=[encode_properties({"TAGS": f"T{i}"}) for i in range(4)],
        sys_flags=[0, 0, 0, 0],
    )
    svc.append_ok(batch(0, 5, topic="A"), plain, batch(5, 5, topic="B"), batch(10, 2, topic="A"))
    end = svc.append_ok(tagged_only, batch(20, 6)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(end)
    assert _entries(frames) == _scanned_entries(svc, hs.max_offset, end, include_keys=True)
    assert _delta(before)["scan"] == 0
    reader.cancel()


def test_an_append_with_a_refused_message_is_scanned_and_the_rest_still_held(
    svc: Running,
) -> None:
    reader = subscribe(svc, "gap", include_keys=True)
    hs = reader.handshake
    before = _sources()
    svc.append_ok(batch(0, 10))
    bad = batch(10, 3)
    # Refused by the engine's encoder (a refusal at the door, append_checks.py, never reaches
    # the engine: the rest is one run).
    bad.queue_ids[1] = 70_000
    response = svc.append(bad)
    assert list(response.statuses) == [pb.PUT_OK, pb.MESSAGE_ILLEGAL, pb.PUT_OK]
    end = svc.append_ok(batch(20, 10)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(end)
    assert _entries(frames) == _scanned_entries(svc, hs.max_offset, end, include_keys=True)
    assert len(_entries(frames)) == 22
    delta = _delta(before)
    assert delta["scan"] + delta["shared"] >= 1 and delta["appended"] >= 1
    reader.cancel()


def test_a_subscriber_behind_the_window_scans_then_comes_back_to_the_held_runs(
    start: Callable[..., Running],
) -> None:
    svc = start(dispatch_append_bytes=8192)  # a few runs of 40 entries
    end = 0
    for i in range(0, 800, 40):
        end = svc.append_ok(batch(i, 40)).commit_log_offsets[-1] + 1
    before = _sources()
    reader = subscribe(svc, "behind", include_keys=True)
    reader.wait_reaching(end)
    assert _delta(before)["scan"] >= 1
    before = _sources()
    more = svc.append_ok(batch(1000, 40)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(more)
    delta = _delta(before)
    assert delta["appended"] == 1 and delta["scan"] == 0
    _as_scanned(svc, frames, include_keys=True)
    assert len(_entries(frames)) == 840
    reader.cancel()


def test_rolling_into_a_new_segment_crosses_the_blank_and_returns_to_held_runs(
    svc: Running,
) -> None:
    reader = subscribe(svc, "roll", include_keys=True)
    hs = reader.handshake
    end = 0
    count = 0
    while end < FILE_BYTES + 4096:
        end = svc.append_ok(batch(count, 20, body_bytes=500)).commit_log_offsets[-1] + 1
        count += 20
    frames = reader.wait_reaching(end)
    assert _entries(frames) == _scanned_entries(svc, hs.max_offset, end, include_keys=True)
    assert len(_entries(frames)) == count
    reader.cancel()


def test_under_sync_flush_held_frames_go_out_once_durable(start: Callable[..., Running]) -> None:
    svc = start(flush="sync")
    reader = subscribe(svc, "sync", max_batch_entries=16, include_keys=True)
    hs = reader.handshake
    before = _sources()
    end = 0
    for i in range(0, 50, 10):
        end = svc.append_ok(batch(i, 10)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(end)
    assert all(f.next_offset <= svc.engine.flushed_offset for f in frames)
    assert _entries(frames) == _scanned_entries(svc, hs.max_offset, end, include_keys=True)
    assert _delta(before)["appended"] >= 1
    reader.cancel()


def test_with_the_window_off_every_frame_is_scanned(start: Callable[..., Running]) -> None:
    svc = start(dispatch_append_bytes=0)
    reader = subscribe(svc, "off")
    assert reader.handshake.max_offset == 0
    before = _sources()
    end = svc.append_ok(batch(0, 30)).commit_log_offsets[-1] + 1
    frames = reader.wait_reaching(end)
    _as_scanned(svc, frames, include_keys=False)
    assert _delta(before)["appended"] == 0
    reader.cancel()
