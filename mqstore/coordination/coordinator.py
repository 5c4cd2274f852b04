"""What a replica of a broker group asks of its coordinator, whatever the coordinator is.

A broker group is N commitlog_svc replicas; the coordinator holds the few facts they must agree
on, each changed only by a compare-and-set (docs/replication.md, "Coordinator"):

    leader      {name, address, epoch}  bound to the holder's lease; present while it leads
    epoch       the group's last epoch; each new leader raises it by one
    in-sync     {members, epoch, version}: who holds every acknowledged message; changed only
                by the current leader, fenced by its leader record
    store id    the log's identity, set once; every replica holds the same
    handover    the replica a leader handed its term to (a switchover), with a lease of its
                own: while it lasts, only that replica may take the lead

The replica controller (commitlog_svc) drives this interface; `etcd.py` implements it on etcd
v3. It is kept small so that a Kubernetes-Lease coordinator can stand behind it later: reads
of the whole state, one election step, one renewal, one resignation, one fenced write, one
set-once write, and a change feed.

Timing is the caller's business only through `Term.acquired_sent_at_s` and the fencing clock
(mqstore/coordination/lease.py): a term may acknowledge while `now < last renewal SENT + TTL -
margin`, on the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# The in-sync set before any leader wrote one: nobody, version 0.
NO_MEMBERS: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """Who leads the group, where its commit log listens, and in which epoch."""

    name: str
    address: str
    epoch: int


@dataclass(frozen=True, slots=True)
class InSyncSet:
    """The replicas that hold every acknowledged message (Kafka's ISR, RocketMQ's
    SyncStateSet). `version` counts the changes (0: never written); `epoch` is the epoch of
    the leader that wrote it; `revision` is the coordinator's own stamp of the write, the
    value a compare-and-set compares (0: never written)."""

    members: tuple[str, ...] = NO_MEMBERS
    epoch: int = 0
    version: int = 0
    revision: int = 0


@dataclass(frozen=True, slots=True)
class GroupState:
    """The group as read at one moment (one consistent read of every key)."""

    group: str
    leader: LeaderRecord | None
    epoch: int  # the group's last epoch (0: none began yet)
    in_sync: InSyncSet
    store_id: str | None
    handover: str | None = None  # the only replica that may lead next (a switchover)
    # Coordinator stamps, not part of equality (two reads of an unchanged group compare equal):
    # the revision of this read, after which a watch continues, and the epoch's last write,
    # which an election compares.
    revision: int = field(default=0, compare=False)
    epoch_revision: int = field(default=0, compare=False)

    def may_lead(self, name: str, *, allow_unclean: bool = False) -> bool:
        """The election rule: a replica may lead when it is in the in-sync set, when the set is
        empty (the group's first leader), or when the operator allows unclean elections; and,
        while a switchover's handover stands, only the replica it names."""
        if self.handover is not None and self.handover != name:
            return False
        return allow_unclean or not self.in_sync.members or name in self.in_sync.members


@dataclass(frozen=True, slots=True)
class Term:
    """One leadership term: what the holder needs to renew, resign and make fenced writes.

    `acquired_sent_at_s` is the monotonic time at which the request that created the lease was
    SENT: the lease cannot have started earlier, so the fencing clock starts there.
    `lease_id` and `fence` are the coordinator's own tokens (for etcd: the lease ID and the
    leader key's create revision, which every fenced write compares)."""

    group: str
    name: str
    address: str
    epoch: int
    ttl_s: int  # as granted (a coordinator may raise a TTL below its minimum)
    acquired_sent_at_s: float
    lease_id: int
    fence: int

    @property
    def leader(self) -> LeaderRecord:
        return LeaderRecord(self.name, self.address, self.epoch)


class Subscription(Protocol):
    """A running change feed; `close` stops it (no callback runs after `close` returns, except
    one already under way in the feed's thread)."""

    def close(self) -> None: ...


class Coordinator(Protocol):
    """A broker group's coordinator. Every call is bounded in time and raises
    `CoordinatorUnavailable` when the coordinator does not answer within its bound; what a
    write did then is unknown (the caller reads the state again)."""

    @property
    def group(self) -> str: ...

    def read(self) -> GroupState:
        """The whole group state in one consistent read."""
        ...

    def campaign(
        self,
        name: str,
        address: str,
        ttl_s: int,
        *,
        last_log_epoch: int = 0,
        allow_unclean: bool = False,
    ) -> Term | None:
        """One election step. Wins (returns the term) only if, at once: nobody leads, the
        in-sync set is unchanged since this call read it, and the group epoch is unchanged;
        the new epoch is max(group epoch, `last_log_epoch`) + 1 and becomes the group epoch.
        None when another leads or won the race. Raises `NotEligible` when `name` may not
        lead (GroupState.may_lead). At the group's first election, and at an unclean one,
        the in-sync set becomes {name}; otherwise it is left for the new leader to change.
        A won campaign removes a switchover's handover."""
        ...

    def renew(self, term: Term, *, timeout_s: float | None = None) -> None:
        """Keep the term's lease alive and check the leader record is still the term's.
        Raises `LeadershipLost` when either is gone. Bounded by `timeout_s` when given (the
        time left to the fencing deadline), else by the coordinator's own bound. The renewal
        counts from when it was sent: the caller notes the monotonic time first (lease.py)."""
        ...

    def resign(self, term: Term) -> bool:
        """End the term: remove the leader record if it is still the term's, end the lease.
        True when the record was still the term's. The caller stops acknowledging first."""
        ...

    def hand_over(self, term: Term, successor: str, ttl_s: int) -> bool:
        """A switchover in one step: end the term (remove its leader record, fenced by it, and
        its lease) and name `successor` as the only replica that may lead next, for `ttl_s`
        (then anyone eligible may). True when the term still held. The caller stops
        acknowledging first and has made sure the successor holds the whole log. A won
        campaign removes the handover."""
        ...

    def update_in_sync(self, term: Term, expected: InSyncSet, members: Sequence[str]) -> InSyncSet:
        """Replace the in-sync set, fenced: only while the term's leader record stands and the
        set is still `expected`. Returns the set as written. Raises `LeadershipLost` when the
        term is over, `InSyncSetConflict` when the set changed under it."""
        ...

    def ensure_store_id(self, store_id: str) -> str:
        """Set the group's store id if none is set; returns the group's store id (this one or
        the one set before): a replica adopts what this returns."""
        ...

    def watch(self, on_change: Callable[[GroupState], None]) -> Subscription:
        """Call `on_change` with the state now, then after every change (leader, epoch,
        in-sync set, store id), from one thread of the feed's own; it must return quickly.
        Keeps trying through coordinator outages; delivers only states that differ from the
        last delivered."""
        ...

    def close(self) -> None: ...
