"""Test oracles for the index: a one-key-at-a-time writer done with struct, straight from
rocketmq-store.md §4.2/§4.3 (plus the two documented differences), and helpers.

The engine writes a batch with numpy; the model writes RocketMQ's putKey sequence. Files built by
both from the same dispatch entries must be byte-identical.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

from index_svc.engine import IndexEngine
from mqstore.dispatch import DispatchEntry
from mqstore.formats import sysflag
from mqstore.formats.javahash import index_key_hash
from mqstore.sharding import shard_of
from mqstore.storage.disk import Disk

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
INT_MAX = 2**31 - 1
T0 = 1_700_000_000_000


def msg(
    offset: int,
    ts: int = T0,
    keys: str = "",
    uniq: str = "",
    *,
    topic: str = "T",
    size: int = 100,
    sys_flag: int = 0,
) -> DispatchEntry:
    return DispatchEntry(
        topic=topic,
        queue_id=0,
        queue_offset=0,
        commit_log_offset=offset,
        size=size,
        tags_code=0,
        store_timestamp_ms=ts,
        sys_flag=sys_flag,
        keys=keys,
        uniq_key=uniq,
    )


def keys_of(e: DispatchEntry) -> list[str]:
    """What RocketMQ indexes for a message, in order: UNIQ_KEY, then each non-empty KEYS token."""
    out = [e.uniq_key] if e.uniq_key else []
    out += [t for t in e.keys.split(" ") if t]
    return out


VOCABULARY = ["Aa", "BB", "C#c", "order-1", "order-2", "k", "AaAa", "BBBB", "AaBB", "ünï"]


def stream(n: int, seed: int, *, start: int = 0, t0: int = T0) -> list[DispatchEntry]:
    """n dispatch entries in commit-log order: random sizes, store times rising by 0-1.5 s, keys
    from a small vocabulary full of Java-hash collisions ("Aa"/"BB", "AaAa"/"BBBB"/"AaBB"),
    unique ids on most, a few rolled-back transactions and topics T and U."""
    rng = random.Random(seed)
    out = []
    offset, ts = start, t0
    for i in range(n):
        size = rng.randint(60, 300)
        ts += rng.randint(0, 1500)
        keys = " ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.1:
            keys = "  " + keys + " "  # empty tokens are skipped
        uniq = f"U{seed}-{i}" if rng.random() < 0.7 else ""
        flag = sysflag.TRANSACTION_ROLLBACK_TYPE if rng.random() < 0.05 else 0
        topic = "T" if rng.random() < 0.8 else "U"
        out.append(msg(offset, ts, keys, uniq, topic=topic, size=size, sys_flag=flag))
        offset += size
    return out


@dataclass
class ModelIndex:
    slot_num: int
    entry_num: int
    shard_count: int = 1
    shard_index: int = 0
    files: list[bytearray] = field(default_factory=list)
    applied: int = 0

    def size(self) -> int:
        return 40 + 4 * self.slot_num + 20 * self.entry_num

    def apply(self, entries: list[DispatchEntry]) -> None:
        for e in entries:
            if e.commit_log_offset < self.applied:
                continue
            self.applied = e.commit_log_offset + e.size
            if sysflag.transaction_type(e.sys_flag) == sysflag.TRANSACTION_ROLLBACK_TYPE:
                continue
            for k in keys_of(e):
                if shard_of(e.topic, k, self.shard_count) != self.shard_index:
                    continue
                self.put(
                    index_key_hash(f"{e.topic}#{k}"), e.commit_log_offset, e.store_timestamp_ms
                )

    def put(self, key_hash: int, phy: int, ts: int) -> None:
        if not self.files or HEADER.unpack_from(self.files[-1], 0)[5] >= self.entry_num:
            buf = bytearray(self.size())
            HEADER.pack_into(buf, 0, 0, 0, 0, 0, 0, 1)
            self.files.append(buf)
        buf = self.files[-1]
        begin_ts, end_ts, begin_phy, _end_phy, used, count = HEADER.unpack_from(buf, 0)
        count = max(count, 1)
        slot_pos = 40 + (key_hash % self.slot_num) * 4
        (slot_value,) = SLOT.unpack_from(buf, slot_pos)
        if slot_value <= 0 or slot_value > count:
            slot_value = 0
        if count <= 1:  # mqstore: begin is set before the time diff is taken
            begin_ts, begin_phy, end_ts = ts, phy, ts
        diff = 0 if begin_ts <= 0 else min(max((ts - begin_ts) // 1000, 0), INT_MAX)
        ENTRY.pack_into(buf, 40 + 4 * self.slot_num + 20 * count, key_hash, phy, diff, slot_value)
        SLOT.pack_into(buf, slot_pos, count)
        if slot_value == 0:
            used += 1
        end_ts = max(end_ts, ts)  # mqstore: the largest store time seen
        HEADER.pack_into(buf, 0, begin_ts, end_ts, begin_phy, phy, used, count + 1)

    def candidates(self, key: str, topic: str, begin: int, end: int) -> list[int]:
        """Brute force over every entry, newest first: the offsets whose 32-bit hash equals the
        key's and whose stored time (begin + diff s) lies in [begin, end]. Equal to the chain
        walk's answer whenever store times never go back."""
        h = index_key_hash(f"{topic}#{key}")
        out: list[int] = []
        for buf in reversed(self.files):
            begin_ts, _e, _bp, _ep, _u, count = HEADER.unpack_from(buf, 0)
            for n in range(count - 1, 0, -1):
                stored, phy, diff, _prev = ENTRY.unpack_from(buf, 40 + 4 * self.slot_num + 20 * n)
                t = begin_ts + diff * 1000
                if stored == h and begin <= t <= end and phy not in out:
                    out.append(phy)
        return out


def build_model(
    entries: list[DispatchEntry], slot_num: int = 4, entry_num: int = 8, **kw: int
) -> ModelIndex:
    m = ModelIndex(slot_num, entry_num, **kw)
    m.apply(entries)
    return m


def file_contents(disk: Disk, engine: IndexEngine) -> list[bytes]:
    """The bytes of the engine's index files, oldest first."""
    return [disk.read(f"{engine.config.index_dir}/{name}") for name in engine.file_names]


def apply_in_batches(engine: IndexEngine, entries: list[DispatchEntry], seed: int) -> None:
    rng = random.Random(seed)
    i = 0
    while i < len(entries):
        n = rng.randint(1, 12)
        engine.apply(entries[i : i + n])
        i += n
