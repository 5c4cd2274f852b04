"""The schedule of a replicated chaos run (`--replicas 3`), drawn from one seed before it
starts, as chaos/plan.py draws the single-node run's.

    GroupPlan(seed)
      cycles       per cycle: the fault, when (a delay after the group is whole again, or a
                   number of acknowledged messages), under which load (paced or a burst), and
                   its timing: how long a killed replica (or etcd) stays down, how long a
                   paused or cut-off replica stays so, which follower a follower fault hits
      salt         fixes every message, as in the single-node run (plan.message)
      key_sample   the keys whose index answers are checked at the end

The faults:

    leader-kill     kill -9 the leader; restart it (same data directory) after down_s
    lone-leader-kill  cut both followers off the network for hold_s (under the lag bound: they
                    stay in the in-sync set), kill -9 the leader, join them again, restart it
                    after down_s (network namespaces only). Under sync replication nothing
                    was acknowledged while they were away; under async the leader acknowledged
                    alone, and the new leader lacks it (the oracle must count it lost:
                    tests/chaos/test_chaos_group.py). A SIGSTOP of the followers would not
                    do: what the leader sent lies in their sockets' buffers, and they apply it
                    when they wake
    leader-pause    SIGSTOP the leader for hold_s, past the lease TTL; then SIGCONT: it must
                    acknowledge nothing more, step down and follow
    leader-cut      cut the leader off the network for hold_s (network namespaces only)
    follower-kill   kill -9 a follower; restart it after down_s
    follower-cut    cut a follower off for hold_s (network namespaces only)
    etcd-restart    kill -9 etcd; start it again after down_s (same data, same port)

Roles are drawn, not replicas: who leads is the run's business, and the plan says "the
leader" or "follower `victim`" (0 or 1, of the followers by name). Every cycle starts from a
whole group (one leader, every replica in the in-sync set): its fault hits a healthy group.

A leader failure (the first four) is what the failover time is measured over: from the fault
to the first acknowledged append in a newer epoch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Final, Literal

from chaos.plan import BURST_SHARE, KEY_POOL, TriggerKind, all_keys

Fault = Literal[
    "leader-kill",
    "lone-leader-kill",
    "leader-pause",
    "leader-cut",
    "follower-kill",
    "follower-cut",
    "etcd-restart",
]
# The leader's failures are what replication is for: two thirds of the cycles. A kill is the
# commonest real failure (a node or a process lost); a pause stands for a long GC or I/O stall
# and a cut for a partition, the two in which the old leader lives on and must fence itself.
FAULT_WEIGHTS: Final[dict[Fault, int]] = {
    "leader-kill": 4,
    "lone-leader-kill": 1,
    "leader-pause": 2,
    "leader-cut": 2,
    "follower-kill": 2,
    "follower-cut": 1,
    "etcd-restart": 1,
}
LEADER_FAULTS: Final = frozenset({"leader-kill", "lone-leader-kill", "leader-pause", "leader-cut"})
PARTITION_FAULTS: Final = frozenset({"leader-cut", "follower-cut", "lone-leader-kill"})
# A cycle's trigger, counted from when the group is whole again. Shorter than the single-node
# run's: a cycle's recovery (an election, a restart, a catch-up) already takes seconds.
TRIGGER_DELAY_S_RANGE: Final = (0.1, 1.5)
BURST_DELAY_S_RANGE: Final = (0.1, 0.6)
TRIGGER_ACKS_RANGE: Final = (20, 800)
# Half the killed replicas restart at once (they come back while the others elect), the others
# after a pause.
IMMEDIATE_RESTART_SHARE: Final = 0.5
DOWN_S_RANGE: Final = (0.05, 1.5)
LEASE_TTL_S: Final = 2.0  # chaos/group.py's --lease-ttl-s
# A paused leader sleeps past its lease: TTL + 0.2 s to TTL + 2.5 s (whether another replica
# has won by the SIGCONT depends on etcd's expiry check, every 0.5 s).
PAUSE_EXTRA_S_RANGE: Final = (0.2, 2.0)
# A cut-off leader: from just past its lease to a few seconds more.
LEADER_CUT_EXTRA_S_RANGE: Final = (0.2, 2.0)
# A lone leader: its followers cut off this long (under the replica lag bound, 3 s: they stay
# in the in-sync set and may be elected), then the leader killed, then the followers joined.
LONE_S_RANGE: Final = (0.3, 0.8)
# A cut-off follower: from under the replica lag bound (3 s: it stays in the set) to past it
# (it leaves the set and catches up to rejoin).
FOLLOWER_CUT_S_RANGE: Final = (0.5, 4.5)


@dataclass(frozen=True, slots=True)
class GroupCycle:
    index: int  # from 1
    fault: Fault
    trigger: TriggerKind
    delay_s: float
    acks: int
    burst: bool = False
    down_s: float = 0.0  # kills and etcd: before the restart
    hold_s: float = 0.0  # pause and cut: how long
    victim: int = 0  # follower faults: which follower (by name order)

    @property
    def leader_failure(self) -> bool:
        return self.fault in LEADER_FAULTS

    def describe(self) -> str:
        when = (
            f"after {self.delay_s:.2f} s" if self.trigger == "delay" else f"after {self.acks} acks"
        )
        load = " in a burst" if self.burst else ""
        who = f"follower {self.victim}" if self.fault.startswith("follower") else "the leader"
        down = f"down {self.down_s:.2f} s" if self.down_s else "restarted at once"
        match self.fault:
            case "leader-kill" | "follower-kill":
                return f"kill -9 {who} {when}{load}, {down}"
            case "lone-leader-kill":
                return (
                    f"cut both followers off {when}{load}, kill -9 the leader {self.hold_s:.2f} s "
                    f"later, join them; {down}"
                )
            case "leader-pause":
                return f"SIGSTOP the leader {when}{load} for {self.hold_s:.2f} s, then SIGCONT"
            case "leader-cut" | "follower-cut":
                return f"cut {who} off the network {when}{load} for {self.hold_s:.2f} s"
            case "etcd-restart":
                return f"kill -9 etcd {when}{load}, {down}"
        raise AssertionError(self.fault)


@dataclass(frozen=True, slots=True)
class GroupPlan:
    seed: int
    salt: int
    cycles: tuple[GroupCycle, ...]
    key_sample: tuple[str, ...]
    partitions: bool  # cut cycles drawn (network namespaces available)


def make_group_plan(seed: int, cycles: int, *, partitions: bool) -> GroupPlan:
    """The seed's schedule. Without `partitions` no cut is drawn; the other draws stay the
    same per cycle (a cut cycle's draws are made and the fault drawn again from the rest), so
    that a seed's leader kills land in the same cycles either way."""
    rng = random.Random(seed)
    salt = rng.getrandbits(64)
    faults = list(FAULT_WEIGHTS)
    weights = list(FAULT_WEIGHTS.values())
    others = [f for f in faults if f not in PARTITION_FAULTS]
    other_weights = [FAULT_WEIGHTS[f] for f in others]
    out = []
    for i in range(1, cycles + 1):
        fault = rng.choices(faults, weights)[0]
        instead = rng.choices(others, other_weights)[0]
        if not partitions and fault in PARTITION_FAULTS:
            fault = instead
        trigger: TriggerKind = "delay" if rng.random() < 0.5 else "acks"
        burst = rng.random() < BURST_SHARE
        delay_s = rng.uniform(*(BURST_DELAY_S_RANGE if burst else TRIGGER_DELAY_S_RANGE))
        acks = rng.randint(*TRIGGER_ACKS_RANGE)
        down_s = 0.0 if rng.random() < IMMEDIATE_RESTART_SHARE else rng.uniform(*DOWN_S_RANGE)
        pause_s = LEASE_TTL_S + rng.uniform(*PAUSE_EXTRA_S_RANGE)
        leader_cut_s = LEASE_TTL_S + rng.uniform(*LEADER_CUT_EXTRA_S_RANGE)
        follower_cut_s = rng.uniform(*FOLLOWER_CUT_S_RANGE)
        lone_s = rng.uniform(*LONE_S_RANGE)
        victim = rng.randrange(2)
        hold_s = {
            "lone-leader-kill": lone_s,
            "leader-pause": pause_s,
            "leader-cut": leader_cut_s,
            "follower-cut": follower_cut_s,
        }.get(fault, 0.0)
        out.append(
            GroupCycle(
                index=i,
                fault=fault,
                trigger=trigger,
                delay_s=round(delay_s, 3),
                acks=acks,
                burst=burst,
                down_s=round(down_s, 3) if fault.endswith(("kill", "restart")) else 0.0,
                hold_s=round(hold_s, 3),
                victim=victim,
            )
        )
    sample = tuple(sorted(rng.sample(all_keys(), k=KEY_POOL // 2)))
    return GroupPlan(seed, salt, tuple(out), sample, partitions)
