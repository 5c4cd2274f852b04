"""Everything a chaos run decides, drawn from one `random.Random(seed)` before the run starts.

    Plan(seed)
      cycles       per cycle: which service(s) to kill (commitlog, cq, index or all), when (a
                   delay after the cycle starts, or a number of acknowledged messages), under
                   which load (paced, or a burst), how long they stay down, whether they are
                   killed again while recovering; under async flush also "torn" cycles: the
                   commit log killed and its unflushed tail damaged (how many bytes, whether
                   cq_svc and index_svc are frozen across it, and whether they are thawed
                   as soon as the log grew past the cut)
      salt         64 bits that, with (producer, n), fix every message: topic, size, key,
                   queue, unique id and body (`message(salt, producer, n)`)
      samples      the keys whose index answers are checked at the end

Drawing the whole schedule up front is what makes a seed replayable: the producers are threads,
and a random generator shared between them would hand out its numbers in whatever order the
threads happen to run. Messages are a pure function of (salt, producer, n) instead, so a body
can be regenerated from its header rather than kept in memory, and a run replays the same
messages in the same order per producer. What a seed cannot fix is the timing of real
processes: where exactly in the log a kill lands, how many messages were in flight, how long a
restart takes. A replay runs the same schedule against the same load, not the same
interleaving.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Final, Literal

from mqstore.formats.javahash import java_string_hash

Target = Literal["commitlog", "cq", "index", "all", "producer", "torn"]
TriggerKind = Literal["delay", "acks"]

# The services each target kills; "all" kills them in an order the plan shuffles.
SERVICES: Final = ("commitlog", "cq", "index")
# The commit log is the one whose crash can lose acknowledged data: it is killed most often.
TARGET_WEIGHTS: Final[dict[Target, int]] = {"commitlog": 4, "cq": 2, "index": 2, "all": 2}
# With producer restarts (opt-in, --producer-restarts): a cycle may instead close one producer
# and open a new SDK Producer under the same producer id, as a restarted client process does.
PRODUCER_RESTART_WEIGHT: Final = 2
# Under async flush only: a cycle may instead kill the commit log and zero part of its unflushed
# tail before the restart (chaos/torn.py), so that recovery cuts the log and the appends after it
# regrow the same offsets. Under sync flush dispatch stops at the flushed offset: no follower
# ever holds an unflushed byte, and no acknowledgement lies above the flushed offset.
TORN_WEIGHT: Final = 3
# Bytes a torn cycle zeroes at the end of the written data (never below the flushed offset nor
# before the newest segment, so often fewer): inside one record, a record or two, a few, a page,
# many, past all the unflushed data.
TORN_ZERO_BYTES: Final = (1, 100, 300, 4096, 65536, 1 << 20)
# The share of torn cycles that SIGSTOP cq_svc and index_svc from before the kill until the log
# has regrown past where it was cut (issue 23's reproduction: they wake into a rewritten log).
TORN_FREEZE_SHARE: Final = 0.5
# The share of frozen torn cycles that thaw the followers as soon as the restarted log has grown
# past the cut, rather than once it has regrown past its old end: they wake with entries past
# the log's end (their handshake truncates there) and entries in the regrown part below it
# (only the truncation where the histories part drops those).
TORN_EARLY_THAW_SHARE: Final = 0.5
TOPICS: Final = ("chaos_a", "chaos_b")
QUEUES: Final = 4  # the SDK's queues_per_topic default (RocketMQ's defaultTopicQueueNums)
KEY_POOL: Final = 32  # keys per run: a key gathers ~1/50 of the messages (index chains)

# A cycle's trigger: a delay after the cycle starts, or a count of acknowledged messages.
TRIGGER_DELAY_S_RANGE: Final = (0.2, 3.0)
TRIGGER_ACKS_RANGE: Final = (20, 1500)
# Half the kills restart at once (a crash loop), the others after a pause in which clients
# pile up retries.
DOWN_S_RANGE: Final = (0.05, 1.0)
IMMEDIATE_RESTART_SHARE: Final = 0.5
# Some kills hit the restarted process again while it recovers (start-up, recovery, replay):
# a Python service takes about a second to import and open its store.
REKILL_SHARE: Final = 0.15
REKILL_S_RANGE: Final = (0.05, 1.5)
# In a burst cycle the producers send as fast as they can (up to their in-flight window)
# instead of at their rate, so that the kill lands among large batches and full pipelines.
# A burst runs at ~10,000 msg/s here: its delay trigger is kept short, so that a burst adds a
# few thousand messages, and a long run's store stays a few GB.
BURST_SHARE: Final = 0.25
BURST_DELAY_S_RANGE: Final = (0.1, 0.8)

# Message shapes: mostly small, some over a page, a few over the SDK's 4 KiB compression
# threshold (stored compressed, read back decompressed).
SMALL_BYTES: Final = (24, 256)
MEDIUM_BYTES: Final = (257, 4096)
LARGE_BYTES: Final = (4097, 65536)
SMALL_SHARE_OF_256: Final = 179  # 70 %
MEDIUM_SHARE_OF_256: Final = 64  # 25 %; the remaining 5 % are large
KEYED_SHARE_OF_256: Final = 154  # 60 % of the messages carry a key


@dataclass(frozen=True, slots=True)
class CyclePlan:
    index: int  # 1-based
    target: Target
    trigger: TriggerKind
    delay_s: float  # with trigger "delay"
    acks: int  # with trigger "acks"
    down_s: float  # between the kill and the restart
    rekill_s: float | None  # kill again this long after the restart began
    kill_order: tuple[str, ...]  # the services, in the order they are killed
    burst: bool = False  # the producers send unpaced until the kill
    victim: int = 0  # with target "producer": which one (modulo the number of producers)
    zero_bytes: int = 0  # with target "torn": how many bytes of the tail to zero (at most)
    freeze: bool = False  # with target "torn": SIGSTOP cq_svc and index_svc across it
    early_thaw: bool = False  # with freeze: SIGCONT once the log grew past the cut at all

    def describe(self) -> str:
        when = (
            f"after {self.delay_s:.2f} s" if self.trigger == "delay" else f"after {self.acks} acks"
        )
        load = " of a burst" if self.burst else ""
        down = f"down {self.down_s:.2f} s" if self.down_s else "restart at once"
        again = f", killed again {self.rekill_s:.2f} s into recovery" if self.rekill_s else ""
        if self.target == "producer":
            return f"restart producer {self.victim} under its id {when}{load}"
        if self.target == "torn":
            frozen = ""
            if self.freeze:
                until = "it grew past the cut" if self.early_thaw else "it regrew"
                frozen = f", cq and index frozen until {until}"
            tear = f"tear the log's unflushed tail (up to {self.zero_bytes} B)"
            return f"{tear} {when}{load}{frozen}, {down}"
        return f"kill {'+'.join(self.kill_order)} {when}{load}, {down}{again}"


@dataclass(frozen=True, slots=True)
class Plan:
    seed: int
    salt: int
    cycles: tuple[CyclePlan, ...]
    key_sample: tuple[str, ...]  # keys whose index answers are compared with the log
    producer_restarts: bool = False
    torn: bool = False  # torn-tail cycles may be drawn (async flush)


def make_plan(
    seed: int,
    cycles: int,
    *,
    producers: int = 2,
    producer_restarts: bool = False,
    torn: bool = False,
) -> Plan:
    """The seed's schedule. `torn` (async flush only) adds torn-tail cycles; without it a seed
    draws exactly what it drew before they existed, so that old sync seeds replay."""
    rng = random.Random(seed)
    salt = rng.getrandbits(64)
    weighted = dict(TARGET_WEIGHTS)
    if producer_restarts:
        weighted["producer"] = PRODUCER_RESTART_WEIGHT
    if torn:
        weighted["torn"] = TORN_WEIGHT
    targets = list(weighted)
    weights = list(weighted.values())
    out = []
    for i in range(1, cycles + 1):
        target = rng.choices(targets, weights)[0]
        trigger: TriggerKind = "delay" if rng.random() < 0.5 else "acks"
        burst = rng.random() < BURST_SHARE
        delay_s = round(rng.uniform(*(BURST_DELAY_S_RANGE if burst else TRIGGER_DELAY_S_RANGE)), 3)
        acks = rng.randint(*TRIGGER_ACKS_RANGE)
        down_s = 0.0 if rng.random() < IMMEDIATE_RESTART_SHARE else rng.uniform(*DOWN_S_RANGE)
        rekill_s = rng.uniform(*REKILL_S_RANGE) if rng.random() < REKILL_SHARE else None
        victim = rng.randrange(producers)
        zero_bytes, freeze, early_thaw = 0, False, False
        if torn:  # drawn for every cycle of an async plan, so the draws stay in step
            zero_bytes = rng.choice(TORN_ZERO_BYTES)
            freeze = rng.random() < TORN_FREEZE_SHARE
            early_thaw = freeze and rng.random() < TORN_EARLY_THAW_SHARE
        if target == "torn":
            rekill_s = None  # the check is of one cut; a kill in recovery is the commit log's
        else:
            zero_bytes, freeze, early_thaw = 0, False, False
        if target == "all":
            order = list(SERVICES)
            rng.shuffle(order)
            kill_order = tuple(order)
        elif target == "torn":
            kill_order = ("commitlog",)
        else:
            kill_order = (target,)
        out.append(
            CyclePlan(
                index=i,
                target=target,
                trigger=trigger,
                delay_s=delay_s,
                acks=acks,
                down_s=round(down_s, 3),
                rekill_s=None if rekill_s is None else round(rekill_s, 3),
                kill_order=kill_order,
                burst=burst,
                victim=victim,
                zero_bytes=zero_bytes,
                freeze=freeze,
                early_thaw=early_thaw,
            )
        )
    sample = tuple(sorted(rng.sample(all_keys(), k=KEY_POOL // 2)))
    return Plan(seed, salt, tuple(out), sample, producer_restarts, torn)


def all_keys() -> list[str]:
    return [f"key-{i}" for i in range(KEY_POOL)]


# -- messages ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """Message n of producer p: what it sends, and what any read of it must give back."""

    producer: int
    n: int
    topic: str
    key: str | None
    queue_id: int  # where it must land (keyed: the SDK's hash of the key)
    explicit_queue: bool  # sent with queue_id= (unkeyed), else placed by the key
    uniq_key: str
    body: bytes


def message(salt: int, producer: int, n: int) -> MessageSpec:
    d = hashlib.blake2b(f"{salt}:{producer}:{n}".encode(), digest_size=32).digest()
    topic = TOPICS[d[0] % len(TOPICS)]
    pick = int.from_bytes(d[2:4], "big")
    if d[1] < SMALL_SHARE_OF_256:
        lo, hi = SMALL_BYTES
    elif d[1] < SMALL_SHARE_OF_256 + MEDIUM_SHARE_OF_256:
        lo, hi = MEDIUM_BYTES
    else:
        lo, hi = LARGE_BYTES
    size = lo + pick % (hi - lo + 1)
    key = f"key-{d[5] % KEY_POOL}" if d[4] < KEYED_SHARE_OF_256 else None
    if key is None:
        queue_id, explicit = d[6] % QUEUES, True
    else:
        queue_id, explicit = abs(java_string_hash(key)) % QUEUES, False
    header = b"%d:%d:" % (producer, n)
    pattern = d[8:24]
    pad = size - len(header)
    body = header + (pattern * (pad // len(pattern) + 1))[:pad]
    uniq = f"{salt:016X}{producer:04X}{n:012X}"
    return MessageSpec(producer, n, topic, key, queue_id, explicit, uniq, body)


def parse_header(body: bytes) -> tuple[int, int] | None:
    """(producer, n) from a body's header; None when it is not a chaos message's."""
    parts = body.split(b":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def body_hash(body: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(body, digest_size=8).digest(), "big")
