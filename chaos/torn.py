"""Torn-tail cycles (async flush only): kill the commit log, zero part of its unflushed tail,
restart it, let the load regrow the log over the cut, and check the followers against a
from-scratch rebuild of that part of the log (issue 23: followers that could not tell a
rewritten log from the one they had confirmed).

One cycle, in order:

    freeze      (the plan's `freeze`) SIGSTOP cq_svc and index_svc, as in the reproduction:
                they wake into a log that was cut and regrown past what they confirmed
    F           GetStatus's flushed offset, just before the kill, once cq_svc and index_svc
                have confirmed past it and been sent more than they confirmed (asked again,
                the followers thawed in between, for at most CONFIRM_WAIT_S): they confirmed
                into the tail about to be cut and hold entries past what they confirmed, the
                case in which a confirmed offset alone cannot say which log it was confirmed
                against (counted: did they confirm past the cut itself?)
    kill -9     the commit log
    hold        the following consumers close their SDK consumers (load.Follower.hold): none
                may read the log while it is cut and regrown, before it is rewound. Held
                only now, they have read as far into the tail as cq_svc served (it reads
                the segment files, intact until the tear), and the rewind has work to do;
                when the followers are to be frozen, before that instead (a pull from a
                stopped cq_svc would fail at its deadline)
    tear        the newest segment's written data and its record boundaries, read with
                mqstore.storage.logreader; zero [z, end) with
                    z = max(F, the checkpoint's flushed offset, end - zero_bytes,
                            the newest segment's start)
                The cut is the start of the record holding z (z itself at a boundary), or,
                when that record belongs to an idempotent request whose first records lie
                below it, that request's first record: recovery cuts a request it finds only
                in part whole, so that its retry stores it once (commitlog_svc/
                producer_recovery.py)
    forfeit     acknowledgements of records at or past the cut (oracle.forfeit); the answers
                still in flight at the kill arrive, then oracle.seal()
    restart     the commit log after the plan's down time: its new epoch must begin exactly
                at the cut (GetStatus.history's last start)
    regrow      the producers, which never stopped, append until the log is past its old end
    thaw        SIGCONT: once it regrew past the old end (the reproduction: the followers
                wake into a log rewritten past everything they hold), or, with the plan's
                `early_thaw`, as soon as it grew past the cut at all (they wake holding
                entries both past the log's end and in its regrown part)
    tail check  E = the log's end now; once cq_svc and index_svc applied past E, the log from
                the start of the cut's segment to E against both (check.check_tail)
    rewind      each consumer's positions at or past the cut are dropped (the regrown log
                hands out those queue offsets again), and it consumes again

Why z is never below the flushed offset: under async flush an acknowledgement promises nothing
durable before the flush, so acknowledged records in the unflushed tail may be lost (that is
the async contract, and why they are forfeited rather than LOST); below the flushed offset
they may not. The checkpoint's offset counts too, read from the file after the kill because
it may have moved past the F asked for before: recovery treats bad bytes at or past it as a
torn tail (the queues continue from the records kept, reusing the cut records' queue offsets),
and below it as lost durable bytes (docs/durability.md).

Why only under async flush: under sync flush dispatch stops at the flushed offset, so a
follower never holds a byte of an unflushed tail, and no acknowledgement lies in one.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from chaos.check import Problems, TailCheck, check_tail, wait_applied
from chaos.load import Follower
from chaos.oracle import Oracle
from chaos.plan import CyclePlan
from chaos.services import Recovery, Services
from commitlog_svc.producers import decode_tag
from mqstore.client.admin import Admin
from mqstore.client.connection import Connection
from mqstore.client.errors import ClientError
from mqstore.errors import CorruptFile
from mqstore.formats.commitlog_checkpoint import decode_checkpoint
from mqstore.formats.properties import PRODUCER_SEQ
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl_pb
from mqstore.storage.logreader import LogDir, RecordEntry

FOLLOWERS = ("cq", "index")
CHECKPOINT_FILE = "checkpoint"  # beside the segments' directory (commitlog_svc/store_files.py)
# After the kill, answers the dead process had sent are still being read by the producers:
# the forfeit is sealed once no acknowledgement has arrived for this long (at most SETTLE_MAX_S).
SETTLE_QUIET_S = 0.1
SETTLE_MAX_S = 2.0
SETTLE_POLL_S = 0.01
# GetStatus right after a restart waits out the client channel's reconnect backoff.
STATUS_TIMEOUT_S = 30.0
STATUS_CALL_S = 2.0
STATUS_POLL_S = 0.05
# The producers must regrow the log past its old end within this (the runner's liveness bound).
REGROW_TIMEOUT_S = 30.0
# An early thaw should come while the log has grown past the cut by a few records only (~1 MB/s
# of load): the followers then still hold entries past its end.
REGROW_POLL_S = 0.005
# The followers confirm every 100 ms (services.FAST_CONFIRM_MS) and the commit log flushes every
# 500 ms: past the flushed offset within a second, unless the machine is very busy; the cycle
# goes on without it then (and the report counts it).
CONFIRM_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Tear:
    """What one tear did to the newest segment."""

    segment_start: int
    flushed: int  # the higher of GetStatus's flushed offset and the checkpoint's
    end: int  # end of the written data (the last valid record's end)
    zero_from: int  # z: [zero_from, end) was zeroed
    cut: int  # where recovery must cut
    records_cut: int  # records at or past the cut
    request_cut: bool  # the cut moved down to the first record of a request split by z

    @property
    def zeroed(self) -> int:
        return self.end - self.zero_from


@dataclass
class TornFigures:
    """What the run's torn cycles did, for the report."""

    cycles: int = 0
    frozen: int = 0
    zeroed_bytes: int = 0
    cuts: int = 0  # cycles that cut at least one record
    records_cut: int = 0
    request_cuts: int = 0  # cuts moved down to an idempotent request's first record
    nothing_unflushed: int = 0  # cycles that found the whole tail flushed: nothing to zero
    confirmed_past_cut: int = 0  # cycles in which every follower had confirmed past the cut
    early_thaws: int = 0  # frozen cycles thawed once the log grew past the cut at all
    epoch_at_cut: int = 0  # restarts whose new epoch began exactly at the cut
    rewound: int = 0  # consumer positions dropped
    tail_checks: list[TailCheck] = field(default_factory=list)

    @property
    def tail_checks_passed(self) -> int:
        return sum(1 for t in self.tail_checks if not t.failures)


