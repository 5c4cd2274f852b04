"""NATS JetStream through nats-py (asyncio), as in reference §1.

One stream per (size, run), one subject, file storage, limits retention, allow_direct.
- produce: js.publish_async() for every message, up to 16,000 acks outstanding
  (publish_async_max_pending; wait_stall None, see the reference), then
  publish_async_completed(); every ack checked.
- consume, pull API: ephemeral pull consumer, ack_policy none, fetch(batch=1000) to the end.
- consume, fastest path: ordered push consumer (flow controlled, no acks) with a callback.
- time lookup: an ephemeral pull consumer with deliver_policy by_start_time at a random time
  within the stream, then fetch(1); the consumer is deleted afterwards, outside the clock.
- append-to-visible: a long-polling pull consumer (fetch(1000) waits on the server) against a
  paced publish_async producer.

The client functions run in worker processes; nats-py is imported there only, so that the rest
of the harness runs without the `bench` extra.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import time
from importlib.metadata import version
from typing import Any

from bench.meters import rss_mib
from bench.peers import pacing
from bench.peers.common import BATCH, SIZES, anon_mib
from bench.peers.context import Context
from bench.peers.servers import nats_server, running
from bench.processes import touch
from bench.report import percentile

PUBLISH_PENDING_MAX = 16_000  # the reference's publish_async_max_pending
FETCH_TIMEOUT_S = 10.0
LONG_POLL_S = 2.0
LOOKUP_WARM_UP = 5
DURABILITY = (
    "JetStream file store (nats-server defaults): a publish is acked once the server stored "
    "it, no fsync per message (the file store syncs on its own background interval)"
)


def _nats() -> Any:
    """nats-py, imported in the client processes only."""
    import nats  # noqa: PLC0415 - the `bench` extra: imported only when NATS is measured
    import nats.errors  # noqa: PLC0415 - see above
    import nats.js.api  # noqa: PLC0415 - see above
    import nats.js.errors  # noqa: PLC0415 - see above

    return nats


async def _connect(url: str) -> Any:
    return await _nats().connect(url, allow_reconnect=False, connect_timeout=10)


def _consumer_config(**options: Any) -> Any:
    api = _nats().js.api
    return api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, **options)


async def _add_stream(js: Any, stream: str, subject: str) -> None:
    storage = _nats().js.api.StorageType.FILE
    await js.add_stream(name=stream, subjects=[subject], storage=storage, allow_direct=True)


def produce(url: str, stream: str, subject: str, size: int, n: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nc = await _connect(url)
        try:
            js = nc.jetstream(publish_async_max_pending=PUBLISH_PENDING_MAX)
            await _add_stream(js, stream, subject)
            body = os.urandom(size)
            futures = []
            began = time.perf_counter()
            for _ in range(n):
                futures.append(await js.publish_async(subject, body))
            await js.publish_async_completed()
            took = time.perf_counter() - began
            seqs = [f.result().seq for f in futures]  # raises on a failed publish
            if len(set(seqs)) != n:
                raise RuntimeError(f"{stream}: {len(set(seqs))} distinct acks of {n}")
            first = await js.get_msg(stream, seq=1)
            last = await js.get_msg(stream, seq=n)
            return {
                "rate": n / took,
                "seconds": took,
                "first_ms": int(first.time.timestamp() * 1000),
                "last_ms": int(last.time.timestamp() * 1000),
            }
        finally:
            await nc.close()

    return asyncio.run(main())


def pull(url: str, stream: str, subject: str, n: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nc = await _connect(url)
        try:
            js = nc.jetstream()
            began = time.perf_counter()
            config = _consumer_config(deliver_policy=_nats().js.api.DeliverPolicy.ALL)
            sub = await js.pull_subscribe(subject, stream=stream, config=config)
            count = body_bytes = 0
            while count < n:
                msgs = await sub.fetch(BATCH, timeout=FETCH_TIMEOUT_S)
                count += len(msgs)
                body_bytes += sum(len(m.data) for m in msgs)
            took = time.perf_counter() - began
            if count != n:
                raise RuntimeError(f"{stream}: pulled {count} of {n}")
            return {"rate": n / took, "seconds": took, "body_bytes": body_bytes}
        finally:
            await nc.close()

    return asyncio.run(main())


def push(url: str, stream: str, subject: str, n: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nc = await _connect(url)
        try:
            js = nc.jetstream()
            done = asyncio.Event()
            got = [0, 0]  # messages, body bytes

            async def on_message(msg: Any) -> None:
                got[0] += 1
                got[1] += len(msg.data)
                if got[0] >= n:
                    done.set()

            began = time.perf_counter()
            sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, cb=on_message)
            await asyncio.wait_for(done.wait(), timeout=FETCH_TIMEOUT_S + n / 1000)
            took = time.perf_counter() - began
            await sub.unsubscribe()
            if got[0] != n:
                raise RuntimeError(f"{stream}: pushed {got[0]} of {n}")
            return {"rate": n / took, "seconds": took, "body_bytes": got[1]}
        finally:
            await nc.close()

    return asyncio.run(main())


# nats-server 2.9 sometimes fails to delete a consumer's directory ("unlinkat ...: directory
# not empty", err_code 10051) when asked right after its fetch; the delete is off the clock.
_DELETE_ATTEMPTS = 5
_DELETE_RETRY_S = 0.05


async def _delete_consumer(js: Any, stream: str, name: str) -> None:
    for attempt in range(_DELETE_ATTEMPTS):
        try:
            await js.delete_consumer(stream, name)
            return
        except _nats().js.errors.ServerError as err:
            if "directory not empty" not in str(err) or attempt == _DELETE_ATTEMPTS - 1:
                raise
            await asyncio.sleep(_DELETE_RETRY_S)


def lookups(
    url: str, stream: str, subject: str, first_ms: int, last_ms: int, count: int
) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        rng = random.Random(8)
        by_start_time = _nats().js.api.DeliverPolicy.BY_START_TIME
        nc = await _connect(url)
        times: list[float] = []
        found = 0
        try:
            js = nc.jetstream()
            for i in range(LOOKUP_WARM_UP + count):
                at = dt.datetime.fromtimestamp(rng.randint(first_ms, last_ms) / 1000, dt.UTC)
                config = _consumer_config(deliver_policy=by_start_time, opt_start_time=at)
                began = time.perf_counter()
                sub = await js.pull_subscribe(subject, stream=stream, config=config)
                msgs = await sub.fetch(1, timeout=FETCH_TIMEOUT_S)
                took_ms = (time.perf_counter() - began) * 1000
                await _delete_consumer(js, stream, config.name)  # pull_subscribe named it
                await sub.unsubscribe()
                if i >= LOOKUP_WARM_UP:
                    times.append(took_ms)
                    found += len(msgs)
        finally:
            await nc.close()
        return {"p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99), "found": found}

    return asyncio.run(main())


def visible_consumer(url: str, stream: str, subject: str, n: int, ready: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nats = _nats()
        nc = await _connect(url)
        latencies = pacing.Arrivals()
        try:
            js = nc.jetstream()
            await _add_stream(js, stream, subject)
            config = _consumer_config(deliver_policy=nats.js.api.DeliverPolicy.ALL)
            sub = await js.pull_subscribe(subject, stream=stream, config=config)
            touch(ready)
            deadline = time.monotonic() + pacing.READY_TIMEOUT_S + n / 100
            while len(latencies) < n and time.monotonic() < deadline:
                try:
                    msgs = await sub.fetch(BATCH, timeout=LONG_POLL_S)
                except nats.errors.TimeoutError:
                    continue
                now = time.time_ns()
                for m in msgs:
                    stamp = pacing.sent_ns(m.data)
                    latencies.add(stamp, now)
        finally:
            await nc.close()
        return pacing.summarize(latencies, n)

    return asyncio.run(main())


def visible_producer(url: str, subject: str, size: int, rate: float, n: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        nc = await _connect(url)
        try:
            js = nc.jetstream(publish_async_max_pending=PUBLISH_PENDING_MAX)
            make = pacing.body_maker(size)
            futures = []

            async def send() -> None:
                futures.append(await js.publish_async(subject, make()))

            async def tick() -> None:
                return None  # nats-py's flusher task writes what was published

            took = await pacing.paced_async(rate, n, send, tick)
            await js.publish_async_completed()
            for f in futures:
                f.result()
            return {"achieved": n / took, "seconds": took}
        finally:
            await nc.close()

    return asyncio.run(main())


def run(ctx: Context) -> None:
    server = nats_server(ctx.root)
    scale, results = ctx.scale, ctx.results
    with running(server):
        servers = {"nats-server": server.pid}
        url = server.url
        results.describe("nats", f"{server.version()}; nats-py {version('nats-py')}")
        results.describe("nats", DURABILITY)
        for run_no in range(scale.runs):
            for size in SIZES:
                stream, subject = f"B{size}R{run_no}", f"bench.{size}.{run_no}"
                ctx.say(f"nats: run {run_no + 1}/{scale.runs}, {size} B")
                made, m = ctx.measure(servers, produce, url, stream, subject, size, scale.messages)
                results.add(
                    "produce",
                    size,
                    "nats",
                    made["rate"],
                    m.foreign_cores,
                    f"publish_async, up to {PUBLISH_PENDING_MAX:,} acks pending",
                    **made,
                )
                got, m = ctx.measure(servers, pull, url, stream, subject, scale.messages)
                results.add(
                    "consume",
                    size,
                    "nats",
                    got["rate"],
                    m.foreign_cores,
                    "pull consumer, fetch(1000)",
                    **got,
                )
                got, m = ctx.measure(servers, push, url, stream, subject, scale.messages)
                results.add(
                    "consume_fast",
                    size,
                    "nats",
                    got["rate"],
                    m.foreign_cores,
                    "ordered push consumer",
                    **got,
                )
                got, m = ctx.measure(
                    servers,
                    lookups,
                    url,
                    stream,
                    subject,
                    made["first_ms"],
                    made["last_ms"],
                    scale.lookups,
                )
                detail = "consumer by_start_time + fetch(1)"
                results.add(
                    "lookup_p50", size, "nats", got["p50_ms"], m.foreign_cores, detail, **got
                )
                results.add(
                    "lookup_p99", size, "nats", got["p99_ms"], m.foreign_cores, detail, **got
                )
        for run_no in range(scale.runs):
            for size in SIZES:
                rate = ctx.visible_rates[size]
                n = max(1, round(rate * scale.visible_s))
                stream, subject = f"V{size}R{run_no}", f"visible.{size}.{run_no}"
                ctx.say(f"nats: append-to-visible {run_no + 1}/{scale.runs}, {size} B")
                ready = str(ctx.root / f"nats-{stream}.ready")
                sent, seen, m = ctx.measure_pair(
                    servers,
                    (visible_consumer, (url, stream, subject, n, ready)),
                    (visible_producer, (url, subject, size, rate, n)),
                    ready,
                )
                detail = "paced publish_async; pull consumer long-polling fetch(1000)"
                raw = {**seen, **sent, "offered": rate}
                results.add(
                    "visible_p50", size, "nats", seen["p50_ms"], m.foreign_cores, detail, **raw
                )
                results.add(
                    "visible_p99", size, "nats", seen["p99_ms"], m.foreign_cores, detail, **raw
                )
        memory = rss_mib(server.pid)
        results.add(
            "memory",
            0,
            "nats",
            anon_mib(memory),
            0.0,
            "nats-server anonymous RSS",
            pid=server.pid,
            **memory,
        )
