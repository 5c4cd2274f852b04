"""The short form of `make chaos REPLICAS=3` (docs/chaos.md "Broker groups"): a three-replica
group on a real etcd under sync replication, one cycle of each fault, checked as the long run
checks it; the same oracle catching the loss that acknowledging before replication causes; and
the pieces that decide what a run does (the seeded plan) and compares (the replicas' bytes)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from chaos.group_check import compare_replicas
from chaos.group_plan import FAULT_WEIGHTS, LEADER_FAULTS, PARTITION_FAULTS, GroupCycle
from chaos.group_plan import make_group_plan as plan_of
from chaos.group_run import run_group
from chaos.netns import unavailable
from chaos.run import ChaosConfig, main

SEED = 20_261_128


def test_a_group_seed_replays_and_draws_every_fault() -> None:
    plan = plan_of(SEED, 300, partitions=True)
    assert plan == plan_of(SEED, 300, partitions=True)
    assert plan != plan_of(SEED + 1, 300, partitions=True)
    assert {c.fault for c in plan.cycles} == set(FAULT_WEIGHTS)
    assert plan_of(SEED, 10, partitions=True).cycles == plan.cycles[:10]
    leader = [c for c in plan.cycles if c.leader_failure]
    assert len(leader) > len(plan.cycles) / 2  # most cycles fail the leader
    for c in plan.cycles:
        assert c.fault in LEADER_FAULTS or c.fault.startswith(("follower", "etcd"))
        if c.fault in ("leader-pause", "leader-cut"):
            assert c.hold_s > 2.0  # past the lease TTL
        if c.fault == "lone-leader-kill":
            assert 0 < c.hold_s < 1.0  # under the lag bound: the followers stay in the set
    # Without namespaces no cut is drawn, and every other cycle stays what it was.
    flat = plan_of(SEED, 300, partitions=False)
    assert not {c.fault for c in flat.cycles} & PARTITION_FAULTS
    for with_cuts, without in zip(plan.cycles, flat.cycles, strict=True):
        if with_cuts.fault not in PARTITION_FAULTS:
            assert with_cuts == without


def _segment(directory: Path, start: int, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{start:020d}").write_bytes(data)


def test_the_replicas_comparison_names_the_first_differing_offset(tmp_path: Path) -> None:
    size = 4096
    base = os.urandom(2 * size)
    dirs = {}
    for name in ("r0", "r1", "r2"):
        for start in (0, size):
            _segment(tmp_path / name / "commitlog", start, base[start : start + size])
        dirs[name] = str(tmp_path / name)
    assert compare_replicas(dirs, 0, 2 * size).mismatches == []
    assert compare_replicas(dirs, 0, 2 * size).bytes == 2 * size
    flipped = bytearray(base[size:])
    flipped[100] ^= 0xFF
    _segment(tmp_path / "r1" / "commitlog", size, bytes(flipped))
    found = compare_replicas(dirs, 0, 2 * size).mismatches
    assert len(found) == 1 and f"differ at offset {size + 100}" in found[0], found
    # Bytes past the range compared (a follower's tail past the commit offset) do not count.
    assert compare_replicas(dirs, 0, size + 100).mismatches == []
    (tmp_path / "r2" / "commitlog" / f"{size:020d}").unlink()
    found = compare_replicas(dirs, size, size + 10).mismatches
    assert any("r2 has no segment" in text for text in found), found


def test_replicas_run_sync_flush_only() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--replicas", "3", "--flush", "async"])
    assert exc.value.code == 2


def _cycle(index: int, fault: str, **kw: float) -> GroupCycle:
    return GroupCycle(index, fault, "acks", 0.0, 150, **kw)  # type: ignore[arg-type]


@pytest.mark.timeout(240)
def test_a_short_group_run_loses_nothing_through_one_fault_of_each_kind(tmp_path: Path) -> None:
    """One cycle of each fault (the cuts where network namespaces can be made): every
    acknowledged message read back, none twice, queues in order, cq_svc and index_svc equal to
    the leader's log, the replicas byte-identical up to the commit offset, and every leader
    failure followed by an acknowledgement in a newer epoch."""
    partitions = unavailable() is None
    cycles = [
        # Down past the lease TTL (2 s): another replica must take over. A leader restarted at
        # once may win its group back, which the long runs see and count as a failover too.
        _cycle(1, "leader-kill", down_s=3.0),
        _cycle(2, "follower-kill", victim=1),
        _cycle(3, "leader-pause", hold_s=2.3),
        _cycle(4, "etcd-restart"),
    ]
    if partitions:
        cycles += [
            _cycle(5, "leader-cut", hold_s=2.3),
            _cycle(6, "follower-cut", hold_s=1.2),
            _cycle(7, "lone-leader-kill", hold_s=0.5),
        ]
    plan = dataclasses.replace(plan_of(SEED, 1, partitions=partitions), cycles=tuple(cycles))
    config = ChaosConfig(
        seed=SEED,
        cycles=len(cycles),
        data_dir=tmp_path / "store",
        replicas=3,
        producers=3,
        rate_per_s=100,
        partitions=partitions,
    )
    lines: list[str] = []
    report = run_group(config, plan=plan, say=lines.append)
    output = "\n".join(lines)
    print(output)  # the figures, with -s
    g = report.group
    assert g is not None
    assert report.passed, output
    assert report.cycles_run == len(cycles)
    assert report.lost == 0 and report.duplicates == 0 and report.corrupt_reads == 0
    assert report.acknowledged >= 150 * len(cycles), output
    assert report.read_back == report.acknowledged
    assert report.log_records == report.acknowledged + report.unacked_stored
    # Every leader failure: a leader in a newer epoch, and an acknowledgement from it.
    leader_failures = sum(c.fault in LEADER_FAULTS for c in cycles)
    assert g.leader_failures == leader_failures and len(g.failovers) == leader_failures
    assert g.failovers_unobserved == 0
    assert all(f.new_leader != f.old_leader for f in g.failovers if f.fault == "leader-kill")
    # The replicas compared cycle by cycle, and whole at the end, up to the commit offset.
    assert g.full_compares >= 1 and g.replica_bytes > 0
    assert g.final_commit_offset > 0
    assert g.log_watch.records == report.log_records  # each record audited after its cycle
    assert g.log_watch.acks_checked == report.acknowledged
    assert len(g.tail_checks) == len(cycles)
    assert report.consumed == report.pulled == report.log_records
    assert report.redelivered == 0 and report.gaps == 0
    assert ("network namespaces" in output) == partitions
    assert "PASS" in lines
    assert not (tmp_path / "store").exists()


@pytest.mark.timeout(180)
@pytest.mark.skipif(unavailable() is not None, reason="needs network namespaces (root)")
def test_the_oracle_counts_what_acknowledging_before_replication_loses(tmp_path: Path) -> None:
    """The sabotage run: `--replication async` lets the leader acknowledge alone. Its followers
    cut off (0.6 s, still in the in-sync set) and then the leader killed, the acknowledgements
    of those 0.6 s are on no surviving replica: the new leader's log lacks them and the run
    must fail with them counted lost. (Under sync replication the same cycle loses nothing: the
    short run above has one.)"""
    plan = dataclasses.replace(
        plan_of(SEED, 1, partitions=True),
        # The old leader stays down until another leads: restarted at once, it may win again
        # with its own log, which holds what it acknowledged alone.
        cycles=(_cycle(1, "lone-leader-kill", hold_s=0.6, down_s=6.0),),
    )
    config = ChaosConfig(
        seed=SEED,
        cycles=1,
        data_dir=tmp_path / "store",
        replicas=3,
        producers=3,
        rate_per_s=100,
        replication="async",
    )
    lines: list[str] = []
    report = run_group(config, plan=plan, say=lines.append)
    output = "\n".join(lines)
    print(output)  # the figures, with -s
    assert not report.passed, output
    assert report.lost > 0, output
    assert report.duplicates == 0 and report.corrupt_reads == 0, output
    assert any(text.startswith("lost: ") or "log: producer" in text for text in report.problems)
    assert "FAIL" in output
