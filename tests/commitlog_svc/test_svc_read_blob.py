"""Read's answer: the records served laid end to end in records_blob, each range's size there
in record_sizes (0 where not served), and each range's status.

For any request, the answer is the answers of each range read on its own, joined (ranges that
follow each other are read as one run), and the CRC-mismatch metric counts the same damaged
records. Real service (support.Running) on real files, 64 KiB segments: runs cross segment
boundaries, the first segment is expired away (offsets below the minimum), a few records are
damaged on disk.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog_svc import metrics
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from tests.commitlog_svc.support import (
    FILE_BYTES,
    RPC_TIMEOUT_S,
    Running,
    batch,
    damage_body,
    parse,
    rpc_error,
)


def crc_mismatches() -> float:
    return float(metrics.CRC_MISMATCHES.labels("read")._value.get())


def as_each_alone(svc: Running, offsets: list[int], sizes: list[int]) -> None:
    """Asserts that one Read answers (offsets, sizes) as a Read of each range alone does."""
    before = crc_mismatches()
    alone = [
        svc.stub.Read(pb.ReadRequest(offsets=[o], sizes=[z]), timeout=RPC_TIMEOUT_S)
        for o, z in zip(offsets, sizes, strict=True)
    ]
    between = crc_mismatches()
    read = svc.stub.Read(pb.ReadRequest(offsets=offsets, sizes=sizes), timeout=RPC_TIMEOUT_S)
    after = crc_mismatches()
    assert len(read.statuses) == len(offsets)
    assert list(read.statuses) == [a.statuses[0] for a in alone]
    assert list(read.record_sizes) == [a.record_sizes[0] for a in alone]
    assert read.records_blob == b"".join(a.records_blob for a in alone)
    assert after - between == between - before


@pytest.fixture
def log_with_damage(start: Callable[..., Running]) -> tuple[Running, list[int], list[int]]:
    """A service whose log spans four segments from 1 (segment 0 expired), records of four
    sizes, three damaged; with the offsets and sizes of every record appended."""
    svc = start(file_reserved_hours=0.0, delete_when_hours=list(range(24)))
    offsets: list[int] = []
    sizes: list[int] = []
    for k, body_bytes in enumerate([1, 100, 700, 40] * 4):
        stored = svc.append_ok(batch(60 * k, 60, body_bytes=body_bytes))
        offsets += stored.commit_log_offsets
        sizes += stored.sizes
        if k == 3:  # past the end of segment 0: expire it
            assert svc.engine.clean_expired(manual=True).deleted_files == 1
    assert svc.engine.min_offset == FILE_BYTES and svc.engine.max_offset > 4 * FILE_BYTES
    for i in (300, 301, 550):  # bodies of 100 bytes
        damage_body(svc.data_dir, offsets[i])
    return svc, offsets, sizes


def test_a_read_answers_any_mix_of_ranges_as_each_range_alone(
    log_with_damage: tuple[Running, list[int], list[int]],
) -> None:
    svc, offsets, sizes = log_with_damage
    n = len(offsets)
    end = svc.engine.max_offset
    index = st.integers(0, n - 1)

    def run(i: int, length: int) -> list[tuple[int, int]]:
        return list(zip(offsets[i : i + length], sizes[i : i + length], strict=True))

    piece = st.one_of(
        st.builds(run, index, st.integers(1, 80)),  # neighbours, across segment ends too
        st.builds(run, st.integers(280, 302), st.integers(1, 30)),  # around the damaged ones
        st.builds(lambda i: [(offsets[i], 0)], index),  # the whole record there
        st.builds(lambda i, d: [(offsets[i] + d, 0)], index, st.integers(1, 50)),
        st.builds(lambda i, d: [(offsets[i] + d, sizes[i])], index, st.integers(1, 50)),
        st.builds(lambda i, d: [(offsets[i], sizes[i] + d)], index, st.integers(-50, 50)),
        st.builds(lambda i: [(offsets[i], sizes[i])], st.integers(0, 100)),  # some expired
        st.builds(lambda d: [(end + d, 100)], st.integers(0, FILE_BYTES)),  # not written yet
    )

    @settings(max_examples=60, deadline=None)
    @given(st.lists(piece, max_size=10))
    def check(pieces: list[list[tuple[int, int]]]) -> None:
        ranges = [r for p in pieces for r in p]
        as_each_alone(svc, [o for o, _ in ranges], [z for _, z in ranges])

    check()


def test_a_read_of_every_record_serves_all_but_the_damaged_in_one_blob(
    log_with_damage: tuple[Running, list[int], list[int]],
) -> None:
    svc, offsets, sizes = log_with_damage
    read = svc.stub.Read(pb.ReadRequest(offsets=offsets, sizes=sizes), timeout=RPC_TIMEOUT_S)
    expired = [o < FILE_BYTES for o in offsets]
    damaged = {300, 301, 550}
    assert list(read.statuses) == [
        pb.READ_OUT_OF_RANGE if expired[i] else pb.READ_CORRUPT if i in damaged else pb.READ_OK
        for i in range(len(offsets))
    ]
    served = [0 if expired[i] or i in damaged else sizes[i] for i in range(len(offsets))]
    assert list(read.record_sizes) == served
    assert len(read.records_blob) == sum(served)
    at = 0
    for i, size in enumerate(served):
        if size:
            assert parse(read.records_blob[at : at + size]).physical_offset == offsets[i]
            at += size
    as_each_alone(svc, offsets, sizes)


def test_an_empty_read_is_an_empty_answer(svc: Running) -> None:
    read = svc.stub.Read(pb.ReadRequest(), timeout=RPC_TIMEOUT_S)
    assert (read.records_blob, list(read.record_sizes), list(read.statuses)) == (b"", [], [])


@pytest.mark.parametrize("whole", [False, True], ids=["sized", "size-0"])
def test_a_read_past_the_answer_limit_is_resource_exhausted(
    start: Callable[..., Running], whole: bool
) -> None:
    """The limit counts the sizes asked for, or for size 0 the size of each whole record
    read, plus the per-record overhead; the largest that fits is served."""
    svc = start(max_message_bytes=1 << 20)
    stored = svc.append_ok(batch(0, 1, body_bytes=10_000))
    offset, size = stored.commit_log_offsets[0], stored.sizes[0]
    fits = (1 << 20) // (size + 8)

    def read(count: int) -> pb.ReadResponse:
        response: pb.ReadResponse = svc.stub.Read(
            pb.ReadRequest(
                offsets=[offset] * count,
                sizes=[0 if whole else size] * count,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        return response

    code, message, _ = rpc_error(lambda: read(fits + 1))
    # The service's refusal, not the channel's message size limit (also RESOURCE_EXHAUSTED).
    assert (code, "answer limit" in message) == (grpc.StatusCode.RESOURCE_EXHAUSTED, True), message
    ok = read(fits)
    assert set(ok.statuses) == {pb.READ_OK}
    assert list(ok.record_sizes) == [size] * fits
    assert len(ok.records_blob) == size * fits
