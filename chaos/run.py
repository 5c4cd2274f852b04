"""The chaos run: start the store, drive it, kill and restart its services cycle after cycle,
then check everything against the oracle and print the figures.

    python -m chaos [--cycles N] [--seed S] [--data-dir D] [--flush sync|async]
                    [--producers P] [--rate R] [--keep] [--producer-restarts]

`run(config)` is the entry point for code (the short form in tests/chaos); `main(argv)` parses
the command line, runs and returns the exit code: 0 when every check held, 1 when one failed
(the seed and the command that replays it are printed again at the end), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos.check import (
    Problems,
    check_followers,
    check_index,
    check_msg_ids,
    check_queue_offsets_dense,
    check_queues,
    check_reads_by_offset,
    read_log,
    wait_caught_up,
)
from chaos.group_figures import GroupFigures
from chaos.group_plan import GroupCycle
from chaos.load import (
    PRODUCER_CLOSE_TIMEOUT_S,
    RATE_PER_S_DEFAULT,
    Follower,
    ProducerLoad,
)
from chaos.oracle import Audit, Oracle, Outcome, Verdict
from chaos.plan import SERVICES, TOPICS, CyclePlan, Plan, make_plan
from chaos.services import (
    CRC_MISMATCH_METRIC,
    TRUNCATED_BYTES_METRIC,
    Recovery,
    RecoveryFailed,
    Services,
)
from chaos.torn import TornCycle, TornFigures
from mqstore.client.admin import Admin
from mqstore.client.connection import Connection
from mqstore.client.errors import ClientError
from mqstore.client.settings import ClientSettings
from mqstore.errors import MqstoreError

# About 3.5 s a cycle on this 2-core machine (the trigger, a pause, a Python service's
# restart): 60 cycles make `make chaos` take about four minutes. CYCLES=1000 is the long run.
CYCLES_DEFAULT = 60
PRODUCERS_DEFAULT = 2
# A broker group's run: "several producers" at a pace three replicas keep up with on 2 cores.
GROUP_PRODUCERS_DEFAULT = 3
GROUP_RATE_PER_S_DEFAULT = 150.0
# The recovery bound: kill to readiness SERVING, for every restart of every service. A
# restart here is a Python process importing grpc and opening its store (about 1-3 s on this
# 2-core machine); a follower also replays what it missed. 30 s is an order of magnitude above
# what a healthy run shows, and the SDK's own patience (retry_timeout_s, 30 s).
RECOVERY_S_MAX = 30.0
# An "acks" trigger waits at most this long for its count: the producers must be acknowledged
# again within it after every restart (their retries back off to 1 s at most).
TRIGGER_TIMEOUT_S = 30.0
TRIGGER_POLL_S = 0.01
FOLLOWER_DRAIN_TIMEOUT_S = 60.0
THREAD_JOIN_TIMEOUT_S = PRODUCER_CLOSE_TIMEOUT_S + 10.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    cycles: int = CYCLES_DEFAULT
    data_dir: Path | None = None  # None: a new temporary directory
    flush: str = "sync"
    producers: int = PRODUCERS_DEFAULT
    rate_per_s: float = RATE_PER_S_DEFAULT
    keep: bool = False  # keep the data directory after a passing run (a failing one always is)
    # Opt-in: cycles may also restart a producer under its id (see docs/chaos.md, known bugs).
    producer_restarts: bool = False
    # A broker group of this many commit-log replicas (1: the single-node run).
    replicas: int = 1
    replication: str = "sync"  # the group's --replication (async: a failover may lose acks)
    partitions: bool = True  # cut cycles, when network namespaces can be made here

    def _options(self) -> str:
        out = f"--flush {self.flush}"
        if self.replicas > 1:
            out += f" --replicas {self.replicas}"
            if self.replication != "sync":
                out += f" --replication {self.replication}"
            if not self.partitions:
                out += " --no-partitions"
        group = self.replicas > 1
        if self.producers != (GROUP_PRODUCERS_DEFAULT if group else PRODUCERS_DEFAULT):
            out += f" --producers {self.producers}"
        if self.rate_per_s != (GROUP_RATE_PER_S_DEFAULT if group else RATE_PER_S_DEFAULT):
            out += f" --rate {self.rate_per_s:g}"
        if self.producer_restarts:
            out += " --producer-restarts"
        return out

    def replay_command(self) -> str:
        return f"python -m chaos --seed {self.seed} --cycles {self.cycles} {self._options()}"

    def make_command(self) -> str:
        extra = self._options().removeprefix(f"--flush {self.flush}").strip()
        extra = extra.replace(f"--replicas {self.replicas}", "").strip()
        flush = " FLUSH=async" if self.flush == "async" else ""
        replicas = f" REPLICAS={self.replicas}" if self.replicas > 1 else ""
        args = f' CHAOS_ARGS="{extra}"' if extra else ""
        return f"make chaos{replicas} SEED={self.seed} CYCLES={self.cycles}{flush}{args}"


@dataclass
class Report:
    seed: int
    replay: str
    replay_make: str = ""
    data_dir: str = ""
    cycles_planned: int = 0
    cycles_run: int = 0
    kills: Counter[str] = field(default_factory=Counter)  # per service
    rekills: int = 0
    recoveries: list[Recovery] = field(default_factory=list)
    # After each restart of the commit log: seconds from its readiness to the producers' first
    # acknowledgement (the SDK's reconnect and retry), when that came before the next kill.
    resumes: list[float] = field(default_factory=list)
    resumes_unobserved: int = 0
    # From the restarted commit log's metrics: recoveries that cut a torn tail, and the bytes.
    torn_tails: int = 0
    torn_bytes: int = 0
    recovery_crc_mismatches: int = 0
    log_recoveries_unread: int = 0  # metrics that did not answer
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    no_answer: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    failure_examples: dict[str, str] = field(default_factory=dict)
    unacked_stored: int = 0
    unacked_absent: int = 0
    forfeited: int = 0  # acknowledged, then cut by a torn cycle (async flush: allowed)
    torn: TornFigures = field(default_factory=TornFigures)
    lost: int = 0
    duplicates: int = 0
    corrupt_reads: int = 0
    foreign_records: int = 0
    log_records: int = 0
    dedup_answers: int = 0  # messages acknowledged from a request the store had already stored
    producer_retries: int = 0  # AppendStream requests the SDK sent again
    producer_dedup_requests: int = 0  # of those, requests the store had already stored
    consumed: int = 0
    redelivered: int = 0
    gaps: int = 0
    consumer_restarts: int = 0
    queues_compared: int = 0
    pulled: int = 0
    read_back: int = 0
    keys_checked: int = 0
    uniq_checked: int = 0
    msg_ids_checked: int = 0
    elapsed_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    # A broker group's run (--replicas N): its faults, failovers and per-cycle checks.
    group: GroupFigures | None = None

    @property
    def passed(self) -> bool:
        return (
            not self.problems
            and self.lost == 0
            and self.corrupt_reads == 0
            and self.duplicates == 0
            and self.cycles_run == self.cycles_planned
        )

    @property
    def recovery_max_s(self) -> float:
        return max((r.seconds for r in self.recoveries), default=0.0)

    @property
    def recovery_median_s(self) -> float:
        return statistics.median(r.seconds for r in self.recoveries) if self.recoveries else 0.0


def run(config: ChaosConfig, *, plan: Plan | None = None, say: Say | None = None) -> Report:
    """One chaos run (the services are real processes). `plan` replaces the seed's plan, for
    tests that want particular cycles; `say` receives the progress lines (default: print)."""
    say = say or _print
    if config.replicas > 1:
        from chaos.group_run import run_group  # noqa: PLC0415 (it builds on this module)

        return run_group(config, say=say)
    plan = plan or make_plan(
        config.seed,
        config.cycles,
        producers=config.producers,
        producer_restarts=config.producer_restarts,
        torn=config.flush == "async",
    )
    report = Report(
        seed=config.seed, replay=config.replay_command(), replay_make=config.make_command()
    )
    report.cycles_planned = len(plan.cycles)
    say(f"chaos: seed {config.seed}")
    say(f"replay: {report.replay}   (or: {report.replay_make})")
    root = _data_dir(config)
    report.data_dir = str(root)
    started = time.monotonic()
    services = Services(root, flush=config.flush)
    services.start()
    say(f"store: {root} ({config.flush} flush), service logs in {services.logs_dir}")
    try:
        _Run(config, plan, services, report, say).drive()
    finally:
        services.stop()
        report.elapsed_s = time.monotonic() - started
    _print_figures(report, say)
    if report.passed and not config.keep:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _data_dir(config: ChaosConfig) -> Path:
    if config.data_dir is None:
        return Path(tempfile.mkdtemp(prefix="mqstore-chaos-"))
    root = config.data_dir
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: a chaos run starts from an empty store")
    root.mkdir(parents=True, exist_ok=True)
    return root


def make_load(
    config: ChaosConfig, salt: int, settings: ClientSettings
) -> tuple[Oracle, list[ProducerLoad], list[Follower]]:
    """A run's load (this one's and a group run's): the oracle of every acknowledgement, the
    producers reporting to it, a following consumer a topic."""
    oracle = Oracle(config.producers, salt)
    producers = [
        ProducerLoad(i, settings, oracle, rate_per_s=config.rate_per_s)
        for i in range(config.producers)
    ]
    return oracle, producers, [Follower(topic, settings, salt) for topic in TOPICS]


class _Run:
    """One run's moving parts: the load, the cycles, the final checks, the counting."""

    def __init__(
        self, config: ChaosConfig, plan: Plan, services: Services, report: Report, say: Say
    ) -> None:
        self.plan = plan
        self.services = services
        self.report = report
        self.say = say
        settings = services.settings()
        self.oracle, self.producers, self.followers = make_load(config, plan.salt, settings)
        self.problems = Problems()
        self.resume_from: float | None = None  # the commit log's ready time, until an ack
        self.conn = Connection(settings)  # the torn cycles' status calls and tail checks

    def drive(self) -> None:
        for thread in (*self.followers, *self.producers):
            thread.start()
        try:
            self._cycles()
        finally:
            self.conn.close()
            for p in self.producers:
                p.stop()
            for p in self.producers:
                p.join(THREAD_JOIN_TIMEOUT_S)
        for text in self.services.exited():
            self.problems.add(f"after the last cycle: {text}")
        self.say("load stopped; waiting for the followers, then checking")
        try:
            final_checks(
                self.plan.key_sample,
                self.plan.salt,
                self.services.settings(),
                self.services.commitlog_dir,
                self.oracle,
                self.followers,
                self.problems,
                self.report,
            )
        except (ClientError, TimeoutError) as err:
            self.problems.add(f"final checks could not finish: {err}")
        finally:
            for f in self.followers:
                f.stop()
            for f in self.followers:
                f.join(THREAD_JOIN_TIMEOUT_S)
        count(self.report, self.oracle, self.producers, self.followers, self.problems)
        for r in self.report.recoveries:
            if r.seconds > RECOVERY_S_MAX:
                self.problems.add(
                    f"recovery: {r.service} took {r.seconds:.1f} s in cycle {r.cycle} "
                    f"(bound {RECOVERY_S_MAX:.0f} s)"
                )
        self.report.problems = self.problems.items

    def _cycles(self) -> None:
        for cycle in self.plan.cycles:
            alive = trigger(cycle, self.oracle, self.producers, self.problems)
            for p in self.producers:
                p.burst = False  # what is in flight at the kill stays; the restart is paced
            self._note_resume(final="commitlog" in cycle.kill_order)
            crashed = self.services.exited()
            for text in crashed:
                self.problems.add(f"before cycle {cycle.index}: {text}")
            if not alive or crashed or not self._cycle(cycle):
                return
        if self.resume_from is not None:
            deadline = time.monotonic() + TRIGGER_TIMEOUT_S
            while self.oracle.first_ack_after_mark is None and time.monotonic() < deadline:
                time.sleep(TRIGGER_POLL_S)
            if self.oracle.first_ack_after_mark is None:
                self.problems.add(
                    f"the producers were not acknowledged within {TRIGGER_TIMEOUT_S:.0f} s "
                    "after the commit log's last restart"
                )
            self._note_resume(final=True)

    def _cycle(self, cycle: CyclePlan) -> bool:
        """Kill, restart, wait for readiness; False when a service did not come back."""
        report, total = self.report, len(self.plan.cycles)
        if cycle.target == "producer":
            victim = self.producers[cycle.victim % len(self.producers)]
            if not victim.restart():
                self.problems.add(f"cycle {cycle.index}: producer {victim.producer} hung")
                return False
            report.cycles_run += 1
            report.kills["producer"] += 1
            self.say(f"cycle {cycle.index}/{total}: {cycle.describe()}")
            return True
        torn: TornCycle | None = None
        try:
            if cycle.target == "torn":
                torn = TornCycle(
                    cycle,
                    self.services,
                    self.oracle,
                    self.followers,
                    self.conn,
                    self.problems,
                    report.torn,
                )
                recoveries = torn.run()
            else:
                recoveries = self.services.crash_and_recover(cycle)
        except RecoveryFailed as err:
            self.problems.add(f"cycle {cycle.index}: {err}")
            return False
        except (MqstoreError, OSError, TimeoutError) as err:  # a torn cycle's calls and files
            self.problems.add(f"cycle {cycle.index} could not finish: {err!r}")
            return False
        if "commitlog" in cycle.kill_order:
            self.oracle.mark()
            self.resume_from = next(r.ready_at for r in recoveries if r.service == "commitlog")
            _note_log_recovery(report, self.services)
        report.cycles_run += 1
        report.kills.update(cycle.kill_order)
        report.rekills += cycle.rekill_s is not None
        report.recoveries.extend(recoveries)
        ready = ", ".join(f"{r.service} {r.seconds:.2f} s" for r in recoveries)
        tail = ""
        if torn is not None and torn.tear is not None:
            tear = torn.tear
            tail = (
                f"; zeroed {tear.zeroed} B of [{tear.segment_start}, {tear.end}) above "
                f"flushed {tear.flushed}, cut {tear.records_cut} records at {tear.cut}"
            )
            if torn.tail is not None:
                t = torn.tail
                tail += (
                    f"; tail check {'passed' if not t.failures else 'FAILED'} "
                    f"({t.records} records of [{t.start}, {t.end}))"
                )
        self.say(
            f"cycle {cycle.index}/{total}: {cycle.describe()}; ready: {ready}; "
            f"acked {self.oracle.acked_count}{tail}"
        )
        return True

    def _note_resume(self, *, final: bool) -> None:
        """How long after the commit log was ready the producers got their first answer. The
        watch ends with that answer, or unanswered when `final` (the commit log is about to
        be killed again, or the run ends)."""
        if self.resume_from is None:
            return
        first = self.oracle.first_ack_after_mark
        if first is not None:
            self.report.resumes.append(max(0.0, first - self.resume_from))
        elif final:
            self.report.resumes_unobserved += 1
        else:
            return
        self.resume_from = None


