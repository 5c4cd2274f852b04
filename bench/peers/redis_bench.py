"""Redis Streams through redis-py with the hiredis parser, as in reference §2.

One stream key per (size, run), one field `d` per entry, auto ids; the keys are kept until the
server stops (Redis holds every stream in memory: its resident memory after the run shows it).
- produce: pipeline(transaction=False) with 1000 XADDs per execute().
- consume (both rows: Redis has one read path): XRANGE key min + COUNT 1000, the next page
  from "(" + the last id; every payload read.
- time lookup: XRANGE key <ms>-0 + COUNT 1 at a random ms within the stream.
- append-to-visible: XREAD BLOCK (a long poll) COUNT 1000 against a paced producer whose
  pipeline is sent once per tick.

redis-py is imported in the client processes only.
"""

from __future__ import annotations

import os
import random
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bench.meters import rss_mib
from bench.peers import pacing
from bench.peers.common import BATCH, SIZES, anon_mib
from bench.peers.context import Context
from bench.peers.servers import redis_server, running
from bench.processes import touch
from bench.report import percentile

FIELD = b"d"
LONG_POLL_MS = 2000
LOOKUP_WARM_UP = 20
DURABILITY = (
    "appendonly yes, appendfsync everysec, RDB snapshots off: a reply follows the write of "
    "the AOF (page cache); fsync once a second in the background"
)


PLAIN_DETAILS = {
    "produce": f"redis.Redis(); pipelines of {BATCH} XADDs",
    "consume": f"redis.Redis(); XRANGE pages of {BATCH}",
}


def _client(port: int) -> Any:
    import redis  # noqa: PLC0415 (client processes only)

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)


def _parser_name(r: Any) -> str:
    connection = r.connection_pool.get_connection()
    try:
        return type(connection._parser).__name__
    finally:
        r.connection_pool.release(connection)


def produce(port: int, key: str, size: int, n: int) -> dict[str, Any]:
    r = _client(port)
    body = os.urandom(size)
    ids: list[bytes] = []
    began = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {FIELD: body})
        if (i + 1) % BATCH == 0 or i + 1 == n:
            ids.extend(pipe.execute())
    took = time.perf_counter() - began
    if len(set(ids)) != n:
        raise RuntimeError(f"{key}: {len(set(ids))} distinct ids of {n}")
    parser = _parser_name(r)
    r.close()
    return {
        "rate": n / took,
        "seconds": took,
        "first_ms": int(ids[0].split(b"-")[0]),
        "last_ms": int(ids[-1].split(b"-")[0]),
        "parser": parser,
    }


def consume(port: int, key: str, n: int) -> dict[str, Any]:
    r = _client(port)
    count = body_bytes = 0
    began = time.perf_counter()
    low: bytes | str = "-"
    while True:
        page = r.xrange(key, min=low, max="+", count=BATCH)
        if not page:
            break
        for _id, fields in page:
            body_bytes += len(fields[FIELD])
        count += len(page)
        low = b"(" + page[-1][0]
    took = time.perf_counter() - began
    r.close()
    if count != n:
        raise RuntimeError(f"{key}: read {count} of {n}")
    return {"rate": n / took, "seconds": took, "body_bytes": body_bytes}


def plain_user(port: int, key: str, size: int, n: int) -> dict[str, Any]:
    """What a plain redis-py user writes: a client, XADDs pipelined by the thousand, then XRANGE
    pages of a thousand; each timed from its first call (the client made included)."""
    body = os.urandom(size)
    began = time.perf_counter()
    r = _client(port)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(key, {FIELD: body})
        if (i + 1) % BATCH == 0 or i + 1 == n:
            pipe.execute()
    produced = time.perf_counter()
    r.close()
    count = 0
    began_reading = time.perf_counter()
    r = _client(port)
    low: bytes | str = "-"
    while page := r.xrange(key, min=low, max="+", count=BATCH):
        count += len(page)
        low = b"(" + page[-1][0]
    read = time.perf_counter()
    r.close()
    if count != n:
        raise RuntimeError(f"{key}: read {count} of {n}")
    return {
        "produce_rate": n / (produced - began),
        "consume_rate": n / (read - began_reading),
    }


def lookups(port: int, key: str, first_ms: int, last_ms: int, count: int) -> dict[str, Any]:
    r = _client(port)
    rng = random.Random(8)
    times: list[float] = []
    found = 0
    for i in range(LOOKUP_WARM_UP + count):
        ms = rng.randint(first_ms, last_ms)
        began = time.perf_counter()
        page = r.xrange(key, min=f"{ms}-0", max="+", count=1)
        took_ms = (time.perf_counter() - began) * 1000
        if i >= LOOKUP_WARM_UP:
            times.append(took_ms)
            found += len(page)
    r.close()
    return {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99), "found": found}


