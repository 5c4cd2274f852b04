"""The replicated chaos run (`python -m chaos --replicas 3`, `make chaos REPLICAS=3`): a broker
group of three commit-log replicas on etcd under sync replication (min in-sync 2), SDK
producers given every replica's address, following consumers, and one fault a cycle.

    cycle    the group is whole (one leader, every replica in the in-sync set)
             trigger: a delay or a count of acknowledgements (paced load, or a burst)
             the fault (chaos/group_plan.py): kill -9, SIGSTOP past the lease, a cut off the
               network, or etcd killed; what was killed is started again (same data) at once
               or after down_s, what was paused or cut is resumed or joined after hold_s
             a leader failure: wait for a leader in a newer epoch and for the first
               acknowledgement in it (the failover time)
             wait until the group is whole again (the restarted replica back in the set)
             the cycle's checks (chaos/group_check.py): the log since the last commit offset
               audited, every new acknowledgement compared with it and read back through the
               leader with a random sample of older ones, the replicas' bytes compared,
               cq_svc and index_svc compared with a rebuild of that region
    end      the load stops; every replica holds the leader's whole log; the single-node
             run's final checks over the whole leader's log; the replicas' whole logs compared

Run through `chaos.run.run(config)` with `config.replicas > 1`.
"""

from __future__ import annotations

import itertools
import random
import shutil
import threading
import time
from collections.abc import Callable

from chaos.check import Problems, check_tail, wait_applied
from chaos.group import GroupServices, ReplicaView
from chaos.group_check import (
    FULL_COMPARE_EVERY,
    KEYS_PER_CYCLE,
    QUEUES_PER_CYCLE,
    LogWatch,
    compare_replicas,
    read_back,
)
from chaos.group_figures import Failover, GroupFigures, failover_lines, summary
from chaos.group_plan import PARTITION_FAULTS, GroupCycle, GroupPlan, make_group_plan
from chaos.netns import Network, unavailable
from chaos.plan import QUEUES, TOPICS, all_keys
from chaos.run import (
    THREAD_JOIN_TIMEOUT_S,
    ChaosConfig,
    Report,
    _data_dir,
    count,
    final_checks,
    make_load,
    print_load_figures,
    trigger,
)
from chaos.services import RecoveryFailed
from mqstore.client.admin import Admin
from mqstore.client.connection import Connection
from mqstore.client.errors import ClientError
from mqstore.errors import MqstoreError

Say = Callable[[str], None]
ALL_QUEUES = [(topic, q) for topic in TOPICS for q in range(QUEUES)]

# A cycle's group must be whole again within this (an election, a restart, a catch-up: a few
# seconds; a loaded machine several times that).
WHOLE_TIMEOUT_S = 60.0
# A leader failure's new leader must be acknowledged within this: the SDK's retries end at 30 s.
FAILOVER_TIMEOUT_S = 30.0
POLL_S = 0.02
# At the end every replica must hold the leader's whole log within this.
CONVERGE_TIMEOUT_S = 60.0


def run_group(config: ChaosConfig, *, plan: GroupPlan | None = None, say: Say) -> Report:
    why_not = unavailable() if config.partitions else "not asked for (--no-partitions)"
    plan = plan or make_group_plan(config.seed, config.cycles, partitions=why_not is None)
    report = Report(
        seed=config.seed, replay=config.replay_command(), replay_make=config.make_command()
    )
    report.cycles_planned = len(plan.cycles)
    figures = report.group = GroupFigures(replicas=config.replicas, netns=why_not or "")
    say(f"chaos: seed {config.seed}")
    say(f"replay: {report.replay}   (or: {report.replay_make})")
    root = _data_dir(config)
    report.data_dir = str(root)
    started = time.monotonic()
    network = None
    group: GroupServices | None = None
    try:
        if why_not is None and any(c.fault in PARTITION_FAULTS for c in plan.cycles):
            network = Network(config.replicas)
            network.create()
        group = GroupServices(
            root,
            replicas=config.replicas,
            flush=config.flush,
            replication=config.replication,
            network=network,
        )
        group.start()
        where = f"network namespaces on {network.subnet}.0/24" if network else "loopback"
        say(
            f"store: {root}: {config.replicas} replicas ({config.replication} replication, "
            f"{config.flush} flush) on {where}; service logs in {group.logs}"
        )
        if why_not:
            say(f"no partition cycles: {why_not}")
        _GroupRun(config, plan, group, report, figures, say).drive()
    finally:
        if group is not None:
            group.stop()
        if network is not None:
            network.destroy()
        report.elapsed_s = time.monotonic() - started
    print_group_figures(report, say)
    if report.passed and not config.keep:
        shutil.rmtree(root, ignore_errors=True)
    return report