def _note_log_recovery(report: Report, services: Services) -> None:
    """Whether the commit log's recovery found a torn tail (a kill in the middle of a write)."""
    counters = services.commitlog_counters()
    if counters is None:
        report.log_recoveries_unread += 1
        return
    cut = counters[TRUNCATED_BYTES_METRIC]
    if cut:
        report.torn_tails += 1
        report.torn_bytes += int(cut)
    report.recovery_crc_mismatches += int(counters[CRC_MISMATCH_METRIC])


def trigger(
    cycle: CyclePlan | GroupCycle, oracle: Oracle, producers: list[ProducerLoad], problems: Problems
) -> bool:
    """Wait for the cycle's moment; False when the load broke down (the run stops)."""
    start = time.monotonic()
    for p in producers:
        p.burst = cycle.burst
    if cycle.trigger == "delay":
        time.sleep(cycle.delay_s)
    else:
        target = oracle.acked_count + cycle.acks
        while oracle.acked_count < target:
            if time.monotonic() - start > TRIGGER_TIMEOUT_S:
                problems.add(
                    f"cycle {cycle.index}: the producers were acknowledged "
                    f"{cycle.acks - (target - oracle.acked_count)} of {cycle.acks} messages "
                    f"in {TRIGGER_TIMEOUT_S:.0f} s after the services were ready"
                )
                break
            time.sleep(TRIGGER_POLL_S)
    broken = [p for p in producers if p.error is not None or not p.is_alive()]
    for p in broken:
        problems.add(f"producer {p.producer} stopped: {p.error!r}")
    return not broken


