"""The leader's fencing clock, and the thread that keeps a term's lease alive.

A leader may acknowledge only while it is sure no other replica can lead. Its lease cannot
lapse in the coordinator before `sent + TTL` for the last renewal that succeeded, where `sent`
is when that renewal was SENT (the coordinator restarts the countdown when it receives it,
later). So, on the monotonic clock:

    may_acknowledge(now)  <=>  term not over  and  now < last_sent + TTL - margin

    time ──┬───────────┬───────────┬────────────────────────┬───────────┬──▶
        sent_0      sent_1      sent_2                 deadline   sent_2 + TTL
          renew every TTL * RENEW_FRACTION        = sent_2 + TTL - margin
                                                  (acknowledging stops)  (another may win)

The margin covers the time between a check and the acknowledgement it allows leaving the
process, and the rate difference between this clock and the coordinator's. A term is over for
good (the replica steps down and campaigns anew) once the deadline passes, once a renewal
fails for any reason (the coordinator unreachable included: Patroni demotes likewise), or once
a renewal is answered only after the deadline. Nothing revives it.

`FencingClock` is the pure rule with an injectable clock; `TermKeeper` renews from a thread and
calls back once when the term ends on its own (not when the caller stops it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mqstore.coordination.coordinator import Coordinator, Term
from mqstore.errors import InvalidArgument, MqstoreError

log = logging.getLogger(__name__)

# Renew every third of the TTL, as etcd's Go client does: a renewal then lands well before the
# deadline even when one answer takes a whole interval.
RENEW_FRACTION = 1 / 3
# Stop acknowledging a quarter of the TTL before the lease could lapse (0.5 s at a 2 s TTL):
# room for an acknowledgement already allowed to leave, and for clock rate differences
# (ppm-level between machines, so the margin is mostly the former).
MARGIN_FRACTION = 0.25

Clock = Callable[[], float]


class FencingClock:
    """When a leadership term may acknowledge (see the module docstring). Thread-safe."""

    def __init__(
        self,
        ttl_s: float,
        acquired_sent_at_s: float,
        *,
        renew_fraction: float = RENEW_FRACTION,
        margin_fraction: float = MARGIN_FRACTION,
        clock: Clock = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise InvalidArgument(f"lease TTL must be positive, not {ttl_s}", field="ttl_s")
        if not 0 < renew_fraction < 1 - margin_fraction or margin_fraction <= 0:
            # The first renewal must be due before acknowledging stops.
            raise InvalidArgument(
                f"need 0 < renew fraction ({renew_fraction}) < 1 - margin fraction "
                f"({margin_fraction}) and a positive margin",
                field="renew_fraction",
            )
        self.ttl_s = ttl_s
        self.renew_interval_s = ttl_s * renew_fraction
        self.margin_s = ttl_s * margin_fraction
        self._clock = clock
        self._lock = threading.Lock()
        self._last_sent_s = acquired_sent_at_s
        self._over_reason: str | None = None

    @property
    def deadline_s(self) -> float:
        """The monotonic time from which this term acknowledges nothing."""
        return self._last_sent_s + self.ttl_s - self.margin_s

    @property
    def next_renewal_s(self) -> float:
        return self._last_sent_s + self.renew_interval_s

    @property
    def over_reason(self) -> str | None:
        """Why the term is over, or None while it is not (as last observed)."""
        return self._over_reason

    def now(self) -> float:
        return self._clock()

    def may_acknowledge(self, now: float | None = None) -> bool:
        """True while the term holds; the first call at or past the deadline ends it."""
        at = self._clock() if now is None else now
        with self._lock:
            if self._over_reason is not None:
                return False
            if at < self.deadline_s:
                return True
            self._over_reason = (
                f"fencing deadline passed: no renewal sent within "
                f"{self.ttl_s - self.margin_s:.3f} s (TTL {self.ttl_s} s - margin "
                f"{self.margin_s:.3f} s)"
            )
            return False

    def renewed(self, sent_at_s: float, answered_at_s: float | None = None) -> bool:
        """A renewal sent at `sent_at_s` succeeded, answered at `answered_at_s` (now when
        None). Moves the deadline to `sent_at_s + TTL - margin`; returns whether the term still
        holds. An answer at or past the deadline ends the term instead: it came too late."""
        answered = self._clock() if answered_at_s is None else answered_at_s
        if not self.may_acknowledge(answered):
            return False
        with self._lock:
            if self._over_reason is not None:
                return False
            self._last_sent_s = max(self._last_sent_s, sent_at_s)
            return True

    def end(self, reason: str) -> None:
        """The term is over (a failed renewal, a resignation); the first reason is kept."""
        with self._lock:
            if self._over_reason is None:
                self._over_reason = reason


class TermKeeper:
    """Renews a term's lease every `renew_interval_s` from a thread of its own.

    `may_acknowledge()` is the fence the replica checks before every acknowledgement. When the
    term ends on its own (deadline, lease or leader record gone, coordinator unreachable),
    `on_lost(reason)` is called once from the keeper's thread. `stop()` ends the term without
    calling it (the caller is resigning)."""

    def __init__(
        self,
        coordinator: Coordinator,
        term: Term,
        on_lost: Callable[[str], None],
        *,
        renew_fraction: float = RENEW_FRACTION,
        margin_fraction: float = MARGIN_FRACTION,
        clock: Clock = time.monotonic,
    ) -> None:
        self.term = term
        self.fence = FencingClock(
            term.ttl_s,
            term.acquired_sent_at_s,
            renew_fraction=renew_fraction,
            margin_fraction=margin_fraction,
            clock=clock,
        )
        self._coordinator = coordinator
        self._on_lost = on_lost
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"term-keeper-{term.group}-{term.epoch}", daemon=True
        )
        self.renewals = 0  # successful renewals, for metrics and tests

    def start(self) -> TermKeeper:
        self._thread.start()
        return self

    def may_acknowledge(self) -> bool:
        return self.fence.may_acknowledge()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the term here (nothing acknowledges after this returns) and stop renewing."""
        self.fence.end("stopped by its holder")
        self._stopping.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        reason = self._keep()
        if reason is None:
            return
        self.fence.end(reason)
        log.warning(
            "leadership of %s lost (epoch %d): %s", self.term.group, self.term.epoch, reason
        )
        self._on_lost(reason)

    def _keep(self) -> str | None:
        """Renew until the term ends; returns why it ended, or None when stopped."""
        while True:
            wait_s = self.fence.next_renewal_s - self._clock()
            if self._stopping.wait(max(0.0, wait_s)):
                return None
            sent = self._clock()
            if not self.fence.may_acknowledge(sent):
                return self.fence.over_reason or "fencing deadline passed"
            try:
                self._coordinator.renew(self.term, timeout_s=self.fence.deadline_s - sent)
            except MqstoreError as err:
                return f"renewal failed: {err}"
            if self._stopping.is_set():
                return None
            if not self.fence.renewed(sent):
                return self.fence.over_reason or "renewal answered past the fencing deadline"
            self.renewals += 1