def checkpoint_flushed(data_dir: str) -> int:
    """The flushed offset in the commit log's checkpoint (0: none yet, or unreadable, in which
    case recovery checks everything and treats no byte as durable)."""
    try:
        with open(os.path.join(data_dir, CHECKPOINT_FILE), "rb") as f:
            return decode_checkpoint(f.read()).flushed_offset
    except (FileNotFoundError, CorruptFile):
        return 0


def tear_tail(data_dir: str, zero_bytes: int, flushed: int) -> Tear:
    """Zero up to `zero_bytes` of the newest segment's written data, never below `flushed`
    nor the checkpoint's flushed offset (the commit log must be dead)."""
    flushed = max(flushed, checkpoint_flushed(data_dir))
    log = LogDir(data_dir)
    segment = log.segments[-1]
    offsets: list[int] = []
    end = segment.start_offset
    requests: list[tuple[int, int]] = []  # (first record's index, records) per tagged request
    entries = log.scan(segment.start_offset, check_crc=True)
    try:
        for entry in entries:
            if not isinstance(entry, RecordEntry):
                break  # the end of the data: zeros, a torn write, the end-of-file blank
            tag = decode_tag(entry.record.properties_dict().get(PRODUCER_SEQ, ""))
            if tag is not None:
                requests.append((len(offsets), tag.count - len(tag.refused)))
            offsets.append(entry.offset)
            end = entry.offset + entry.record.total_size
    finally:
        entries.close()
    bound = max(flushed, segment.start_offset)
    zero_from = max(bound, end - zero_bytes)
    if zero_from >= end:
        return Tear(segment.start_offset, flushed, end, end, end, 0, request_cut=False)
    at = bisect.bisect_right(offsets, zero_from) - 1
    if offsets[at] < bound:  # z inside a record that began below the flushed offset
        at += 1
        if at == len(offsets):
            return Tear(segment.start_offset, flushed, end, end, end, 0, request_cut=False)
        zero_from = offsets[at]
    cut_at, request_cut = at, False
    for first, count in requests:
        if first < at < first + count:
            cut_at, request_cut = first, True
    with open(segment.path, "r+b") as f:
        f.seek(zero_from - segment.start_offset)
        f.write(bytes(end - zero_from))
    return Tear(
        segment.start_offset,
        flushed,
        end,
        zero_from,
        offsets[cut_at],
        len(offsets) - cut_at,
        request_cut,
    )


def _status(conn: Connection, timeout_s: float = STATUS_TIMEOUT_S) -> cl_pb.GetStatusResponse:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response: cl_pb.GetStatusResponse = conn.call(
                conn.commitlog().GetStatus,
                cl_pb.GetStatusRequest(),
                name="CommitLog/GetStatus",
                timeout_s=STATUS_CALL_S,
            )
            return response
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(STATUS_POLL_S)


def _settle(oracle: Oracle, not_before: float) -> None:
    """Wait until `not_before` (monotonic) and until no acknowledgement has arrived for
    SETTLE_QUIET_S (at most SETTLE_MAX_S): the dead process's last answers are in."""
    deadline = time.monotonic() + SETTLE_MAX_S
    count, quiet_since = oracle.acked_count, time.monotonic()
    while time.monotonic() < deadline:
        now = time.monotonic()
        if oracle.acked_count != count:
            count, quiet_since = oracle.acked_count, now
        elif now - quiet_since >= SETTLE_QUIET_S and now >= not_before:
            return
        time.sleep(SETTLE_POLL_S)
    remaining = not_before - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