def final_checks(
    key_sample: tuple[str, ...],
    salt: int,
    settings: ClientSettings,
    commitlog_dir: str,
    oracle: Oracle,
    followers: list[Follower],
    problems: Problems,
    report: Report,
) -> None:
    """Everything over the whole log, once the load stopped: the log's files in
    `commitlog_dir` (a broker group's leader's) against the oracle, then every read through
    the services (with several commit-log addresses, through the one leading)."""
    with Connection(settings) as conn:
        conn.find_commitlog_leader()
        admin = Admin(conn)
        wait_caught_up(admin)
        ends = {t: {q.queue_id: q.max_offset for q in admin.queues(t)} for t in TOPICS}
        deadline = time.monotonic() + FOLLOWER_DRAIN_TIMEOUT_S
        for f in followers:
            while not f.caught_up(ends[f.topic]) and f.is_alive():
                if time.monotonic() > deadline:
                    problems.add(f"consumer: {f.topic} did not reach the end of its queues")
                    break
                time.sleep(0.05)
        audit = Audit(oracle)
        view = read_log(commitlog_dir, audit)
        result = audit.finish()
        for text in view.bad_ranges:
            problems.add(f"log: {text}")
        for text in (
            result.lost_examples
            + result.duplicated_examples
            + result.corrupt_examples
            + result.foreign_examples
        ):
            problems.add(f"log: {text}")
        problems.lost |= result.lost
        problems.corrupt_reads += result.corrupt
        report.log_records = result.records
        report.foreign_records = result.foreign
        report.duplicates = result.verdicts[Verdict.DUPLICATED]
        report.unacked_stored = result.verdicts[Verdict.UNACKED_STORED]
        report.unacked_absent = result.verdicts[Verdict.UNACKED_ABSENT]
        report.forfeited = result.verdicts[Verdict.FORFEITED]
        if result.foreign:
            problems.add(f"log: {result.foreign} records that no producer of this run sent")
        check_queue_offsets_dense(view, problems)
        report.read_back = check_reads_by_offset(conn, oracle, problems)
        report.msg_ids_checked = check_msg_ids(admin, oracle, problems)
        report.pulled = check_queues(conn, view, problems)
        report.queues_compared = len(view.queues)
        check_followers(followers, view, problems)
        report.keys_checked, report.uniq_checked = check_index(
            admin, key_sample, salt, view, problems
        )
    for text in oracle.anomalies:
        problems.add(f"ack: {text}")


