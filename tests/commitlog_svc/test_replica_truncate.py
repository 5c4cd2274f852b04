"""A follower's truncation to the agreed offset, and crashes of a follower (issue 24): a
diverged follower cuts its tail and then copies to byte-identity; a kill -9 or a power loss at
any step of a truncation leaves a log recovery opens at the cut or at the old end; one in the
middle of a copy leaves a prefix of the leader's log, with the tables and history of that
prefix. Leaders on real files, crashed followers on the simulated disk (mqstore/storage/
simdisk.py) with named crash points (failpoints.py), as the commit log's own crash tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replica_chunk import LogStart
from mqstore.errors import InvalidArgument
from mqstore.formats import sysflag
from mqstore.history import LogHistory
from mqstore.storage import failpoints
from mqstore.storage.simdisk import CrashMode, SimDisk
from tests.commitlog.commitlog_testlib import kill
from tests.commitlog.commitlog_testlib import sim_crash as power_loss
from tests.commitlog.message_in import MessageIn, as_batches
from tests.commitlog_svc.replica_support import (
    FILE_BYTES,
    QUIET,
    Producers,
    assert_same_log,
    copy,
    follower_of,
    leader,
    message,
    producers_of,
    reopen,
    segments,
)

MODES: list[CrashMode] = ["drop", "keep", "random"]
# The truncation's crash points, in order, and where recovery must open after each.
CUT_POINTS = [
    ("replica.truncate.before_checkpoint", "old end"),
    ("replica.truncate.after_checkpoint", "old end"),
    ("replica.truncate.after_zero", "cut"),
    ("replica.truncate.after_segments", "cut"),
    ("replica.truncate.after_history", "cut"),
]


def rebuilt_queue_table(log: ReplicaLog) -> dict[tuple[str, int], int]:
    """Each queue's next offset as the records on disk say (what the table must be)."""
    table: dict[tuple[str, int], int] = {}
    offset = log.min_offset
    while offset < log.max_offset:
        batch = log.scan(offset, end_offset=log.max_offset, max_records=10_000)
        assert not batch.corrupt
        for r in batch.records:
            if sysflag.gets_queue_offset(r.sys_flag):
                key = (r.topic, r.queue_id)
                table[key] = max(table.get(key, 0), r.queue_offset + 1)
        offset = batch.next_offset
    return table


def diverge(
    old: ReplicaLog, new_dir: Path, seed: int, *, old_epoch_at_parting: bool = False
) -> tuple[ReplicaLog, int, Producers]:
    """`old` leads epoch 1; a follower copies its log and becomes the leader of epoch 2;
    `old` writes a tail no one copies, under epoch 1, or (`old_epoch_at_parting`) under
    epoch 3 it began where the follower had stopped, after which the follower leads again in
    epoch 4; `old` steps down. Returns the new leader and the offset where the logs part."""
    producers = Producers(seed)
    for _ in range(40):
        producers.append(old)
    new = follower_of(old, new_dir)
    copy(old, new, rng=random.Random(seed))
    parted = new.end_offset
    new.become_leader(2)
    if old_epoch_at_parting:
        for _ in range(5):
            producers.append(new)
        old.become_leader(3)
    for _ in range(25):  # the old leader's tail: never copied
        producers.append(old)
    if old_epoch_at_parting:
        new.become_leader(4)
    for _ in range(30):  # the same producers, retrying and going on, at the new leader
        producers.append(new)
    old.become_follower("new")
    return new, parted, producers


@pytest.mark.parametrize("old_epoch_at_parting", [False, True])
def test_a_diverged_follower_truncates_to_the_agreed_offset_then_copies_to_identity(
    tmp_path: Path, old_epoch_at_parting: bool
) -> None:
    old = leader(tmp_path / "old")
    new, parted, _ = diverge(
        old, tmp_path / "new", seed=1, old_epoch_at_parting=old_epoch_at_parting
    )
    assert old.end_offset > parted and new.end_offset > parted
    agreed = new.agreed_offset(old.history, old.end_offset)
    assert agreed == parted
    assert old.truncate(agreed) == parted == old.end_offset
    assert old.history == LogHistory([(1, 0)])
    assert old.queue_offsets() == rebuilt_queue_table(old)
    copy(new, old, rng=random.Random(2))
    assert_same_log(new, old)
    assert old.history == new.history
    assert old.history.epoch_at(parted) == 2