class _GroupRun:
    def __init__(
        self,
        config: ChaosConfig,
        plan: GroupPlan,
        group: GroupServices,
        report: Report,
        figures: GroupFigures,
        say: Say,
    ) -> None:
        self.config = config
        self.plan = plan
        self.group = group
        self.report = report
        self.figures = figures
        self.say = say
        settings = group.settings()
        self.oracle, self.producers, self.followers = make_load(config, plan.salt, settings)
        self.problems = Problems()
        self.conn = Connection(settings)
        self.watch = LogWatch(self.oracle)
        figures.log_watch = self.watch.figures
        self.checked_to = 0  # the commit offset of the last cycle's checks
        self.rng = random.Random(plan.seed ^ 0x5EED)  # the read-back sample

    def drive(self) -> None:
        for thread in (*self.followers, *self.producers):
            thread.start()
        try:
            self._cycles()
        finally:
            for p in self.producers:
                p.stop()
            for p in self.producers:
                p.join(THREAD_JOIN_TIMEOUT_S)
        self.say("load stopped; waiting for every replica to hold the whole log, then checking")
        try:
            self._final()
        except (ClientError, MqstoreError, RecoveryFailed, TimeoutError, OSError) as err:
            self.problems.add(f"final checks could not finish: {err!r}")
        finally:
            self.conn.close()
            for f in self.followers:
                f.stop()
            for f in self.followers:
                f.join(THREAD_JOIN_TIMEOUT_S)
        count(self.report, self.oracle, self.producers, self.followers, self.problems)
        self.report.problems = self.problems.items

    # -- the cycles ---------------------------------------------------------------------------

    def _cycles(self) -> None:
        for cycle in self.plan.cycles:
            try:
                self.group.wait_healthy(WHOLE_TIMEOUT_S)
            except RecoveryFailed as err:
                self.problems.add(f"before cycle {cycle.index}: {err}")
                return
            alive = trigger(cycle, self.oracle, self.producers, self.problems)
            crashed = self.group.exited()
            for text in crashed:
                self.problems.add(f"before cycle {cycle.index}: {text}")
            if not alive or crashed:
                return
            try:
                self._cycle(cycle)
            except RecoveryFailed as err:
                self.problems.add(f"cycle {cycle.index}: {err}")
                return
            except (ClientError, MqstoreError, OSError, TimeoutError) as err:
                self.problems.add(f"cycle {cycle.index} could not finish: {err!r}")
                return
            finally:
                for p in self.producers:
                    p.burst = False

    def _cycle(self, cycle: GroupCycle) -> None:
        g, figures = self.group, self.figures
        lead = g.leader() or g.wait_healthy(WHOLE_TIMEOUT_S)
        followers = sorted(n for n in g.names if n != lead.name)
        self.oracle.watch()
        election = ElectionWatch(g, lead.epoch)
        began_at = time.monotonic()
        election.start()
        try:
            victim, faulted_at = self._fault(cycle, lead, followers)
            for p in self.producers:
                p.burst = False  # what is in flight at the fault stays; the recovery is paced
            failover = None
            if cycle.leader_failure:
                failover = self._await_failover(cycle, lead, faulted_at, election)
            whole = g.wait_healthy(WHOLE_TIMEOUT_S)
            whole_at = time.monotonic()
            if cycle.fault == "etcd-restart":
                if whole.epoch > lead.epoch:
                    failover = self._await_failover(cycle, lead, faulted_at, election)
                else:
                    figures.etcd_terms_kept += 1
        finally:
            election.stop()
        acks = self.oracle.watched(stop=True)
        stall = _longest_pause(began_at, whole_at, [t for t, _ in acks])
        figures.stalls.setdefault(cycle.fault, []).append(stall)
        figures.whole_again_s.append(whole_at - began_at)
        figures.faults[cycle.fault] += 1
        self.report.cycles_run += 1
        checks_s = self._check(cycle, whole)
        moved = f"{lead.name} -> {whole.name} (epoch {whole.epoch})"
        if failover is not None:
            moved += f", failover {failover.seconds:.2f} s (elected {failover.elected_s:.2f} s)"
        self.say(
            f"cycle {cycle.index}/{len(self.plan.cycles)}: {cycle.describe()} [{victim}]; "
            f"leader {moved}; whole {whole_at - began_at:.2f} s; longest pause "
            f"{stall:.2f} s; checks {checks_s:.2f} s; acked {self.oracle.acked_count}"
        )

    def _fault(
        self, cycle: GroupCycle, lead: ReplicaView, followers: list[str]
    ) -> tuple[str, float]:
        """Apply the cycle's fault and undo it (restart, SIGCONT, join); returns the victim's
        name and when it failed (monotonic: the kill, the SIGSTOP, the cut)."""
        g = self.group
        victim = lead.name if "leader" in cycle.fault else followers[cycle.victim]
        failed_at = time.monotonic()
        match cycle.fault:
            case "leader-kill" | "follower-kill":
                g.kill(victim)
                time.sleep(cycle.down_s)
                g.restart(victim)
            case "lone-leader-kill":
                for name in followers:
                    g.cut(name)
                time.sleep(cycle.hold_s)
                failed_at = time.monotonic()
                g.kill(victim)
                for name in followers:
                    g.heal(name)
                time.sleep(cycle.down_s)
                g.restart(victim)
            case "leader-pause":
                g.pause(victim)
                time.sleep(cycle.hold_s)
                g.resume(victim)
            case "leader-cut" | "follower-cut":
                g.cut(victim)
                time.sleep(cycle.hold_s)
                g.heal(victim)
            case "etcd-restart":
                victim = "etcd"
                g.kill_etcd()
                time.sleep(cycle.down_s)
                g.start_etcd()
        return victim, failed_at

    def _await_failover(
        self, cycle: GroupCycle, old: ReplicaView, faulted_at: float, election: ElectionWatch
    ) -> Failover | None:
        """Wait for a leader in a newer epoch than `old`'s and for the first acknowledgement in
        that epoch; None (counted unobserved) when either does not come in time."""
        deadline = faulted_at + FAILOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            seen = election.seen
            if seen is not None:
                elected_at, lead = seen
                start = min(s for e, s in lead.history if e > old.epoch)
                first = next(
                    (t for t, at in self.oracle.watched() if at >= start and t >= faulted_at),
                    None,
                )
                if first is not None:
                    failover = Failover(
                        cycle.index,
                        cycle.fault,
                        old.name,
                        lead.name,
                        elected_at - faulted_at,
                        first - faulted_at,
                    )
                    if cycle.leader_failure:
                        self.figures.failovers.append(failover)
                    else:
                        self.figures.etcd_failovers.append(failover)
                    return failover
            time.sleep(POLL_S)
        self.figures.failovers_unobserved += 1
        seen = election.seen
        led = f"{seen[1].name} led from {seen[0] - faulted_at:.2f} s" if seen else "no new leader"
        self.problems.add(
            f"cycle {cycle.index}: no acknowledgement in a newer epoch than {old.epoch} within "
            f"{FAILOVER_TIMEOUT_S:.0f} s of the fault ({cycle.fault}); {led}"
        )
        return None

    # -- the checks ----------------------------------------------------------------------------

    def _check(self, cycle: GroupCycle, lead: ReplicaView) -> float:
        """The cycle's checks against the whole group `lead` leads; returns their seconds."""
        started = time.monotonic()
        g, figures, problems = self.group, self.figures, self.problems
        parts = figures.check_parts_s
        where = f"cycle {cycle.index}"
        commit = lead.commit_offset
        leader_dir = g.data_dir(lead.name)
        self.watch.advance(leader_dir, commit, problems, where)
        acks = self.watch.new_acks(problems)
        at = _lap(parts, "log", started)
        figures.read_back += read_back(self.conn, acks, self.oracle, problems, self.rng)
        at = _lap(parts, "read back", at)
        full = cycle.index % FULL_COMPARE_EVERY == 0
        start = 0 if full else self.checked_to
        compared = compare_replicas({n: g.data_dir(n) for n in g.names}, start, commit)
        figures.replica_bytes += compared.bytes
        figures.full_compares += full
        for text in compared.mismatches:
            problems.add(f"replicas: {where}: {text} (commit offset {commit})")
        at = _lap(parts, "replicas", at)
        if commit > self.checked_to:
            admin = Admin(self.conn)
            wait_applied(admin, commit)
            at = _lap(parts, "followers applying", at)
            figures.tail_checks.append(
                check_tail(
                    self.conn,
                    leader_dir,
                    self.checked_to,
                    commit,
                    self.plan.salt,
                    problems,
                    where,
                    from_segment_start=False,
                    keys=self.rng.sample(all_keys(), KEYS_PER_CYCLE),
                    queues=self.rng.sample(ALL_QUEUES, QUEUES_PER_CYCLE),
                )
            )
            _lap(parts, "followers", at)
        self.checked_to = max(self.checked_to, commit)
        seconds = time.monotonic() - started
        figures.check_s.append(seconds)
        return seconds

    def _final(self) -> None:
        g, problems = self.group, self.problems
        for text in g.exited():
            problems.add(f"after the last cycle: {text}")
        lead = g.wait_healthy(WHOLE_TIMEOUT_S)
        deadline = time.monotonic() + CONVERGE_TIMEOUT_S
        while True:
            views = g.views()
            lead = g.leader() or lead
            ends = {v.name: v.end_offset for v in views.values()}
            if len(set(ends.values())) == 1 and lead.commit_offset == lead.end_offset:
                break
            if time.monotonic() > deadline:
                problems.add(
                    f"the replicas did not converge within {CONVERGE_TIMEOUT_S:.0f} s: ends "
                    f"{ends}, commit offset {lead.commit_offset}"
                )
                break
            time.sleep(0.1)
        commit = lead.commit_offset
        self.figures.final_commit_offset = commit
        leader_dir = g.data_dir(lead.name)
        self.watch.advance(leader_dir, commit, problems, "the end")
        self.watch.new_acks(problems)
        compared = compare_replicas({n: g.data_dir(n) for n in g.names}, 0, commit)
        self.figures.full_compares += 1
        for text in compared.mismatches:
            problems.add(f"replicas: at the end: {text} (commit offset {commit})")
        final_checks(
            self.plan.key_sample,
            self.plan.salt,
            g.settings(),
            leader_dir,
            self.oracle,
            self.followers,
            problems,
            self.report,
        )