def count(
    report: Report,
    oracle: Oracle,
    producers: list[ProducerLoad],
    followers: list[Follower],
    problems: Problems,
) -> None:
    outcomes = oracle.counts()
    report.sent = sum(outcomes.values())
    report.acknowledged = outcomes[Outcome.ACKED] + outcomes[Outcome.FORFEITED]
    report.failed = outcomes[Outcome.FAILED]
    report.no_answer = outcomes[Outcome.PENDING]
    report.failures = oracle.failures
    report.failure_examples = oracle.failure_examples
    report.dedup_answers = oracle.dedup_answers
    stats = [s for p in producers for s in p.all_stats()]
    report.producer_retries = sum(s.retries for s in stats)
    report.producer_dedup_requests = sum(s.duplicates for s in stats)
    for p in producers:
        if p.error is not None:
            problems.add(f"producer {p.producer} failed: {p.error!r}")
    for f in followers:
        s = f.stats
        report.consumed += s.messages
        report.redelivered += s.redelivered
        report.gaps += s.gaps
        report.consumer_restarts += s.restarts
        problems.corrupt_reads += s.corrupt
        for text in s.examples:
            problems.add(f"consumer: {text}")
        if f.error is not None:
            problems.add(f"consumer {f.topic} failed: {f.error!r}")
    report.lost = len(problems.lost)
    report.corrupt_reads = problems.corrupt_reads