def test_the_producer_table_after_a_cut_is_the_one_of_the_log_below_it(tmp_path: Path) -> None:
    """Requests cut away are forgotten and each producer's older requests below the cut are
    remembered again, as many as the table keeps: a retry of one is still a duplicate."""
    old = leader(tmp_path / "old", producer_requests_max=3)
    rng = random.Random(4)
    below = []
    for sequence in range(1, 9):
        below.append(
            old.append_batch(as_batches([message_for(rng, sequence)]), producer=("p", sequence))
        )
    cut = old.end_offset
    for sequence in range(9, 14):  # past the cut: they push 6, 7, 8 out of the window
        old.append_batch(as_batches([message_for(rng, sequence)]), producer=("p", sequence))
    assert [r.sequence for r in producers_of(old)["p"][1]] == [11, 12, 13]
    old.become_follower()
    old.truncate(cut)
    last, requests = producers_of(old)["p"]
    assert last == 8 and [r.sequence for r in requests] == [6, 7, 8]
    old.become_leader(2)
    retry = old.append_batch(as_batches([message_for(rng, 7)]), producer=("p", 7))
    assert retry.duplicate and retry.offsets == below[6].offsets


def message_for(rng: random.Random, i: int) -> MessageIn:
    return message(rng, i, body_bytes=50)


def test_a_cut_inside_a_record_is_refused(tmp_path: Path) -> None:
    old = leader(tmp_path / "old")
    result = old.append_batch(as_batches([message_for(random.Random(1), i) for i in range(3)]))
    old.become_follower()
    with pytest.raises(InvalidArgument, match="record boundary"):
        old.truncate(result.offsets[1] + 5)
    assert old.end_offset == result.offsets[-1] + result.sizes[-1]


def test_a_cut_at_or_below_the_first_segment_leaves_the_log_empty_there(tmp_path: Path) -> None:
    old = leader(tmp_path / "old")
    producers = Producers(5)
    while old.end_offset < 3 * FILE_BYTES:
        producers.append(old)
    old.become_follower()
    assert old.truncate(0) == 0
    assert old.end_offset == old.min_offset == 0
    assert old.queue_offsets() == {} and producers_of(old) == {}
    assert old.history == LogHistory()
    assert list(segments(old)) == ["00000000000000000000"]


@pytest.mark.parametrize(("point", "expected"), CUT_POINTS)
@pytest.mark.parametrize("mode", MODES)
def test_a_crash_at_any_step_of_a_truncation_opens_at_the_cut_or_the_old_end(
    tmp_path: Path, point: str, expected: str, mode: CrashMode
) -> None:
    """The old leader's diverged tail began an epoch of its own where the logs part: after a
    crash that kept it with the bytes cut, the next handshake's truncation drops it."""
    disk = SimDisk()
    old = leader("/old", disk=disk, **QUIET)
    new, parted, _ = diverge(old, tmp_path / "new", seed=3, old_epoch_at_parting=True)
    old_end = old.end_offset
    before = segments(old)
    old._checkpoint()  # the checkpoint vouches for the whole tail: F > the cut
    with failpoints.armed(point), pytest.raises(failpoints.SimulatedCrash):
        old.truncate(parted)
    power_loss(old, disk, random.Random(hash(point) % 1000), mode)
    again = reopen(old, disk=disk)
    assert again.end_offset == (parted if expected == "cut" else old_end)
    end = again.end_offset
    after = segments(again)
    for name, data in after.items():  # what is left is the old log up to its end, then zeros
        start = int(name)
        keep = max(0, min(FILE_BYTES, end - start))
        assert data[:keep] == before[name][:keep], f"segment {name} changed below the end"
        assert data[keep:] == bytes(FILE_BYTES - keep), f"segment {name} holds bytes past the end"
    assert max(map(int, after)) <= end
    assert again.queue_offsets() == rebuilt_queue_table(again)
    assert all(start <= end for start in again.history.starts)
    # The handshake again, and a copy: the new leader's log, byte for byte.
    again.truncate(new.agreed_offset(again.history, again.end_offset))
    copy(new, again, rng=random.Random(6))
    assert_same_log(new, again)


