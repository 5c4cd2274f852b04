"""Append-to-visible, the same way for every system: a producer process sends messages at a
fixed rate, each body starting with time.time_ns() read just before it is handed to the client
library; a consumer process long-polls and notes when each message arrives. Latency = arrival
minus that stamp (both processes on this machine: one clock).

The producer is paced by 1 ms ticks: at each tick it sends every message due by then (the rate
times the time since the start), then sleeps until the next tick. A system's client may batch
what it is given (the mqstore Producer gets each tick's messages as one send_batch and lingers
up to 5 ms, a Redis pipeline is sent once per tick, nats-py publishes each): that delay is
part of what a user of the library sees, so it is measured.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from array import array
from collections.abc import Awaitable, Callable
from typing import Any

from bench.report import percentile

STAMP = struct.Struct(">Q")
# The producer wakes once a tick (not once a message: at tens of thousands of messages a
# second, sleeping until each next one was due cost the loop alone a quarter of a core here).
TICK_S = 0.001
# Most messages one tick sends: a producer that fell behind catches up in bounded steps.
TICK_MESSAGES_MAX = 1000
READY_TIMEOUT_S = 60.0


def body_maker(size: int) -> Callable[[], bytes]:
    pad = os.urandom(size - STAMP.size)

    def make() -> bytes:
        return STAMP.pack(time.time_ns()) + pad

    return make


def sent_ns(body: bytes) -> int:
    return int(STAMP.unpack_from(body)[0])


def paced(rate: float, count: int, send: Callable[[], None], tick: Callable[[], None]) -> float:
    """Call `send` `count` times at `rate` per second, `tick` after each tick's sends; returns
    the seconds it took."""
    began = time.perf_counter()
    sent = 0
    while sent < count:
        due = min(count, int((time.perf_counter() - began) * rate) + 1, sent + TICK_MESSAGES_MAX)
        while sent < due:
            send()
            sent += 1
        tick()
        if sent < count:
            time.sleep(_until_next_tick(began))
    return time.perf_counter() - began


async def paced_async(
    rate: float, count: int, send: Callable[[], Awaitable[Any]], tick: Callable[[], Awaitable[Any]]
) -> float:
    """`paced` for asyncio clients: sleeping yields to the client's own tasks."""
    began = time.perf_counter()
    sent = 0
    while sent < count:
        due = min(count, int((time.perf_counter() - began) * rate) + 1, sent + TICK_MESSAGES_MAX)
        while sent < due:
            await send()
            sent += 1
        await tick()
        if sent < count:
            await asyncio.sleep(_until_next_tick(began))
    return time.perf_counter() - began


def _until_next_tick(began: float) -> float:
    """Seconds to the next tick boundary (began + k * TICK_S)."""
    elapsed = time.perf_counter() - began
    return (int(elapsed / TICK_S) + 1) * TICK_S - elapsed


class Arrivals:
    """When each message received was sent, and its latency (ns), in two int64 arrays. A list
    of tuples is objects the consumer's collector walks at each full collection: 400,000 of
    them made the harness's own pauses (tens of ms, more as the run went on) part of what
    it measured, in every system's consumer alike."""

    __slots__ = ("latency", "sent")

    def __init__(self) -> None:
        self.sent = array("q")
        self.latency = array("q")

    def add(self, sent_ns: int, now_ns: int) -> None:
        self.sent.append(sent_ns)
        self.latency.append(now_ns - sent_ns)

    def __len__(self) -> int:
        return len(self.sent)


def summarize(arrivals: Arrivals, expected: int) -> dict[str, Any]:
    """Every message received -> p50 / p99 / max in ms, and the p50 of the first and last
    fifth sent: latency growing through the run means the offered load is more than the
    system sustains (flagged `saturated`)."""
    if len(arrivals) != expected:
        raise RuntimeError(f"received {len(arrivals)} messages, expected {expected}")
    order = sorted(range(len(arrivals)), key=arrivals.sent.__getitem__)
    by_sending = [arrivals.latency[i] / 1e6 for i in order]
    fifth = max(1, len(by_sending) // 5)
    first = percentile(by_sending[:fifth], 0.5)
    last = percentile(by_sending[-fifth:], 0.5)
    return {
        "received": len(by_sending),
        "p50_ms": percentile(by_sending, 0.5),
        "p99_ms": percentile(by_sending, 0.99),
        "max_ms": max(by_sending),
        "first_fifth_p50_ms": first,
        "last_fifth_p50_ms": last,
        "saturated": last > 2 * first + 20,
    }
