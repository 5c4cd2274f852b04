"""Confirming index candidates against the records: the fix for RocketMQ #3613.

The index stores a 32-bit hash of `topic#key`, so a chain walk yields every message whose key
hashes alike: "Aa" and "BB" have the same Java hash, so a query for key "Aa" of topic T also
yields the messages of key "BB" (and of keys of other topics with an equal hash). RocketMQ's
store returns them all and leaves the client to filter; a client that does not returns another
topic's messages. Here the service fetches the candidate records in one batched read and keeps
only those whose topic and key really match, with these pure functions, before answering.

A key query matches a record whose topic is equal and whose KEYS property holds the key as one
of its space-separated tokens (what RocketMQ's client compares). A unique-id query matches a
record whose topic is equal and whose UNIQ_KEY is the id. A candidate with no record (expired or
lost from the log) is dropped. The candidates' order (newest first) is kept.

A key query's time window is applied here too, to the record's own store time, to the
millisecond: the index keeps an entry's time in whole seconds from its file's begin, so its
candidates are those of every second the window touches (engine.query), and `within` drops the
ones stored outside the window itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from mqstore.dispatch import DispatchEntry

KEY_TOKEN_SEPARATOR = " "


class KeyedRecord(Protocol):
    """What confirmation reads from a record; `mqstore.dispatch.DispatchEntry` has it (build one
    from a fetched record with `entry_from_record`)."""

    @property
    def topic(self) -> str: ...

    @property
    def keys(self) -> str: ...

    @property
    def uniq_key(self) -> str: ...

    @property
    def store_timestamp_ms(self) -> int: ...


def key_matches(record: KeyedRecord, topic: str, key: str) -> bool:
    return bool(key) and record.topic == topic and key in record.keys.split(KEY_TOKEN_SEPARATOR)


def uniq_matches(record: KeyedRecord, topic: str, uniq_key: str) -> bool:
    return bool(uniq_key) and record.topic == topic and record.uniq_key == uniq_key


def confirm_key(
    candidates: Sequence[int], records: Mapping[int, KeyedRecord], topic: str, key: str
) -> list[int]:
    """The candidates (commit-log offsets) whose record really carries `key` in `topic`."""
    out = []
    for offset in candidates:
        record = records.get(offset)
        if record is not None and key_matches(record, topic, key):
            out.append(offset)
    return out


def within(
    candidates: Sequence[int], records: Mapping[int, KeyedRecord], begin_ms: int, end_ms: int
) -> list[int]:
    """The candidates whose record was stored within [begin_ms, end_ms], both inclusive."""
    out = []
    for offset in candidates:
        record = records.get(offset)
        if record is not None and begin_ms <= record.store_timestamp_ms <= end_ms:
            out.append(offset)
    return out


def confirm_uniq(
    candidates: Sequence[int], records: Mapping[int, KeyedRecord], topic: str, uniq_key: str
) -> list[int]:
    """The candidates whose record's unique id is `uniq_key` in `topic`."""
    out = []
    for offset in candidates:
        record = records.get(offset)
        if record is not None and uniq_matches(record, topic, uniq_key):
            out.append(offset)
    return out


def _accepts_dispatch_entry(entry: DispatchEntry) -> KeyedRecord:
    """Static check that DispatchEntry satisfies KeyedRecord (mypy fails here otherwise)."""
    return entry