def print_load_figures(r: Report, say: Say, failures: str) -> None:
    """What the producers sent and what became of it (this run's and a group run's figures)."""
    say(f"  sent              {r.sent}")
    say(
        f"  acknowledged      {r.acknowledged}  (requests sent again {r.producer_retries}, "
        f"{r.producer_dedup_requests} of them answered as already stored: "
        f"{r.dedup_answers} messages)"
    )
    say(f"  unacked, stored   {r.unacked_stored}")
    say(
        f"  unacked, absent   {r.unacked_absent}  (failed {r.failed}: {failures}; "
        f"no answer {r.no_answer})"
    )
    for kind, text in sorted(r.failure_examples.items()):
        say(f"    e.g. {kind}: {text[:300]}")


def _print_figures(r: Report, say: Say) -> None:
    kills = ", ".join(f"{s} {r.kills[s]}" for s in SERVICES)
    if r.kills["producer"]:
        kills += f", producer restarts {r.kills['producer']}"
    failures = ", ".join(f"{k} {v}" for k, v in sorted(r.failures.items())) or "none"
    say("figures")
    say(f"  cycles            {r.cycles_run} of {r.cycles_planned}")
    say(f"  kills             {kills}; {r.rekills} killed again while recovering")
    print_load_figures(r, say, failures)
    if r.torn.cycles or r.forfeited:
        say(
            f"  forfeited         {r.forfeited}  (acknowledged in an unflushed tail that a "
            "torn cycle cut)"
        )
    say(f"  lost              {r.lost}  (must be 0)")
    say(f"  duplicates        {r.duplicates}  (must be 0)")
    say(f"  corrupt reads     {r.corrupt_reads}  (must be 0)")
    say(f"  log               {r.log_records} records, {r.foreign_records} foreign")
    say(f"  read back         {r.read_back} by offset, {r.msg_ids_checked} by msg id")
    say(
        f"  consumed          {r.consumed} while following (redelivered {r.redelivered}, "
        f"gaps {r.gaps}, consumer restarts {r.consumer_restarts})"
    )
    say(f"  queues            {r.queues_compared} compared with the log, {r.pulled} pulled")
    say(f"  index             {r.keys_checked} keys, {r.uniq_checked} unique ids compared")
    say(
        f"  recovery          max {r.recovery_max_s:.2f} s, median {r.recovery_median_s:.2f} s "
        f"over {len(r.recoveries)} restarts (bound {RECOVERY_S_MAX:.0f} s)"
    )
    say(
        f"  torn tails        {r.torn_tails} commit-log recoveries cut one ({r.torn_bytes} bytes); "
        f"{r.recovery_crc_mismatches} records failed their checks in recovery"
    )
    t = r.torn
    if t.cycles:
        checked = sum(c.records for c in t.tail_checks)
        say(
            f"  torn cycles       {t.cycles} ({t.frozen} with cq and index frozen, "
            f"{t.early_thaws} of them thawed early): "
            f"{t.zeroed_bytes} bytes zeroed, {t.cuts} cut records ({t.records_cut}; "
            f"{t.request_cuts} moved down to a request's start; {t.nothing_unflushed} found "
            f"nothing unflushed); the followers had confirmed past the cut in "
            f"{t.confirmed_past_cut}; new epoch at the cut {t.epoch_at_cut} of {t.cycles}; "
            f"consumer positions rewound {t.rewound}"
        )
        took = [c.seconds for c in t.tail_checks]
        say(
            f"  tail checks       {t.tail_checks_passed} of {len(t.tail_checks)} passed "
            f"({checked} records compared with cq_svc and index_svc; max "
            f"{max(took, default=0.0):.2f} s, median "
            f"{statistics.median(took) if took else 0.0:.2f} s each)"
        )
    if r.resumes or r.resumes_unobserved:
        say(
            f"  producers resumed max {max(r.resumes, default=0.0):.2f} s, median "
            f"{statistics.median(r.resumes) if r.resumes else 0.0:.2f} s after the commit log "
            f"was ready ({len(r.resumes)} observed, {r.resumes_unobserved} cut short by the "
            "commit log's next kill)"
        )
    say(f"  elapsed           {r.elapsed_s:.0f} s")
    if r.passed:
        say("PASS")
        return
    say(f"FAIL: {len(r.problems)} problem(s)")
    for text in r.problems:
        say(f"  - {text}")
    say(f"seed {r.seed}; replay: {r.replay}   (or: {r.replay_make})")
    say(f"data and service logs kept in {r.data_dir}")