class TornCycle:
    """One torn-tail cycle (see the module docstring); `run` returns the commit log's
    recovery, or raises RecoveryFailed when it did not come back."""

    def __init__(
        self,
        cycle: CyclePlan,
        services: Services,
        oracle: Oracle,
        followers: Sequence[Follower],
        conn: Connection,
        problems: Problems,
        figures: TornFigures,
    ) -> None:
        self.cycle = cycle
        self.services = services
        self.oracle = oracle
        self.followers = followers
        self.conn = conn
        self.problems = problems
        self.figures = figures
        self.where = f"cycle {cycle.index} (torn)"
        self.tear: Tear | None = None
        self.tail: TailCheck | None = None
        self.rewind_at: int | None = None

    def run(self) -> list[Recovery]:
        cycle, services = self.cycle, self.services
        frozen: tuple[str, ...] = ()
        held: list[Follower] = []
        try:
            if cycle.freeze:
                frozen = FOLLOWERS
                self._hold(held)  # a pull from a stopped cq_svc would end in its deadline
            status = self._await_confirms(frozen)
            confirmed = {s.subscriber_id: s.confirmed_offset for s in status.subscribers}
            killed_at = services.kill(["commitlog"])
            if not held:
                self._hold(held)  # until now they read the tail cq_svc serves, intact
            tear = self.tear = tear_tail(
                services.commitlog_dir, cycle.zero_bytes, status.flushed_offset
            )
            self.rewind_at = tear.cut
            self.figures.confirmed_past_cut += (
                bool(confirmed) and min(confirmed.values()) > tear.cut
            )
            self.oracle.forfeit(tear.cut)
            _settle(self.oracle, killed_at + cycle.down_s)
            self.oracle.seal()
            services.restart(["commitlog"])
            recoveries = services.await_ready(cycle.index, ["commitlog"], killed_at)
            self._count(tear)
            self._check_epoch(tear)
            if cycle.early_thaw:
                self._regrow(tear.cut, "the cut")
                services.thaw(frozen)
                frozen = ()
            self._regrow(tear.end, "its old end")
            services.thaw(frozen)
            frozen = ()
            self._check_tail(tear)
            return recoveries
        finally:
            services.thaw(frozen)
            for f in held:
                if self.rewind_at is not None and f.held:
                    self.figures.rewound += f.rewind(self.rewind_at)
                f.release()

    def _hold(self, held: list[Follower]) -> None:
        for f in self.followers:
            held.append(f)
            if not f.hold():
                self.problems.add(f"{self.where}: consumer {f.topic} did not stop")

    def _await_confirms(self, frozen: tuple[str, ...]) -> cl_pb.GetStatusResponse:
        """The commit log's status once every follower has confirmed past its flushed offset
        and been sent more than it confirmed (or CONFIRM_WAIT_S passed), with the `frozen`
        ones stopped before it was asked: the kill comes next, and the flushed offset read
        here must still be where it is then."""
        deadline = time.monotonic() + CONFIRM_WAIT_S
        while True:
            self.services.freeze(frozen)
            status = _status(self.conn)
            subscribers = status.subscribers
            if subscribers and all(
                s.sent_offset > s.confirmed_offset > status.flushed_offset for s in subscribers
            ):
                return status
            if time.monotonic() > deadline:
                return status
            self.services.thaw(frozen)
            time.sleep(STATUS_POLL_S)

    def _count(self, tear: Tear) -> None:
        fig = self.figures
        fig.cycles += 1
        fig.frozen += self.cycle.freeze
        fig.early_thaws += self.cycle.freeze and self.cycle.early_thaw
        fig.zeroed_bytes += tear.zeroed
        fig.cuts += tear.records_cut > 0
        fig.records_cut += tear.records_cut
        fig.request_cuts += tear.request_cut
        fig.nothing_unflushed += tear.zeroed == 0

    def _check_epoch(self, tear: Tear) -> None:
        history = _status(self.conn).history
        began = history.start_offsets[-1] if history.start_offsets else None
        if began == tear.cut:
            self.figures.epoch_at_cut += 1
            return
        self.problems.add(
            f"{self.where}: the restarted log's epoch begins at {began}, the cut is at "
            f"{tear.cut} (zeroed [{tear.zero_from}, {tear.end}), flushed {tear.flushed})"
        )
        if began is not None and began < tear.cut:
            self.rewind_at = began  # the consumers saw records recovery also cut

    def _regrow(self, past: int, what: str) -> None:
        deadline = time.monotonic() + REGROW_TIMEOUT_S
        while _status(self.conn).max_offset <= past:
            if time.monotonic() > deadline:
                self.problems.add(
                    f"{self.where}: the log did not grow past {what} {past} within "
                    f"{REGROW_TIMEOUT_S:.0f} s"
                )
                return
            time.sleep(REGROW_POLL_S)

    def _check_tail(self, tear: Tear) -> None:
        end = _status(self.conn).max_offset
        try:
            wait_applied(Admin(self.conn), end)
        except TimeoutError as err:
            self.problems.add(f"{self.where}: tail check: {err}")
            self.tail = TailCheck(tear.cut, end, failures=1)
        else:
            self.tail = check_tail(
                self.conn,
                self.services.commitlog_dir,
                tear.cut,
                end,
                self.oracle.salt,
                self.problems,
                f"{self.where} tail check",
            )
        self.figures.tail_checks.append(self.tail)
