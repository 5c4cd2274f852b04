"""Pauses between retries: the first, then each twice the one before, up to a ceiling.

    first_s, 2 * first_s, 4 * first_s, ... max_s, max_s, ...    (reset(): first_s again)

One helper for every retry loop of the package: the producer's stream, the consumer's outage,
the cq/index subscription to the commit log and the Spark writer's Append. Each loop keeps its
own policy (when to reset, when to give up); this only says how long to wait next. No I/O:
the caller sleeps (or waits on an event) for the pause it is given.
"""

from __future__ import annotations

# The SDK's and the Spark writer's pauses: a failover takes a fraction of a second to a few
# (a lease TTL is 2 s), so waiting more than a second after it would only add latency.
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 1.0


class Backoff:
    """The pause before the next attempt (`pause_s`), doubling after each one taken."""

    __slots__ = ("first_s", "max_s", "pause_s")

    def __init__(self, first_s: float = BACKOFF_FIRST_S, max_s: float = BACKOFF_MAX_S) -> None:
        if not 0 < first_s <= max_s:
            raise ValueError(f"a backoff needs 0 < first_s <= max_s (got {first_s}, {max_s})")
        self.first_s = first_s
        self.max_s = max_s
        self.pause_s = first_s  # the pause the next attempt waits

    def next_s(self) -> float:
        """The pause to take now; the one after it is twice as long (at most max_s)."""
        pause = self.pause_s
        self.grow()
        return pause

    def grow(self) -> None:
        """The pause just taken is over: the next is twice as long (at most max_s)."""
        self.pause_s = min(self.pause_s * 2, self.max_s)

    def reset(self) -> None:
        """An attempt succeeded: the next failure waits first_s again."""
        self.pause_s = self.first_s