def visible_consumer(port: int, key: str, n: int, ready: str) -> dict[str, Any]:
    r = _client(port)
    r.ping()
    latencies = pacing.Arrivals()
    last_id: bytes | str = "0-0"  # the key does not exist yet: XREAD waits for it
    touch(ready)
    deadline = time.monotonic() + pacing.READY_TIMEOUT_S + n / 100
    while len(latencies) < n and time.monotonic() < deadline:
        answer = r.xread({key: last_id}, count=BATCH, block=LONG_POLL_MS)
        now = time.time_ns()
        for _key, entries in answer:
            for entry_id, fields in entries:
                stamp = pacing.sent_ns(fields[FIELD])
                latencies.add(stamp, now)
                last_id = entry_id
    r.close()
    return pacing.summarize(latencies, n)


def visible_producer(port: int, key: str, size: int, rate: float, n: int) -> dict[str, Any]:
    r = _client(port)
    make = pacing.body_maker(size)
    pipe = r.pipeline(transaction=False)
    stored = [0]

    def send() -> None:
        pipe.xadd(key, {FIELD: make()})

    def tick() -> None:
        stored[0] += len(pipe.execute())

    took = pacing.paced(rate, n, send, tick)
    r.close()
    if stored[0] != n:
        raise RuntimeError(f"{key}: stored {stored[0]} of {n}")
    return {"achieved": n / took, "seconds": took}


def run(ctx: Context) -> None:
    server = redis_server(ctx.root)
    scale, results = ctx.scale, ctx.results
    with running(server):
        servers = {"redis-server": server.pid}
        port = server.port
        try:
            hiredis = f"hiredis {version('hiredis')}"
        except PackageNotFoundError:
            hiredis = "no hiredis (pure-Python parser)"
        results.describe("redis", f"{server.version()}; redis-py {version('redis')}, {hiredis}")
        results.describe("redis", DURABILITY)
        for run_no in range(scale.runs):
            for size in SIZES:
                key = f"bench:{size}:{run_no}"
                ctx.say(f"redis: run {run_no + 1}/{scale.runs}, {size} B")
                made, m = ctx.measure(servers, produce, port, key, size, scale.messages)
                results.describe("redis", f"redis-py parser {made['parser']}")
                results.add(
                    "produce",
                    size,
                    "redis",
                    made["rate"],
                    m.foreign_cores,
                    f"pipelined XADD, {BATCH} a round trip",
                    **made,
                )
                got, m = ctx.measure(servers, consume, port, key, scale.messages)
                detail = f"XRANGE pages of {BATCH}"
                results.add("consume", size, "redis", got["rate"], m.foreign_cores, detail, **got)
                detail = f"XRANGE pages of {BATCH} (same runs: one read path)"
                results.add("consume_fast", size, "redis", got["rate"], m.foreign_cores, detail)
                plain, m = ctx.measure(
                    servers, plain_user, port, f"plain:{size}:{run_no}", size, scale.messages
                )
                for workload in ("produce", "consume"):
                    results.add(
                        f"plain_{workload}",
                        size,
                        "redis",
                        plain[f"{workload}_rate"],
                        m.foreign_cores,
                        PLAIN_DETAILS[workload],
                        **plain,
                    )
                got, m = ctx.measure(
                    servers,
                    lookups,
                    port,
                    key,
                    made["first_ms"],
                    made["last_ms"],
                    scale.lookups,
                )
                detail = "XRANGE <ms>-0 + COUNT 1"
                for q in ("p50", "p99"):
                    results.add(
                        f"lookup_{q}", size, "redis", got[f"{q}_ms"], m.foreign_cores, detail, **got
                    )
        for run_no in range(scale.runs):
            for size in SIZES:
                rate = ctx.visible_rates[size]
                n = max(1, round(rate * scale.visible_s))
                key = f"visible:{size}:{run_no}"
                ctx.say(f"redis: append-to-visible {run_no + 1}/{scale.runs}, {size} B")
                ready = str(ctx.root / f"redis-{size}-{run_no}.ready")
                sent, seen, m = ctx.measure_pair(
                    servers,
                    (visible_consumer, (port, key, n, ready)),
                    (visible_producer, (port, key, size, rate, n)),
                    ready,
                )
                detail = "paced XADD, one pipeline a tick; XREAD BLOCK COUNT 1000"
                raw = {**seen, **sent, "offered": rate}
                for q in ("p50", "p99"):
                    results.add(
                        f"visible_{q}",
                        size,
                        "redis",
                        seen[f"{q}_ms"],
                        m.foreign_cores,
                        detail,
                        **raw,
                    )
        memory = rss_mib(server.pid)
        results.add(
            "memory",
            0,
            "redis",
            anon_mib(memory),
            0.0,
            "redis-server anonymous RSS (holds every stream in memory)",
            pid=server.pid,
            **memory,
        )
