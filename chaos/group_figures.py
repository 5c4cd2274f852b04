"""What a replicated chaos run measured: faults, failover times, pauses, per-cycle checks.

Failover time (issue 24's definition): from the fault (the kill -9 sent, the SIGSTOP sent, the
link cut) to the first acknowledgement of an append in a newer epoch than the failed leader's,
as the SDK producer's callback received it. A newer epoch's records all lie at or past its
start offset, and every record an older leader acknowledged lies below it (the new leader held
each of them), so "an acknowledgement at or past the start of the first newer epoch" is one
the new leader gave; retries answered from the producer table (offsets below) do not count.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from chaos.check import TailCheck
from chaos.group_check import LogWatchFigures
from chaos.group_plan import LEADER_FAULTS

# Issue 24's targets for the failover time.
FAILOVER_MEDIAN_S_TARGET = 3.0
FAILOVER_P99_S_TARGET = 6.0


@dataclass(frozen=True, slots=True)
class Failover:
    cycle: int
    fault: str
    old_leader: str
    new_leader: str
    elected_s: float  # fault to a leader in a newer epoch seen answering GetStatus
    seconds: float  # fault to the first acknowledgement in that newer epoch


@dataclass
class GroupFigures:
    replicas: int = 3
    netns: str = ""  # "": partitions drawn on network namespaces; else why there are none
    faults: Counter[str] = field(default_factory=Counter)
    failovers: list[Failover] = field(default_factory=list)
    failovers_unobserved: int = 0  # a leader failure without a newer epoch's ack in time
    # Per fault: the longest time without any acknowledgement, from the fault until the group
    # was whole again (a follower's loss stalls appends until it leaves the in-sync set).
    stalls: dict[str, list[float]] = field(default_factory=dict)
    whole_again_s: list[float] = field(default_factory=list)  # fault to a whole group
    etcd_terms_kept: int = 0  # etcd restarts the leader's term outlived
    etcd_failovers: list[Failover] = field(default_factory=list)  # the others: a new leader
    log_watch: LogWatchFigures = field(default_factory=LogWatchFigures)
    read_back: int = 0  # acknowledgements read through the leader after a cycle
    replica_bytes: int = 0  # bytes compared per replica, over every cycle
    full_compares: int = 0  # comparisons of the replicas' whole logs
    tail_checks: list[TailCheck] = field(default_factory=list)
    check_s: list[float] = field(default_factory=list)  # each cycle's checks
    check_parts_s: dict[str, float] = field(default_factory=dict)  # their parts, summed
    final_commit_offset: int = 0

    @property
    def leader_failures(self) -> int:
        return sum(self.faults[f] for f in LEADER_FAULTS)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, nearest rank (p99 of 300 values is the 297th smallest)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"median {statistics.median(values):.2f} s, p99 {percentile(values, 99):.2f} s, "
        f"max {max(values):.2f} s over {len(values)}"
    )


def failover_lines(g: GroupFigures) -> list[str]:
    out = []
    times = [f.seconds for f in g.failovers]
    if times:
        median, p99 = statistics.median(times), percentile(times, 99)
        met = median < FAILOVER_MEDIAN_S_TARGET and p99 < FAILOVER_P99_S_TARGET
        out.append(
            f"  failover          {summary(times)} (target median < "
            f"{FAILOVER_MEDIAN_S_TARGET:.0f} s, p99 < {FAILOVER_P99_S_TARGET:.0f} s: "
            f"{'met' if met else 'MISSED'}); {g.failovers_unobserved} unobserved"
        )
        kinds = sorted({f.fault for f in g.failovers})
        for kind in kinds:
            of_kind = [f for f in g.failovers if f.fault == kind]
            out.append(
                f"    {kind:<15} {summary([f.seconds for f in of_kind])}; a new leader "
                f"answered after {summary([f.elected_s for f in of_kind])}"
            )
    else:
        out.append(f"  failover          none observed ({g.failovers_unobserved} unobserved)")
    return out
