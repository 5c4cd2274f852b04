"""A follower replica copies the leader's log chunk by chunk (commitlog_svc/replica.py, issue 24
"Roles and replication"): the same bytes at the same offsets, the same tables and history, and
the roles' refusals. Real files, 4 KiB segments so that a test crosses many of them."""

from __future__ import annotations

import random
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import FlushMode
from commitlog_svc.replica_chunk import Chunk
from mqstore.errors import (
    NotFollower,
    NotLeader,
    OutOfRange,
    ReplicaOffsetMismatch,
    StaleEpoch,
    StoreIdMismatch,
)
from mqstore.formats.record import Blank, scan_run
from mqstore.history import Epoch, LogHistory
from tests.commitlog.message_in import as_batches
from tests.commitlog_svc.replica_support import (
    FILE_BYTES,
    QUIET,
    Producers,
    assert_same_log,
    close_all,
    config,
    copy,
    follower_of,
    leader,
    message,
    reopen,
    replica,
    segments,
)


def test_a_follower_copying_random_chunks_while_the_leader_appends_ends_byte_identical(
    tmp_path: Path,
) -> None:
    lead = leader(tmp_path / "leader")
    follower = follower_of(lead, tmp_path / "follower")
    producers = Producers(seed=24)
    done = threading.Event()

    def produce() -> None:
        try:
            for _ in range(300):
                producers.append(lead)
        finally:
            done.set()

    appender = threading.Thread(target=produce)
    appender.start()
    rng = random.Random(7)
    while not done.is_set():
        copy(lead, follower, rng=rng, chunks_max=rng.randrange(1, 6))
    appender.join()
    copy(lead, follower, rng=rng)
    assert len(segments(lead)) >= 10
    assert_same_log(lead, follower)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), sync=st.booleans())
def test_applying_the_leaders_chunks_gives_the_leaders_log(seed: int, sync: bool) -> None:
    """Seeded steps: appends of every kind (rolls included), copies of random chunk sizes,
    limited to the leader's flushed end or not, restarts of either replica (a restarted leader
    begins a new epoch when it leads again). At the end the follower holds the leader's log."""
    rng = random.Random(seed)
    flush = FlushMode.SYNC if sync else FlushMode.ASYNC
    with tempfile.TemporaryDirectory() as root:
        try:
            lead = leader(f"{root}/leader", flush=flush)
            follower = follower_of(lead, f"{root}/follower", flush=flush)
            producers = Producers(seed)
            for _ in range(rng.randrange(5, 40)):
                step = rng.random()
                if step < 0.55:
                    producers.append(lead)
                elif step < 0.8:
                    limit = lead.flushed_offset if rng.random() < 0.3 else None
                    chunk = lead.read_chunk(
                        follower.end_offset,
                        max_bytes=rng.choice([50, 500, 3000, 1 << 20]),
                        limit_offset=limit,
                    )
                    follower.append_replicated(chunk)
                elif step < 0.9:
                    lead.close()
                    lead = reopen(lead)
                    lead.become_leader(lead.history.last_epoch + 1)
                else:
                    follower.close()
                    follower = reopen(follower)
            copy(lead, follower, rng=rng)
            assert_same_log(lead, follower)
        finally:
            close_all()


