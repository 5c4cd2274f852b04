"""Dispatch frames scanned once for subscribers in step (commitlog_svc/frame_cache.py): a
consume-queue subscriber (no keys) and an index subscriber (keys) following the same log get
the frames a scan of their own would give them, while each range is scanned once. Frames of
the newest appends come from memory instead (test_svc_append_frames.py), so these tests turn
that off to reach the scans."""

from __future__ import annotations

from collections.abc import Callable

from commitlog_svc.dispatch_scan import DispatchScan, scan_dispatch
from commitlog_svc.frame_cache import FrameCache
from mqstore.formats._core import dispatch_tail
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog_svc.support import Running, batch, subscribe


def _own_scans(svc: Running, batches: list[pb.DispatchBatch], include_keys: bool) -> None:
    """Each received frame equals a fresh scan of its range with the subscriber's options."""
    for got in batches:
        fresh = scan_dispatch(
            svc.engine,
            got.start_offset,
            max_records=len(got.commit_log_offsets),
            max_bytes=1 << 30,
            include_keys=include_keys,
        )
        assert fresh.next_offset == got.next_offset
        assert pb.SubscribeResponse.FromString(fresh.wire(include_keys)).batch == got


def test_subscribers_in_step_get_their_own_frames_from_one_scan_per_range(
    start: Callable[..., Running],
) -> None:
    svc = start(dispatch_append_bytes=0)
    cache: FrameCache = svc.service.servicer._frames  # type: ignore[union-attr]
    end = 0
    for i in range(0, 200, 20):
        end = svc.append_ok(batch(i, 20)).commit_log_offsets[-1] + 1
    cq = subscribe(svc, "cq", max_batch_entries=50)
    cq_batches = cq.wait_reaching(end)  # first, so that which one scans is known
    index = subscribe(svc, "index", max_batch_entries=50, include_keys=True)
    index_batches = index.wait_reaching(end)
    assert all(not b.keys and not b.uniq_keys for b in cq_batches)
    assert all(len(b.keys) == len(b.commit_log_offsets) for b in index_batches)
    assert [b.start_offset for b in cq_batches] == [b.start_offset for b in index_batches]
    _own_scans(svc, cq_batches, include_keys=False)
    _own_scans(svc, index_batches, include_keys=True)
    assert cache.scans == len(cq_batches) and cache.hits == len(index_batches)
    cq.cancel()
    index.cancel()


def test_frames_are_shared_only_for_the_same_bounds(start: Callable[..., Running]) -> None:
    svc = start(dispatch_append_bytes=0)
    cache: FrameCache = svc.service.servicer._frames  # type: ignore[union-attr]
    end = svc.append_ok(batch(0, 30)).commit_log_offsets[-1] + 1
    small = subscribe(svc, "small", max_batch_entries=10)
    large = subscribe(svc, "large", max_batch_entries=30)
    assert len(small.wait_reaching(end)) == 3
    assert len(large.wait_reaching(end)) == 1
    assert cache.hits == 0 and cache.scans == 4
    small.cancel()
    large.cancel()


def test_with_sharing_off_each_subscriber_scans_for_itself(start: Callable[..., Running]) -> None:
    svc = start(dispatch_share_bytes=0, dispatch_append_bytes=0)
    end = svc.append_ok(batch(0, 30)).commit_log_offsets[-1] + 1
    cq = subscribe(svc, "cq")
    index = subscribe(svc, "index", include_keys=True)
    cq_batches, index_batches = cq.wait_reaching(end), index.wait_reaching(end)
    _own_scans(svc, cq_batches, include_keys=False)
    _own_scans(svc, index_batches, include_keys=True)
    cache: FrameCache = svc.service.servicer._frames  # type: ignore[union-attr]
    assert cache.hits == 0
    cq.cancel()
    index.cancel()


def test_the_cache_counts_the_wire_bytes_it_holds_and_forgets_the_oldest() -> None:
    """A cached frame costs its pieces' bytes; one subscriber gets it with the keys piece, the
    other without, both as SubscribeResponse wire bytes."""
    cache = FrameCache(bytes_max=100)

    def scan_at(start: int) -> Callable[[bool], DispatchScan]:
        tail = dispatch_tail(start, start + 1, ["t"], [], [])
        keys = pb.DispatchBatch(keys=["k" * 20], uniq_keys=["u"]).SerializeToString()
        return lambda include_keys: DispatchScan((tail,), (keys,), start + 1, 1, [])

    with_keys = cache.frame(0, 10, 1 << 20, True, scan_at(0))
    without = cache.frame(0, 10, 1 << 20, False, scan_at(0))
    assert with_keys is not None and without is not None and cache.hits == 1
    got = pb.SubscribeResponse.FromString(with_keys.wire).batch
    assert list(got.keys) == ["k" * 20] and got.next_offset == with_keys.next_offset == 1
    assert pb.SubscribeResponse.FromString(without.wire).batch == pb.DispatchBatch(
        start_offset=0, next_offset=1, topics=["t"]
    )
    one = scan_at(0)(True).nbytes
    assert cache._bytes == one == len(with_keys.wire) - 2  # the batch's key and length
    for start in range(1, 100 // one + 2):
        cache.frame(start, 10, 1 << 20, False, scan_at(start))
    assert cache._bytes <= 100 and cache.frame(0, 10, 1 << 20, True, scan_at(0)) is not None
    assert cache.scans == 100 // one + 3  # the first frame was forgotten: scanned again