def prefix_reference(lead: ReplicaLog, directory: Path, end: int) -> ReplicaLog:
    """A follower that copied exactly [0, end) of the leader's log, cleanly."""
    ref = follower_of(lead, directory)
    while ref.end_offset < end:
        ref.append_replicated(lead.read_chunk(ref.end_offset, limit_offset=end))
    ref.append_replicated(lead.read_chunk(end, limit_offset=end))  # epochs beginning there
    return ref


def copy_with_crash(lead: ReplicaLog, follower: ReplicaLog, rng: random.Random, chunks: int) -> int:
    """Copy `chunks` chunks of random sizes, flushing and checkpointing at random moments;
    returns the end the follower reached."""
    assert follower._flusher is not None
    for i in range(chunks):
        chunk = lead.read_chunk(follower.end_offset, max_bytes=rng.choice([200, 900, 5000]))
        follower.append_replicated(chunk)
        if i < chunks - 2 and rng.random() < 0.3:  # the last two stay in memory only
            follower._flusher.flush_now()
        if i < chunks - 2 and rng.random() < 0.15:
            follower._checkpoint()
    return follower.end_offset


def leader_with_epochs(directory: Path, seed: int) -> ReplicaLog:
    lead = leader(directory)
    producers = Producers(seed)
    for epoch in (2, 3):
        for _ in range(12):
            producers.append(lead)
        lead.become_leader(epoch)
    for _ in range(40):
        producers.append(lead)
    return lead


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(3))
def test_a_power_loss_mid_copy_leaves_a_prefix_of_the_leaders_log(
    tmp_path: Path, mode: CrashMode, seed: int
) -> None:
    lead = leader_with_epochs(tmp_path / "leader", seed)
    disk = SimDisk()
    follower = follower_of(lead, "/follower", disk=disk, **QUIET)
    rng = random.Random(seed)
    reached = copy_with_crash(lead, follower, rng, rng.randrange(5, 25))
    power_loss(follower, disk, rng, mode)
    again = reopen(follower, disk=disk)
    end = again.end_offset
    assert end <= reached
    assert end == again.max_offset
    mine, theirs = segments(lead), segments(again)
    for name, data in theirs.items():
        keep = max(0, min(FILE_BYTES, end - int(name)))
        assert data[:keep] == mine[name][:keep], f"segment {name} is not the leader's"
    ref = prefix_reference(lead, tmp_path / "reference", end)
    assert again.queue_offsets() == ref.queue_offsets()
    assert producers_of(again) == producers_of(ref)
    assert again.history == ref.history
    copy(lead, again, rng=rng)
    assert_same_log(lead, again)


def test_a_follower_killed_mid_copy_recovers_what_it_wrote(tmp_path: Path) -> None:
    """kill -9: the page cache keeps what the follower wrote, so recovery keeps all of it."""
    lead = leader_with_epochs(tmp_path / "leader", seed=8)
    follower = follower_of(lead, tmp_path / "follower", **QUIET)
    reached = copy_with_crash(lead, follower, random.Random(8), 12)
    kill(follower)
    again = reopen(follower)
    assert again.end_offset == reached
    ref = prefix_reference(lead, tmp_path / "reference", reached)
    assert again.queue_offsets() == ref.queue_offsets()
    assert producers_of(again) == producers_of(ref)
    assert again.history == ref.history
    copy(lead, again)
    assert_same_log(lead, again)


@pytest.mark.parametrize("point", ["replica.start.after_delete", "replica.start.after_checkpoint"])
def test_a_crash_while_starting_afresh_leaves_an_empty_log(tmp_path: Path, point: str) -> None:
    lead = leader(tmp_path / "leader")
    producers = Producers(9)
    while lead.max_offset < 4 * FILE_BYTES:
        producers.append(lead)
    lead.queue.delete_expired_file_by_time(
        expired_before_ms=0, floor_offset=2 * FILE_BYTES, clean_immediately=True, max_files=2
    )
    disk = SimDisk()
    follower = follower_of(lead, "/follower", disk=disk)
    start = lead.log_start()
    with failpoints.armed(point), pytest.raises(failpoints.SimulatedCrash):
        follower.start_at(start)
    power_loss(follower, disk, random.Random(1), "random")
    again = reopen(follower, disk=disk)
    assert again.end_offset == again.min_offset
    again.start_at(LogStart(start.offset, start.taken_at, start.queue_offsets, start.producers))
    copy(lead, again)
    assert_same_log(lead, again)