class ElectionWatch(threading.Thread):
    """Polls the group from the fault on: when a leader in a newer epoch than `old_epoch`
    first answered (`seen`: that time and its view). Polled while the fault lasts too: a new
    leader is elected while the old one is still paused or cut off."""

    def __init__(self, group: GroupServices, old_epoch: int) -> None:
        super().__init__(name="chaos-election-watch", daemon=True)
        self.group = group
        self.old_epoch = old_epoch
        self.seen: tuple[float, ReplicaView] | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set() and self.seen is None:
            lead = self.group.leader()
            if lead is not None and lead.epoch > self.old_epoch:
                self.seen = (time.monotonic(), lead)
                return
            self._halt.wait(POLL_S)

    def stop(self) -> None:
        self._halt.set()
        self.join(THREAD_JOIN_TIMEOUT_S)


def _lap(parts: dict[str, float], name: str, since: float) -> float:
    now = time.monotonic()
    parts[name] = parts.get(name, 0.0) + now - since
    return now


def _longest_pause(start: float, end: float, times: list[float]) -> float:
    """The longest time in [start, end] without an acknowledgement."""
    marks = [start, *(t for t in times if start <= t <= end), end]
    return max((b - a for a, b in itertools.pairwise(marks)), default=0.0)


def print_group_figures(r: Report, say: Say) -> None:
    g = r.group
    assert g is not None
    failures = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())) or "none"
    faults = ", ".join(f"{k} {v}" for k, v in sorted(g.faults.items()))
    w = g.log_watch
    say("figures")
    say(f"  cycles            {r.cycles_run} of {r.cycles_planned}")
    net = f"no partitions: {g.netns}" if g.netns else "network namespaces"
    say(f"  replicas          {g.replicas} ({net})")
    say(f"  faults            {faults}")
    say(f"  leader failures   {g.leader_failures}")
    print_load_figures(r, say, failures)
    say(f"  lost              {r.lost}  (must be 0)")
    say(f"  duplicates        {r.duplicates}  (must be 0)")
    say(f"  corrupt reads     {r.corrupt_reads}  (must be 0)")
    for line in failover_lines(g):
        say(line)
    for kind, stalls in sorted(g.stalls.items()):
        say(f"  longest pause     {kind:<15} {summary(stalls)}")
    say(f"  whole again       {summary(g.whole_again_s)} (from the fault)")
    if g.faults["etcd-restart"]:
        kept, restarts = g.etcd_terms_kept, g.faults["etcd-restart"]
        say(
            f"  etcd restarts     the leader kept its term in {kept} of {restarts}; a new "
            f"leader's first acknowledgement after {summary([f.seconds for f in g.etcd_failovers])}"
        )
    say(
        f"  per cycle         {w.records} records audited ({w.duplicates} stored twice, "
        f"{w.out_of_order} out of queue order, {w.corrupt} not as sent), {w.acks_checked} "
        f"acknowledgements compared with the log, {g.read_back} read back through the leader; "
        f"{len(g.tail_checks)} follower checks ({sum(t.records for t in g.tail_checks)} "
        f"records compared with cq_svc and index_svc); checks {summary(g.check_s)}"
    )
    spent = ", ".join(f"{k} {v:.1f} s" for k, v in g.check_parts_s.items())
    say(f"  checks' time      {spent}")
    say(
        f"  replicas          {g.replica_bytes} bytes compared per replica ({g.full_compares} "
        f"whole-log comparisons); final commit offset {g.final_commit_offset}"
    )
    say(f"  log               {r.log_records} records, {r.foreign_records} foreign")
    say(f"  read back         {r.read_back} by offset, {r.msg_ids_checked} by msg id")
    say(
        f"  consumed          {r.consumed} while following (redelivered {r.redelivered}, "
        f"gaps {r.gaps}, consumer restarts {r.consumer_restarts})"
    )
    say(f"  queues            {r.queues_compared} compared with the log, {r.pulled} pulled")
    say(f"  index             {r.keys_checked} keys, {r.uniq_checked} unique ids compared")
    say(f"  elapsed           {r.elapsed_s:.0f} s")
    if r.passed:
        say("PASS")
        return
    say(f"FAIL: {len(r.problems)} problem(s)")
    for text in r.problems:
        say(f"  - {text}")
    say(f"seed {r.seed}; replay: {r.replay}   (or: {r.replay_make})")
    say(f"data and service logs kept in {r.data_dir}")