def test_a_chunk_is_whole_records_within_its_bound_and_its_limit(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    rng = random.Random(11)
    boundaries = [0]
    for i in range(80):
        result = lead.append_batch(
            as_batches([message(rng, i + j) for j in range(rng.randrange(1, 4))])
        )
        boundaries.append(result.offsets[-1] + result.sizes[-1])
    offset = 0
    while offset < lead.max_offset:
        max_bytes = rng.choice([100, 400, 1000, 5000])
        limit = rng.choice([None, *[b for b in boundaries if b > offset][:3]])
        chunk = lead.read_chunk(offset, max_bytes=max_bytes, limit_offset=limit)
        data = chunk.data
        assert data, "there is data below the limit"
        assert data == lead.read(offset, len(data))
        end, count, stop = scan_run(data, 0, len(data), offset, check_crc=True)
        if isinstance(stop, Blank):  # the segment's blank, last, moves on to the next one
            assert end + 8 == len(data)
            assert chunk.next_offset == offset - offset % FILE_BYTES + FILE_BYTES
        else:
            assert end == len(data) and stop is None
            assert chunk.next_offset == offset + len(data)
        if limit is not None:
            assert offset + end <= limit
        assert len(data) <= max_bytes or count == 1
        offset = chunk.next_offset
    assert offset == lead.max_offset
    assert lead.read_chunk(offset).data == b""


def test_a_chunk_never_ends_inside_an_idempotent_request(tmp_path: Path) -> None:
    """A follower promoted with part of a request would store its retry's messages twice (the
    request is not in its producer table): the leader cuts chunks between requests, and takes
    a request longer than the bound whole."""
    lead = leader(tmp_path / "leader")
    rng = random.Random(5)
    requests = {}  # start -> end of each request
    for sequence in range(1, 30):
        batch = [
            message(rng, sequence * 100 + j, body_bytes=150) for j in range(rng.randrange(1, 9))
        ]
        result = lead.append_batch(as_batches(batch), producer=("p", sequence))
        assert result.ok
        requests[result.offsets[0]] = result.offsets[-1] + result.sizes[-1]
    ends = {0, *requests, *requests.values()}
    offset = 0
    longer = 0
    while offset < lead.max_offset:
        max_bytes = rng.choice([300, 700, 1500])
        chunk = lead.read_chunk(offset, max_bytes=max_bytes)
        assert chunk.data
        records_end = offset + len(chunk.data)
        if chunk.next_offset != records_end:  # ends with the blank
            records_end -= 8
        assert records_end in ends, f"a chunk [{offset}, {records_end}) ends inside a request"
        if len(chunk.data) > max_bytes:  # only ever one request, whole
            assert requests[offset] == records_end
            longer += 1
        offset = chunk.next_offset
    assert longer > 0


def test_the_end_of_segment_blank_moves_the_follower_to_the_next_segment(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    follower = follower_of(lead, tmp_path / "follower")
    rng = random.Random(1)
    records_end = 0
    while lead.max_offset < FILE_BYTES:
        result = lead.append_batch(as_batches([message(rng, 0, body_bytes=500)]))
        if result.offsets[0] < FILE_BYTES:
            records_end = result.offsets[0] + result.sizes[0]
    # A bound that holds the first segment's records but not its blank.
    follower.append_replicated(lead.read_chunk(0, max_bytes=records_end))
    assert follower.end_offset == records_end < FILE_BYTES
    chunk = lead.read_chunk(records_end)
    assert len(chunk.data) == 8 and chunk.next_offset == FILE_BYTES
    assert follower.append_replicated(chunk) == FILE_BYTES
    # With room for it, the blank comes with the records.
    assert lead.read_chunk(0).next_offset == FILE_BYTES
    copy(lead, follower)
    assert_same_log(lead, follower)


def test_a_promoted_follower_answers_a_retried_request_as_a_duplicate(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    follower = follower_of(lead, tmp_path / "follower")
    rng = random.Random(2)
    batch = [message(rng, j) for j in range(4)]
    first = lead.append_batch(as_batches(batch), producer=("checkout-1", 41))
    assert first.ok and not first.duplicate
    for i in range(20):
        lead.append_batch(as_batches([message(rng, 100 + i)]))
    copy(lead, follower, max_bytes=700)
    lead.close()
    assert follower.become_leader(2) == follower.end_offset
    retry = follower.append_batch(as_batches(batch), producer=("checkout-1", 41))
    assert retry.duplicate
    assert retry.offsets == first.offsets and retry.queue_offsets == first.queue_offsets
    assert follower.max_offset == follower.end_offset  # nothing stored twice
    # After a restart too: the table is in the follower's checkpoint and records.
    follower.close()
    again = reopen(follower)
    again.become_leader(3)
    assert again.append_batch(as_batches(batch), producer=("checkout-1", 41)).duplicate


def test_a_follower_refuses_producers_appends_naming_the_leader(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    follower = follower_of(lead, tmp_path / "follower")
    rng = random.Random(3)
    with pytest.raises(NotLeader, match="not known here yet"):
        follower.append_batch(as_batches([message(rng, 0)]))
    follower.become_follower("broker-a:7100")
    with pytest.raises(NotLeader, match="broker-a:7100") as refused:
        follower.append_batch(as_batches([message(rng, 1)]), producer=("p", 1))
    assert refused.value.leader == "broker-a:7100"
    assert follower.end_offset == 0
    # A leader that steps down refuses them too, from then on.
    assert lead.append_batch(as_batches([message(rng, 2)])).ok
    lead.become_follower("broker-b:7100")
    with pytest.raises(NotLeader):
        lead.append_batch(as_batches([message(rng, 3)]))


def test_a_leader_refuses_replicated_bytes(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    other = leader(tmp_path / "other")
    other.append_batch(as_batches([message(random.Random(4), 0)]))
    with pytest.raises(NotFollower):
        lead.append_replicated(other.read_chunk(0))
    with pytest.raises(NotFollower):
        lead.truncate(0)
    assert lead.end_offset == 0


def test_replicated_bytes_start_exactly_at_the_followers_end(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader")
    follower = follower_of(lead, tmp_path / "follower")
    rng = random.Random(5)
    for i in range(5):
        lead.append_batch(as_batches([message(rng, i, body_bytes=100)]))
    copy(lead, follower, max_bytes=300, chunks_max=1)
    at = follower.end_offset
    ahead = lead.read_chunk(at, max_bytes=300)
    beyond = lead.read_chunk(ahead.next_offset, max_bytes=300)
    with pytest.raises(ReplicaOffsetMismatch) as refused:
        follower.append_replicated(beyond)
    assert (refused.value.offset, refused.value.end_offset) == (beyond.offset, at)
    with pytest.raises(ReplicaOffsetMismatch):
        follower.append_replicated(Chunk(0, b"", 0, ()))
    assert follower.end_offset == at
    copy(lead, follower)
    assert_same_log(lead, follower)


def test_a_replica_opens_without_beginning_an_epoch(tmp_path: Path) -> None:
    """A follower's epochs are its leader's; a single-replica store begins one at every open."""
    lead = leader(tmp_path / "leader", epoch=4)
    lead.append_batch(as_batches([message(random.Random(6), 0)]))
    follower = follower_of(lead, tmp_path / "follower")
    copy(lead, follower)
    assert follower.history == LogHistory([(4, 0)])
    follower.close()
    again = reopen(follower)
    assert again.history == LogHistory([(4, 0)]) and not again.leads
    single = CommitLog(config(tmp_path / "single"))
    single.open()
    single.close()
    single = CommitLog(config(tmp_path / "single"))
    single.open()
    assert single.history.last_epoch == 2
    single.close()


def test_a_promoted_replica_begins_the_given_epoch_at_its_end(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader", epoch=3)
    for i in range(10):
        lead.append_batch(as_batches([message(random.Random(i), i)]))
    follower = follower_of(lead, tmp_path / "follower")
    copy(lead, follower)
    end = follower.end_offset
    with pytest.raises(StaleEpoch):
        follower.become_leader(3)
    assert follower.become_leader(7) == end
    assert follower.history == LogHistory([(3, 0), (7, end)])
    follower.close()
    again = reopen(follower)
    assert again.history == LogHistory([(3, 0), (7, end)])  # durable
    assert not again.leads  # a replica opens as a follower
    # The old leader, now a follower, adopts the new epoch even with nothing new to copy.
    lead.become_follower()
    again.become_leader(8)
    copy(again, lead)
    assert lead.history == again.history == LogHistory([(3, 0), (8, end)])


def test_an_empty_replica_adopts_the_groups_store_id_and_a_full_one_is_refused(
    tmp_path: Path,
) -> None:
    lead = leader(tmp_path / "leader")
    follower = replica(tmp_path / "follower")
    assert follower.store_id != lead.store_id
    follower.adopt_store_id(lead.store_id)
    assert follower.store_id == lead.store_id
    follower.close()
    assert reopen(follower).store_id == lead.store_id  # durable
    stranger = leader(tmp_path / "stranger")
    stranger.append_batch(as_batches([message(random.Random(8), 0)]))
    stranger.become_follower()
    with pytest.raises(StoreIdMismatch, match="holds"):
        stranger.adopt_store_id(lead.store_id)
    assert stranger.store_id != lead.store_id


def test_wait_durable_returns_once_the_followers_own_flush_covers_the_bytes(
    tmp_path: Path,
) -> None:
    lead = leader(tmp_path / "leader")
    for i in range(30):
        lead.append_batch(as_batches([message(random.Random(i), i)]))
    synced = follower_of(lead, tmp_path / "sync", flush=FlushMode.SYNC)
    copy(lead, synced)
    assert synced.wait_durable(synced.end_offset, 20.0) == synced.end_offset
    lazy = follower_of(lead, tmp_path / "lazy", **QUIET)
    copy(lead, lazy)
    assert lazy.wait_durable(lazy.end_offset, 0.05) < lazy.end_offset  # its interval: never
    assert lazy.durable_offset < lazy.end_offset
    assert lazy._flusher is not None
    lazy._flusher.flush_now()
    assert lazy.wait_durable(lazy.end_offset, 0.05) == lazy.end_offset


def test_a_new_follower_starts_at_the_leaders_first_segment(tmp_path: Path) -> None:
    """A leader whose first segments expired: a new replica begins at its first segment with
    its tables, and once it holds what the leader held then, their tables are equal."""
    lead = leader(tmp_path / "leader")
    producers = Producers(seed=9)
    while lead.max_offset < 6 * FILE_BYTES:
        producers.append(lead)
    deleted = lead.queue.delete_expired_file_by_time(
        expired_before_ms=0,
        floor_offset=3 * FILE_BYTES,
        clean_immediately=True,
        max_files=3,
    )
    assert deleted == 3 and lead.min_offset == 3 * FILE_BYTES
    follower = follower_of(lead, tmp_path / "follower")
    with pytest.raises(OutOfRange, match="first segment"):
        lead.read_chunk(follower.end_offset)
    follower.start_at(lead.log_start())
    assert follower.end_offset == follower.min_offset == 3 * FILE_BYTES
    for _ in range(20):
        producers.append(lead)
        copy(lead, follower, max_bytes=900, chunks_max=2)
    copy(lead, follower)
    assert_same_log(lead, follower)


def test_a_chunk_carries_the_epochs_that_cover_it(tmp_path: Path) -> None:
    lead = leader(tmp_path / "leader", epoch=2)
    rng = random.Random(12)
    for i in range(5):
        lead.append_batch(as_batches([message(rng, i, body_bytes=200)]))
    middle = lead.end_offset
    lead.become_leader(5)
    for i in range(5):
        lead.append_batch(as_batches([message(rng, i, body_bytes=200)]))
    assert lead.end_offset < FILE_BYTES  # one segment: one chunk holds it all
    assert lead.read_chunk(0).epochs == (Epoch(2, 0), Epoch(5, middle))
    assert lead.read_chunk(0, limit_offset=middle).epochs == (Epoch(2, 0), Epoch(5, middle))
    assert lead.read_chunk(middle).epochs == (Epoch(5, middle),)
    assert lead.read_chunk(lead.end_offset).epochs == (Epoch(5, middle),)