def _print(text: str) -> None:
    print(text, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Kill mqstore's services at seeded moments under load and check that no "
        "acknowledged append is lost, duplicated or read back corrupt (docs/chaos.md).",
    )
    parser.add_argument("--cycles", type=int, default=CYCLES_DEFAULT, help="kill/restart cycles")
    parser.add_argument("--seed", type=int, default=None, help="replay this seed (default: new)")
    parser.add_argument("--data-dir", type=Path, default=None, help="empty or new directory")
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    parser.add_argument(
        "--producers",
        type=int,
        default=None,
        help=f"producer threads (default {PRODUCERS_DEFAULT}; "
        f"{GROUP_PRODUCERS_DEFAULT} with --replicas)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"messages/s per producer (default {RATE_PER_S_DEFAULT:g}; "
        f"{GROUP_RATE_PER_S_DEFAULT:g} with --replicas)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=(1, 3, 5),
        help="commit-log replicas: 3 or 5 run a broker group on etcd (docs/chaos.md)",
    )
    parser.add_argument(
        "--replication",
        choices=("sync", "async"),
        default="sync",
        help="the group's replication (async: a failover may lose acknowledged appends)",
    )
    parser.add_argument(
        "--no-partitions",
        action="store_true",
        help="no cut cycles even where network namespaces can be made",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data after a pass")
    parser.add_argument(
        "--producer-restarts",
        action="store_true",
        help="cycles may also restart a producer under its id (fails: a known bug)",
    )
    args = parser.parse_args(argv)
    group = args.replicas > 1
    if args.producers is None:
        args.producers = GROUP_PRODUCERS_DEFAULT if group else PRODUCERS_DEFAULT
    if args.rate is None:
        args.rate = GROUP_RATE_PER_S_DEFAULT if group else RATE_PER_S_DEFAULT
    if args.cycles < 1 or args.producers < 1 or args.rate <= 0:
        parser.error("--cycles and --producers must be at least 1, --rate positive")
    if group and (args.flush != "sync" or args.producer_restarts):
        parser.error("--replicas runs sync flush without producer restarts")
    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 31)
    config = ChaosConfig(
        seed=seed,
        cycles=args.cycles,
        data_dir=args.data_dir,
        flush=args.flush,
        producers=args.producers,
        rate_per_s=args.rate,
        keep=args.keep,
        producer_restarts=args.producer_restarts,
        replicas=args.replicas,
        replication=args.replication,
        partitions=not args.no_partitions,
    )
    # The SDK warns on every outage it rides out; here outages are the point.
    logging.getLogger("mqstore").setLevel(logging.ERROR)
    try:
        report = run(config)
    except FileExistsError as err:
        parser.error(str(err))
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
