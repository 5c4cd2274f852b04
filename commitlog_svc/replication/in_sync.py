"""The leader's view of its followers: their progress, the in-sync set and the commit offset.

    replica   end_offset   durable_offset   caught up at   in the set
    a (self)  3_000_000    3_000_000        -              yes
    b         3_000_000    2_990_000        now            yes
    c         1_200_000    1_200_000        now - 9 s      yes, past the lag bound: shrink
    d         2_995_000    2_995_000        now            no, holds the commit offset: expand

    commit offset = lowest durable offset over the set (a, b, c) = 1_200_000

The rules (docs/replication.md "The rules"): an append is acknowledged once the commit offset
passes its end; appends are refused while the set has fewer than `min_insync` members; a member
that has not caught up with the leader's end within `lag_max_ms` is proposed for removal, a
connected non-member that holds the commit offset durably for addition. A follower "caught up"
when it reported an end offset at or past the leader's end at that moment, or at its previous
report when it now holds the leader's end of then (Kafka's lastCaughtUpTime: under a steady
load the end moves on while a report travels), and is caught up still while it is connected
and holds the leader's end (an idle group lags nowhere); a disconnected one is timed from its
last catch-up, an added one from when it was added.

Pure bookkeeping and waiting: the controller writes a proposed set to the coordinator first and
calls `set_members` only once it is recorded there, so the set never takes effect before a new
leader could see it. The commit offset never moves back: a new leader starts from the one it
last heard as a follower, and only members' reports move it on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mqstore.storage.clock import Clock


@dataclass(slots=True)
class ReplicaProgress:
    name: str
    end_offset: int = 0
    durable_offset: int = 0
    caught_up_at_ms: float = 0.0  # monotonic ms; 0: never
    connected: bool = False
    reported_at_ms: float = 0.0  # its last report (monotonic ms; 0: none yet)
    leader_end_at_report: int = 0  # the leader's end when it last reported


@dataclass(frozen=True, slots=True)
class InSyncView:
    """One look at the table, for status and metrics."""

    members: frozenset[str]
    commit_offset: int
    replicas: tuple[ReplicaProgress, ...]


class InSyncTracker:
    def __init__(
        self,
        leader: str,
        members: Iterable[str],
        *,
        min_insync: int,
        lag_max_ms: float,
        clock: Clock,
        commit_offset: int = 0,
    ) -> None:
        if min_insync < 1:
            raise ValueError(f"min_insync {min_insync}: at least the leader itself")
        if lag_max_ms <= 0:
            raise ValueError(f"lag_max_ms {lag_max_ms}: must be positive")
        self.leader = leader
        self.min_insync = min_insync
        self.lag_max_ms = lag_max_ms
        self._clock = clock
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # the commit offset moved (appends wait on it)
        # A follower reported (a switchover waits on it): apart, so that appends waiting for
        # the commit offset are not woken by every report.
        self._reported = threading.Condition(lock)
        self._members = frozenset(members) | {leader}
        self._replicas: dict[str, ReplicaProgress] = {}
        self._commit = commit_offset
        self._leader_end = 0
        self._leader_durable = 0
        # Members that have not reported yet are timed from when this leader took office.
        self._since_ms = clock.monotonic_ms()
        self._listeners: list[Callable[[int], None]] = []

    # -- what the leader and the followers report -------------------------------------------------

    def leader_progress(self, end_offset: int, durable_offset: int) -> None:
        with self._cond:
            self._leader_end = end_offset
            self._leader_durable = durable_offset
            self._advance()

    def follower_progress(self, name: str, end_offset: int, durable_offset: int) -> None:
        """A follower's report: what it has written and what it holds durably. It caught up
        now when it holds the leader's end; else, when it holds the leader's end of its
        previous report, it caught up then (Kafka's lastCaughtUpTime rule: under a steady load
        the leader's end moves on while a report travels, and a follower keeping within one
        report of it never holds the end at the moment it reports)."""
        now = self._clock.monotonic_ms()
        with self._cond:
            replica = self._replicas.get(name)
            if replica is None:
                replica = self._replicas[name] = ReplicaProgress(name)
            replica.end_offset = end_offset
            replica.durable_offset = min(durable_offset, end_offset)
            replica.connected = True
            if end_offset >= self._leader_end:
                replica.caught_up_at_ms = now
            elif replica.reported_at_ms and end_offset >= replica.leader_end_at_report:
                replica.caught_up_at_ms = max(replica.caught_up_at_ms, replica.reported_at_ms)
            replica.reported_at_ms = now
            replica.leader_end_at_report = self._leader_end
            self._advance()
            self._reported.notify_all()

    def disconnected(self, name: str) -> None:
        with self._cond:
            replica = self._replicas.get(name)
            if replica is not None:
                replica.connected = False

    def set_members(self, members: Iterable[str]) -> None:
        """The set as now recorded in the coordinator (the leader is always in it). A member
        added is timed for the lag bound from now: it held everything committed."""
        now = self._clock.monotonic_ms()
        with self._cond:
            added = frozenset(members) - self._members
            self._members = frozenset(members) | {self.leader}
            for name in added:
                replica = self._replicas.get(name)
                if replica is not None:
                    replica.caught_up_at_ms = max(replica.caught_up_at_ms, now)
            self._advance()

    # -- decisions ---------------------------------------------------------------------------------

    @property
    def members(self) -> frozenset[str]:
        return self._members

    def accepting(self) -> bool:
        """Whether the set is large enough to acknowledge appends."""
        return len(self._members) >= self.min_insync

    def lagging(self) -> frozenset[str]:
        """Members past the lag bound: to be removed."""
        now = self._clock.monotonic_ms()
        with self._cond:
            out = set()
            for name in self._members - {self.leader}:
                replica = self._replicas.get(name)
                if (
                    replica is not None
                    and replica.connected
                    and replica.end_offset >= self._leader_end
                ):
                    replica.caught_up_at_ms = now  # holds everything: idle, not lagging
                caught = replica.caught_up_at_ms if replica is not None else 0.0
                if now - max(caught, self._since_ms) > self.lag_max_ms:
                    out.add(name)
            return frozenset(out)

    def caught_up(self) -> frozenset[str]:
        """Connected followers outside the set that hold everything committed (every
        acknowledged append) durably: to be added (Kafka's rule: the follower's end at or
        past the high watermark). Not the leader's end: under a steady load the leader's end
        moves on while a report travels, and a follower catching up would never hold it at the
        moment it reports. Once added, appends wait for it too."""
        with self._cond:
            return frozenset(
                r.name
                for r in self._replicas.values()
                if r.name not in self._members
                and r.connected
                and r.end_offset >= self._commit
                and r.durable_offset >= self._commit
            )

    # -- the commit offset -------------------------------------------------------------------------

    @property
    def commit_offset(self) -> int:
        return self._commit

    def _advance(self) -> None:
        lowest = self._leader_durable
        for name in self._members - {self.leader}:
            replica = self._replicas.get(name)
            lowest = min(lowest, replica.durable_offset if replica is not None else 0)
        if lowest > self._commit:
            self._commit = lowest
            self._cond.notify_all()
            for listener in self._listeners:
                listener(lowest)

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Called (under the tracker's lock: keep it short) whenever the commit offset moves."""
        with self._cond:
            self._listeners.append(listener)

    def wait_committed(self, offset: int, timeout_s: float) -> bool:
        """Block until the commit offset reaches `offset`; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._commit >= offset, timeout=timeout_s)

    def most_caught_up(self) -> str | None:
        """The connected follower in the set holding the most durably (a switchover's pick)."""
        with self._cond:
            candidates = [
                r
                for r in self._replicas.values()
                if r.name in self._members and r.name != self.leader and r.connected
            ]
            if not candidates:
                return None
            return max(candidates, key=lambda r: (r.durable_offset, r.name)).name

    def wait_held(self, name: str, offset: Callable[[], int], timeout_s: float) -> bool:
        """Block until follower `name` holds `offset()` durably (re-read at each report);
        False on timeout."""

        def held() -> bool:
            replica = self._replicas.get(name)
            return replica is not None and replica.durable_offset >= offset()

        with self._reported:
            return self._reported.wait_for(held, timeout=timeout_s)

    def wake(self) -> None:
        """Wake every waiter (on a change of role: they re-check and give up)."""
        with self._cond:
            self._cond.notify_all()
            self._reported.notify_all()

    def view(self) -> InSyncView:
        with self._cond:
            replicas = tuple(
                ReplicaProgress(
                    r.name, r.end_offset, r.durable_offset, r.caught_up_at_ms, r.connected
                )
                for r in sorted(self._replicas.values(), key=lambda r: r.name)
            )
            return InSyncView(self._members, self._commit, replicas)
