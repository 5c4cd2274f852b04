"""A consumer's calls to the consume queues, carried through outages.

Every call goes through `Connection.call_cq` (which tries the next cq replica on UNAVAILABLE).
When every replica is unavailable, the consumer backs off (mqstore/backoff.py) and asks again;
after `reconnect_timeout_s` of nothing but UNAVAILABLE it raises Unavailable. A store never
reached since the connection was made (still starting, or a wrong address or TLS setting) is
told after connect_timeout_s instead, and once.

    retry = OutageRetry(conn, topic, reconnect_timeout_s, stats)
    retry.call(lambda s: s.FetchOffset, request, "ConsumeQueue/FetchOffset")  # retried
    retry.retry(fn)                  # fn() again after each pause, until it answers
    retry.back_off(err, deadline)    # one pause; False when `deadline` comes first
    retry.recovered()                # an answer came: the outage (if any) is over

One OutageRetry serves a Consumer and the SimpleConsumer inside it: one outage clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from mqstore.backoff import Backoff
from mqstore.client.answers import ConsumerStats
from mqstore.client.connection import Connection
from mqstore.client.errors import StoreUnreachable, Unavailable
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc as pb_grpc

log = logging.getLogger("mqstore.client.consumer")

T = TypeVar("T")

# A restart of cq_svc (replay included) or commitlog_svc takes seconds: 30 s of nothing but
# UNAVAILABLE is an outage worth telling the caller about.
RECONNECT_TIMEOUT_S_DEFAULT = 30.0


class OutageRetry:
    def __init__(
        self, conn: Connection, topic: str, reconnect_timeout_s: float, stats: ConsumerStats
    ) -> None:
        self.conn = conn
        self.topic = topic
        self.reconnect_timeout_s = reconnect_timeout_s
        self.stats = stats
        self._outage_since: float | None = None
        self._backoff = Backoff()  # between attempts while every replica is unavailable

    def timeout_s(self, long_poll_ms: int) -> float:
        """The deadline of a call that may wait `long_poll_ms` on the server."""
        return self.conn.settings.timeout_s + long_poll_ms / 1000.0

    def call(
        self,
        pick: Callable[[pb_grpc.ConsumeQueueStub], Callable[..., T]],
        request: object,
        name: str,
        *,
        timeout_s: float | None = None,
    ) -> T:
        """One consume-queue call, retried through outages."""
        return self.retry(lambda: self.conn.call_cq(pick, request, name=name, timeout_s=timeout_s))

    def retry(self, call: Callable[[], T]) -> T:
        """`call`, again after a pause while every replica answers UNAVAILABLE, until
        reconnect_timeout_s of that."""
        while True:
            try:
                out = call()
            except Unavailable as err:
                self.back_off(err, None)
                continue
            self.recovered()
            return out

    def back_off(self, err: Unavailable, deadline: float | None) -> bool:
        """Pause before the next attempt. False when `deadline` comes first (the caller gives
        up for now); raises Unavailable once the outage has lasted reconnect_timeout_s."""
        now = time.monotonic()
        settings = self.conn.settings
        # Never reached since the connection was made: a store still starting, or a wrong
        # address or TLS setting, told after connect_timeout_s (not a restart's allowance) and
        # once (no warning before the error).
        never_reached = isinstance(err, StoreUnreachable) and not self.conn.reached
        if self._outage_since is None:
            self._outage_since = now
            self._backoff.reset()
            if not never_reached:
                log.warning("%s: consume queues unavailable (%s); retrying", self.topic, err)
        give_up = self._outage_since + self.reconnect_timeout_s
        if never_reached:
            give_up = min(give_up, self._outage_since + settings.connect_timeout_s)
            if now >= give_up:
                self._outage_since = None
                raise err
        if now >= give_up:
            self._outage_since = None
            raise Unavailable(
                f"no consume-queue replica answered for {self.reconnect_timeout_s:g} s "
                f"({', '.join(settings.cq)}): {err.details}",
                method=err.method,
            ) from err
        pause = min(self._backoff.pause_s, give_up - now)
        # Counted whether the next attempt comes after this pause or in the caller's next
        # call: a failure that always lands near the deadline (a Follow that waits it out, then
        # fails) is counted too, so that `retries` shows the outage.
        self.stats.retries += 1
        if deadline is not None and now + pause > deadline:
            return False
        time.sleep(pause)
        self._backoff.grow()
        return True

    def recovered(self) -> None:
        if self._outage_since is not None:
            log.info(
                "%s: consume queues answer again after %.1f s",
                self.topic,
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            self.stats.reconnects += 1
