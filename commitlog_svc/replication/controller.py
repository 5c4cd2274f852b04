"""A replica's role in its broker group, kept by one thread (docs/replication.md).

    ┌──────────── leader record gone, this replica may lead ────────────┐
    │                                                                   ▼
  FOLLOWER ◀── another holds the leader record ── CANDIDATE ── campaign won ──▶ LEADER
  (link to the leader:                             (nobody leads,               (term kept alive;
   copy, ack)                                       or not eligible:            feed followers;
    ▲                                               wait for a change)          in-sync set kept
    └──────── term lost (renewal failed, fencing deadline, etcd gone) ─────────  in etcd)

A leader begins its epoch (max of the group's and its own, plus one) at its end before it takes
an append, acknowledges an append only while its fencing clock allows and once every member of
the in-sync set holds it durably (sync replication), and refuses appends while the set has
fewer than `min_insync` members. It shrinks the set by followers past the lag bound and grows it
by followers that caught up, each change written to the coordinator (fenced by its term) before
it takes effect. When the term ends it stops acknowledging at once and becomes a candidate; a
stop of the service resigns the term so that another replica takes over without waiting for
the lease to lapse.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from dataclasses import dataclass

from commitlog_svc.config import FlushMode
from commitlog_svc.messages import PutStatus
from commitlog_svc.replica import ReplicaLog
from commitlog_svc.replication import membership
from commitlog_svc.replication.feed import LeaderFeed
from commitlog_svc.replication.in_sync import InSyncTracker
from commitlog_svc.replication.link import FollowerLink
from mqstore.coordination.coordinator import (
    Coordinator,
    GroupState,
    InSyncSet,
    LeaderRecord,
    Subscription,
    Term,
)
from mqstore.coordination.lease import TermKeeper
from mqstore.errors import (
    CoordinatorUnavailable,
    FailedPrecondition,
    InSyncSetConflict,
    LeadershipLost,
    MqstoreError,
    NotEligible,
    NotEnoughReplicas,
    NotLeader,
    Unavailable,
)
from mqstore.rpc.channel import PLAINTEXT, ChannelSecurity
from mqstore.storage.clock import Clock, SystemClock

log = logging.getLogger(__name__)

# How often a leader checks its in-sync set (lag, catch-up) and a candidate re-reads the group.
CHECK_INTERVAL_S = 0.1
# After a failed link or coordinator call, wait this long before the next try.
RETRY_S = 0.2
# How long a switchover's choice of successor stands in the coordinator: past it (the successor
# died before it took the lead), any eligible replica may campaign again.
HANDOVER_TTL_S = 5
# How often a replica that remembers its group says, while etcd has forgotten it, why it does
# not campaign.
FORGOTTEN_GROUP_LOG_S = 30.0
# How often a switching leader reads the group for its successor's leader record.
SWITCHOVER_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class Switchover:
    """A planned change of leader, as the old leader saw it."""

    leader: LeaderRecord  # who leads now
    paused_ms: float  # from refusing appends here until another replica led


class Role(enum.Enum):
    CANDIDATE = "candidate"
    FOLLOWER = "follower"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    group: str
    name: str
    address: str  # where the other replicas and clients reach this one
    sync: bool = True  # acknowledge only once the in-sync set holds an append
    min_insync: int = 2
    lag_max_ms: int = 3_000
    lease_ttl_s: int = 2
    allow_unclean: bool = False
    ack_timeout_ms: int = 5_000  # how long an append waits for the in-sync set


class ReplicaController:
    def __init__(
        self,
        log_: ReplicaLog,
        coordinator: Coordinator,
        settings: ReplicationSettings,
        *,
        security: ChannelSecurity = PLAINTEXT,
        clock: Clock | None = None,
    ) -> None:
        self._log = log_
        self._coordinator = coordinator
        self.settings = settings
        self._security = security
        self._clock = clock if clock is not None else SystemClock()
        self.role = Role.CANDIDATE
        self.leader_name = ""
        self.leader_address = ""
        self.tracker: InSyncTracker | None = None
        self._keeper: TermKeeper | None = None
        self._term: Term | None = None
        self._commit_known = 0  # the highest commit offset heard (as follower) or made
        self._link: FollowerLink | None = None
        self._last_leader = ""  # the leader this replica last followed
        self._stopping = threading.Event()
        self._resign = True
        self._changed = threading.Event()
        self._state: GroupState | None = None
        self._in_sync_seen: tuple[str, ...] = ()  # the in-sync set as last read or watched
        # Whether this replica belonged to the group before (membership.py), and when it last
        # said that etcd forgot the group.
        self._membership = membership.load(log_.disk, log_.config.data_dir)
        self._membership_lock = threading.Lock()  # the watch's thread and the loop's both note it
        self._forgotten_said_at = -FORGOTTEN_GROUP_LOG_S
        self._state_lock = threading.Lock()
        self._watch: Subscription | None = None
        self._link_stop = threading.Event()
        self._term_over: threading.Event | None = None  # set ends the current term's loop
        self._handing_to: str | None = None  # a switchover under way: appends refused
        self._switchover_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="replica-controller", daemon=True)
        self.failovers = 0  # terms this replica won
        self.feed = LeaderFeed(
            log_, group=settings.group, name=settings.name, tracker=lambda: self.tracker
        )
        log_.set_commit_bound(self.commit_offset)
        log_.set_ack_gate(self)

    # -- life cycle ----------------------------------------------------------------------------

    def join(self) -> None:
        """Agree with the group on the log's identity (before serving anything): the group's
        store id is set once, by the first replica to ask; an empty replica adopts it, one
        holding another log is refused (StoreIdMismatch)."""
        group_id = self._coordinator.ensure_store_id(self._log.store_id.hex())
        if group_id != self._log.store_id.hex():
            self._log.adopt_store_id(bytes.fromhex(group_id))

    def start(self, *, address: str = "") -> None:
        """Take part in the group; `address` (host:port), when given, is where the others
        reach this replica (known only once the server listens)."""
        if address:
            self.settings = dataclasses.replace(self.settings, address=address)
        if not self.settings.address:
            raise ValueError("a replica needs the address the others reach it at")
        self._watch = self._coordinator.watch(self._on_change)
        self._thread.start()

    def stop(self, *, resign: bool = True) -> None:
        """Stop; a leader resigns its term (unless `resign` is False: its lease then lapses on
        its own, as after a crash) so that another takes over at once."""
        self._resign = resign
        self._stopping.set()
        self._changed.set()
        self._link_stop.set()
        self.feed.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=15)
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    # -- what the service asks -----------------------------------------------------------------

    def serving(self) -> bool:
        """Readiness: this replica leads, or follows as a member of the in-sync set (it holds
        every acknowledged message and may be elected). A follower still catching up is not
        ready, so a rolling restart waits for it before it stops the next replica."""
        if self.role is Role.LEADER:
            return True
        return self.role is Role.FOLLOWER and self.settings.name in self._in_sync_seen

    def commit_offset(self) -> int:
        tracker = self.tracker
        if tracker is not None:
            return tracker.commit_offset
        link = self._link
        if link is not None:
            self._commit_known = max(self._commit_known, link.commit_offset)
        return self._commit_known

    def check_append(self) -> None:
        """Raises when this leader may not take an append now, before anything is written:
        NotLeader (the whole request goes to the leader) when it does not lead, hands the
        lead over, or may not acknowledge (a follower's log raises NotLeader earlier);
        NotEnoughReplicas under sync replication with fewer than min in-sync members in the
        set. Both end the request as a whole: nothing of it stored, so a producer sends it
        again under the same sequence, and the requests behind it on its stream are not
        taken before it (their order kept)."""
        keeper, tracker = self._keeper, self.tracker
        if keeper is None or tracker is None:
            raise self._not_leader("this replica does not lead (yet)")
        handing_to = self._handing_to
        if handing_to is not None:
            raise self._not_leader(f"this replica hands the lead over to {handing_to}")
        if not keeper.may_acknowledge():
            raise self._not_leader(
                f"leadership not renewed in time: {keeper.fence.over_reason or 'term over'}"
            )
        if self.settings.sync and not tracker.accepting():
            raise NotEnoughReplicas(
                f"the in-sync set {sorted(tracker.members)} of group {self.settings.group} has "
                f"fewer than {self.settings.min_insync} members (min in-sync): nothing stored; "
                "send again once a follower has caught up"
            )

    def replicated(self, end_offset: int) -> tuple[PutStatus, str]:
        """After the leader's own flush: wait until the in-sync set holds `end_offset`
        durably (sync replication), then check the term still holds (NotLeader if not: the
        producer retries the request at the new leader, which holds it or not)."""
        keeper, tracker = self._keeper, self.tracker
        if keeper is None or tracker is None:
            raise self._not_leader("this replica stopped leading before the append was held")
        replica = self._log
        tracker.leader_progress(replica.end_offset, self._durable())
        if self.settings.sync:
            deadline = time.monotonic() + self.settings.ack_timeout_ms / 1000
            while not tracker.wait_committed(end_offset, 0.05):
                if self.tracker is not tracker or not keeper.may_acknowledge():
                    raise self._not_leader("leadership lost before the in-sync set held it")
                if time.monotonic() >= deadline:
                    return PutStatus.FLUSH_SLAVE_TIMEOUT, "the in-sync set did not hold it in time"
        if not keeper.may_acknowledge():
            raise self._not_leader("leadership lost before the acknowledgement")
        return PutStatus.PUT_OK, ""

    def _not_leader(self, why: str) -> NotLeader:
        return NotLeader(
            f"{why}: producers append to the leader of group {self.settings.group}",
            leader=self._handing_to or "",
        )

    def switchover(self, to: str | None, timeout_s: float) -> Switchover:
        """Hand the lead to in-sync follower `to` (None: the most caught up), losing nothing:
        refuse appends, wait until the successor holds this log's whole end durably, end the
        term naming the successor in the coordinator (the others stand aside), and wait until
        another replica leads. Raises NotLeader on a replica that does not lead,
        FailedPrecondition when there is no such follower or it does not catch up in time
        (appends resume here), Unavailable when the coordinator cannot record the handover
        or no new leader appears in time."""
        with self._switchover_lock:
            keeper, tracker, term, over = self._keeper, self.tracker, self._term, self._term_over
            if keeper is None or tracker is None or term is None or over is None:
                raise NotLeader(
                    f"{self.settings.name} does not lead group {self.settings.group}",
                    leader=self.leader_address,
                )
            successor = to if to else tracker.most_caught_up()
            followers = sorted(tracker.members - {self.settings.name})
            if successor is None or successor not in followers:
                raise FailedPrecondition(
                    f"no in-sync follower {successor or ''} to hand the lead to "
                    f"(in-sync followers: {followers or 'none'})".replace("  ", " ")
                )
            started = time.monotonic()
            deadline = started + timeout_s
            self._handing_to = successor
            handed = False
            try:
                replica = self._log
                if not tracker.wait_held(
                    successor, lambda: replica.end_offset, max(0.0, deadline - time.monotonic())
                ):
                    raise FailedPrecondition(
                        f"{successor} did not hold the log's end {replica.end_offset} within "
                        f"{timeout_s:g} s; the lead stays with {self.settings.name}"
                    )
                keeper.fence.end(f"handing the lead over to {successor}")
                handed = True
                try:
                    held = self._coordinator.hand_over(term, successor, HANDOVER_TTL_S)
                finally:
                    over.set()
                if not held:
                    raise Unavailable(f"the term of epoch {term.epoch} ended before the handover")
                leader = self._wait_other_leader(deadline)
            finally:
                if not handed:
                    self._handing_to = None
            paused_ms = (time.monotonic() - started) * 1000
            log.info("handed the lead to %s in %.0f ms", leader.name, paused_ms)
            return Switchover(leader, paused_ms)

    def _wait_other_leader(self, deadline: float) -> LeaderRecord:
        while True:
            leader = self._coordinator.read().leader
            if leader is not None and leader.name != self.settings.name:
                return leader
            if time.monotonic() >= deadline:
                raise Unavailable("no replica took the lead in time after the handover")
            time.sleep(SWITCHOVER_POLL_S)

    def _durable(self) -> int:
        replica = self._log
        if replica.config.flush is FlushMode.SYNC:
            return replica.durable_offset
        return replica.end_offset

    # -- the loop -----------------------------------------------------------------------------

    def _on_change(self, state: GroupState) -> None:
        with self._state_lock:
            self._state = state
        self._in_sync_seen = state.in_sync.members
        if state.epoch > 0 and self._membership is None:
            self._remember(state)  # once: one small file
        leader = state.leader
        if self.role is Role.FOLLOWER and (leader is None or leader.name != self.leader_name):
            self._link_stop.set()
        self._changed.set()

    def _latest(self) -> GroupState:
        with self._state_lock:
            state = self._state
        if state is None:
            state = self._coordinator.read()
            self._in_sync_seen = state.in_sync.members
        return state

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._step()
            except CoordinatorUnavailable as err:
                log.warning("coordinator unavailable: %s", err)
                self._stopping.wait(RETRY_S)
            except Exception:
                log.exception("replica controller step failed")
                self._stopping.wait(RETRY_S)

    def _step(self) -> None:
        self._changed.clear()
        state = self._latest()
        leader = state.leader
        name = self.settings.name
        if state.epoch > 0:
            self._remember(state)
        if leader is not None and leader.name != name:
            self._follow(leader.name, leader.address)
            return
        if leader is None and self._forgotten(state):
            self.role = Role.CANDIDATE
            self._changed.wait(CHECK_INTERVAL_S * 5)
            with self._state_lock:
                self._state = None
            return
        if leader is None and state.may_lead(name, allow_unclean=self.settings.allow_unclean):
            try:
                term = self._coordinator.campaign(
                    name,
                    self.settings.address,
                    self.settings.lease_ttl_s,
                    last_log_epoch=self._log.history.last_epoch,
                    allow_unclean=self.settings.allow_unclean,
                )
            except NotEligible:
                term = None
            if term is not None:
                self._lead(term, state)
                return
        # Nobody to follow and nothing won (or our own record of a previous life, which must
        # lapse): wait for a change.
        self.role = Role.CANDIDATE
        self._changed.wait(CHECK_INTERVAL_S * 5)
        with self._state_lock:
            self._state = None  # read afresh next time

    def _remember(self, state: GroupState) -> None:
        """Note, once, in the data directory that this replica belongs to the group."""
        with self._membership_lock:
            if self._membership is not None:
                return
            remembered = membership.Membership(
                self.settings.group, state.store_id or self._log.store_id.hex(), state.epoch
            )
            membership.save(self._log.disk, self._log.config.data_dir, remembered)
            self._membership = remembered

    def _forgotten(self, state: GroupState) -> bool:
        """etcd holds no epoch for a group this replica belonged to: its data was lost, and an
        election now could pick a replica that missed acknowledged appends. Such a replica
        stays out of elections unless the operator allows an unclean one."""
        if state.epoch > 0 or self._membership is None or self.settings.allow_unclean:
            return False
        now = time.monotonic()
        if now - self._forgotten_said_at >= FORGOTTEN_GROUP_LOG_S:
            self._forgotten_said_at = now
            log.error(
                "etcd has no state for group %s, which this replica joined in epoch %d: its "
                "data was lost. Not campaigning: restore etcd from a snapshot, or restart the "
                "replica known to hold every acknowledged append with --allow-unclean-election",
                self.settings.group,
                self._membership.epoch,
            )
        return True

    # -- following ----------------------------------------------------------------------------

    def _follow(self, leader: str, address: str) -> None:
        replica = self._log
        if self.role is not Role.FOLLOWER or self.leader_name != leader:
            log.info("following %s at %s", leader, address)
        self.role = Role.FOLLOWER
        self.leader_name, self.leader_address = leader, address
        self._last_leader = leader
        replica.become_follower(address)
        self._link_stop.clear()
        link = FollowerLink(
            replica, group=self.settings.group, name=self.settings.name, security=self._security
        )
        self._link = link
        try:
            link.run(address, self._link_stop)
        except MqstoreError as err:
            log.warning("link to %s ended: %s", leader, err)
            if isinstance(err, FailedPrecondition):
                self._stopping.wait(RETRY_S * 5)
            else:
                self._stopping.wait(RETRY_S)
        finally:
            self._commit_known = max(self._commit_known, link.commit_offset)
            with self._state_lock:
                self._state = None  # read afresh: the leader may have changed

    # -- leading ------------------------------------------------------------------------------

    def _lead(self, term: Term, state: GroupState) -> None:
        replica = self._log
        lost = threading.Event()
        self._term_over = lost
        self._handing_to = None
        keeper = TermKeeper(self._coordinator, term, on_lost=lambda _reason: lost.set())
        keeper.start()
        begins = replica.become_leader(term.epoch)
        members = state.in_sync.members or (self.settings.name,)
        tracker = InSyncTracker(
            self.settings.name,
            members,
            min_insync=self.settings.min_insync,
            lag_max_ms=self.settings.lag_max_ms,
            clock=self._clock,
            commit_offset=self._commit_known,
        )
        tracker.add_listener(lambda _offset: replica.wake_waiters())
        in_sync = state.in_sync
        if not in_sync.members:
            in_sync = self._coordinator.read().in_sync
        previous = self._last_leader
        if previous and previous != self.settings.name and previous in tracker.members:
            # The leader before this one lost its lease: it is gone, or cut off and fenced.
            # Waiting out the lag bound for it would stall every append that long.
            in_sync = self._shrink(term, tracker, in_sync, {previous})
        self._term, self._keeper = term, keeper
        self.leader_name, self.leader_address = term.name, term.address
        self.tracker = tracker
        self.role = Role.LEADER
        self.failovers += 1
        log.info(
            "leading group %s in epoch %d from %d; in-sync set %s",
            term.group,
            term.epoch,
            begins,
            sorted(tracker.members),
        )
        try:
            while not lost.is_set() and not self._stopping.is_set():
                tracker.leader_progress(replica.end_offset, self._durable())
                try:
                    in_sync = self._keep_in_sync(term, tracker, in_sync)
                except LeadershipLost as err:
                    log.warning("in-sync set not written: %s", err)
                    break
                except CoordinatorUnavailable as err:
                    log.warning("in-sync set not written: %s", err)
                lost.wait(CHECK_INTERVAL_S)
        finally:
            self.role = Role.CANDIDATE
            self.tracker = None
            self._keeper = None
            self._term = None
            self._term_over = None
            keeper.stop()
            replica.become_follower("")
            tracker.wake()
            replica.wake_waiters()
            self._commit_known = max(self._commit_known, tracker.commit_offset)
            if self._stopping.is_set() and self._resign:
                try:
                    self._coordinator.resign(term)
                except MqstoreError as err:
                    log.warning("resigning failed (the lease will lapse): %s", err)
            log.info("no longer leading group %s (epoch %d)", term.group, term.epoch)
            with self._state_lock:
                self._state = None

    def _keep_in_sync(self, term: Term, tracker: InSyncTracker, current: InSyncSet) -> InSyncSet:
        """Shrink by the lagging, grow by the caught up: written first, then in effect."""
        members = set(tracker.members)
        wanted = (members - tracker.lagging()) | tracker.caught_up()
        if wanted == members:
            return current
        return self._write_in_sync(term, tracker, current, wanted)

    def _shrink(
        self, term: Term, tracker: InSyncTracker, current: InSyncSet, gone: set[str]
    ) -> InSyncSet:
        try:
            return self._write_in_sync(term, tracker, current, set(tracker.members) - gone)
        except CoordinatorUnavailable as err:
            log.warning("in-sync set not written: %s", err)
            return current

    def _write_in_sync(
        self, term: Term, tracker: InSyncTracker, current: InSyncSet, wanted: set[str]
    ) -> InSyncSet:
        try:
            written = self._coordinator.update_in_sync(term, current, sorted(wanted))
        except InSyncSetConflict:
            return self._coordinator.read().in_sync
        log.info("in-sync set %s -> %s", sorted(tracker.members), sorted(written.members))
        tracker.set_members(written.members)
        return written
