"""Dispatch entries: what the commit log tells its subscribers about each stored message.

One entry per message, built from the record by `entry_from_record`; consume queues use the
position fields, the index uses keys and the unique id. The gRPC dispatch batch carries these
columns packed; engines take them as `DispatchEntry` objects or as `DispatchColumns`.

`DispatchColumns` is a whole frame as numpy columns (what mqstore.rpc.dispatch_codec's
`decode_columns` makes of a validated frame, with no Python object per message). The followers
apply it run by run: `queue_runs()` groups the rows that take a queue offset by (topic, queue)
in compiled code (formats/_core_frames.pxi). It is also a `Sequence[DispatchEntry]` (entries
built on access), so that code written for entry lists keeps working with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from mqstore.formats import _core, sysflag
from mqstore.formats.javahash import tags_code
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, decode_properties
from mqstore.formats.record import Record


# Not frozen: a frozen dataclass sets each field through object.__setattr__, a cost per field
# of every object, and one is made per message on hot paths. Treat it as a value: nothing
# assigns to its fields, and unsafe_hash makes it hashable as a frozen one is.
@dataclass(slots=True, unsafe_hash=True)
class DispatchEntry:
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int  # start of the record
    size: int  # the record's TOTALSIZE
    tags_code: int
    store_timestamp_ms: int
    sys_flag: int = 0
    keys: str = ""  # the KEYS property, space separated
    uniq_key: str = ""  # the UNIQ_KEY property

    @property
    def end_offset(self) -> int:
        return self.commit_log_offset + self.size

    @property
    def goes_to_consume_queue(self) -> bool:
        """Only NOT and COMMIT messages are dispatched to a consume queue (§3.2)."""
        return sysflag.gets_queue_offset(self.sys_flag)

    @property
    def goes_to_index(self) -> bool:
        """Rolled-back transactional messages are not indexed (§4.3)."""
        return sysflag.transaction_type(self.sys_flag) != sysflag.TRANSACTION_ROLLBACK_TYPE


def entry_from_record(record: Record) -> DispatchEntry:
    props = decode_properties(record.properties) if record.properties else {}
    return DispatchEntry(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commit_log_offset=record.physical_offset,
        size=record.total_size,
        tags_code=tags_code(props.get(TAGS)),
        store_timestamp_ms=record.store_timestamp_ms,
        sys_flag=record.sys_flag,
        keys=props.get(KEYS, ""),
        uniq_key=props.get(UNIQ_KEY, ""),
    )


Column = npt.NDArray[np.int64]

# Longest linger a subscriber may ask of the dispatch stream (SubscribeRequest.linger_ms).
DISPATCH_LINGER_MS_MAX = 1_000


@dataclass(frozen=True, slots=True)
class QueueRuns:
    """The rows of a frame that go to a consume queue, grouped by queue: run r is queue keys[r]
    and rows[bounds[r]:bounds[r + 1]], in frame (commit-log) order."""

    keys: list[tuple[str, int]]
    bounds: Column
    rows: Column

    def __len__(self) -> int:
        return len(self.keys)

    def run(self, r: int) -> Column:
        return self.rows[self.bounds[r] : self.bounds[r + 1]]


# The offsets of a column of no strings, shared (read-only): a frame without keys (cq_svc's)
# makes no array for them.
_NO_OFFSETS: Column = np.zeros(0, dtype=np.int64)
_NO_OFFSETS.flags.writeable = False


class Utf8Column(Sequence[str]):
    """A column of strings as the dispatch frame carries them: their UTF-8 bytes back to back
    in `data`, string i being data[offsets[i]:offsets[i + 1]] (`offsets`: int64, 0 first, one
    more than the strings; empty for a column of none). decode_response makes one without a
    str per message, and index_svc hashes the keys from the bytes (_core.index_message_keys);
    a str is made only when one is asked for (entries, errors, the exact and sharded modes).
    The bytes are UTF-8: decode_response checks them, `of` encodes them."""

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes = b"", offsets: Column | None = None) -> None:
        self.data = data
        self.offsets: Column = offsets if offsets is not None else _NO_OFFSETS

    @classmethod
    def of(cls, strings: Sequence[str]) -> Utf8Column:
        """The column of `strings` (none: the empty column)."""
        if isinstance(strings, Utf8Column):
            return strings
        if not strings:
            return cls()
        parts = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=offsets[1:])
        return cls(b"".join(parts), offsets)

    def __len__(self) -> int:
        n = len(self.offsets)
        return n - 1 if n else 0

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"string {index} of {n}")
        i = index % n
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])].decode("utf-8")

    def tolist(self) -> list[str]:
        """Every string, decoded."""
        data = self.data
        bounds = self.offsets.tolist()
        return [data[a:b].decode("utf-8") for a, b in itertools.pairwise(bounds)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Utf8Column):
            return NotImplemented
        return self.tolist() == other.tolist()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking value, as a list is

    def __repr__(self) -> str:
        return f"Utf8Column({self.tolist()!r})"


NO_STRINGS = Utf8Column()  # a frame's column of keys or unique ids when it sends none


class DispatchColumns(Sequence[DispatchEntry]):
    """A dispatch frame as columns: one int64 array per numeric field, all of one length;
    `keys` and `uniq_keys` are Utf8Columns of one string per entry or of none at all (then
    every entry has ""); strings given as a sequence of str are encoded into one.
    `records`: empty, or every entry's record back to back in entry order (a frame of the
    newest appends, asked for with include_records). The caller guarantees the shape
    (decode_columns checks a frame before it builds one)."""

    __slots__ = (
        "commit_log_offsets",
        "keys",
        "next_offset",
        "queue_ids",
        "queue_offsets",
        "records",
        "sizes",
        "start_offset",
        "store_timestamps_ms",
        "sys_flags",
        "tags_codes",
        "topic_indexes",
        "topics",
        "uniq_keys",
    )

    def __init__(
        self,
        *,
        topics: Sequence[str],
        topic_indexes: Column,
        queue_ids: Column,
        queue_offsets: Column,
        commit_log_offsets: Column,
        sizes: Column,
        tags_codes: Column,
        store_timestamps_ms: Column,
        sys_flags: Column,
        keys: Sequence[str] | Utf8Column = (),
        uniq_keys: Sequence[str] | Utf8Column = (),
        start_offset: int = 0,
        next_offset: int = 0,
        records: bytes = b"",
    ) -> None:
        self.topics = list(topics)
        self.topic_indexes = topic_indexes
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.commit_log_offsets = commit_log_offsets
        self.sizes = sizes
        self.tags_codes = tags_codes
        self.store_timestamps_ms = store_timestamps_ms
        self.sys_flags = sys_flags
        self.keys = Utf8Column.of(keys)
        self.uniq_keys = Utf8Column.of(uniq_keys)
        self.start_offset = start_offset
        self.next_offset = next_offset
        self.records = records

    @classmethod
    def from_entries(
        cls, entries: Sequence[DispatchEntry], *, start_offset: int = 0, next_offset: int = 0
    ) -> DispatchColumns:
        """The columns of an entry list (tests, and callers that hold entries)."""
        topics: dict[str, int] = {}
        for e in entries:
            topics.setdefault(e.topic, len(topics))

        def col(values: Iterator[int]) -> Column:
            return np.fromiter(values, dtype=np.int64, count=len(entries))

        return cls(
            topics=list(topics),
            topic_indexes=col(topics[e.topic] for e in entries),
            queue_ids=col(e.queue_id for e in entries),
            queue_offsets=col(e.queue_offset for e in entries),
            commit_log_offsets=col(e.commit_log_offset for e in entries),
            sizes=col(e.size for e in entries),
            tags_codes=col(e.tags_code for e in entries),
            store_timestamps_ms=col(e.store_timestamp_ms for e in entries),
            sys_flags=col(e.sys_flag for e in entries),
            keys=[e.keys for e in entries],
            uniq_keys=[e.uniq_key for e in entries],
            start_offset=start_offset,
            next_offset=next_offset,
        )

    # -- Sequence[DispatchEntry] ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.commit_log_offsets)

    def _entry(self, i: int) -> DispatchEntry:
        return DispatchEntry(
            topic=self.topics[int(self.topic_indexes[i])],
            queue_id=int(self.queue_ids[i]),
            queue_offset=int(self.queue_offsets[i]),
            commit_log_offset=int(self.commit_log_offsets[i]),
            size=int(self.sizes[i]),
            tags_code=int(self.tags_codes[i]),
            store_timestamp_ms=int(self.store_timestamps_ms[i]),
            sys_flag=int(self.sys_flags[i]),
            keys=self.keys[i] if self.keys else "",
            uniq_key=self.uniq_keys[i] if self.uniq_keys else "",
        )

    @overload
    def __getitem__(self, index: int) -> DispatchEntry: ...

    @overload
    def __getitem__(self, index: slice) -> list[DispatchEntry]: ...

    def __getitem__(self, index: int | slice) -> DispatchEntry | list[DispatchEntry]:
        if isinstance(index, slice):
            return [self._entry(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"entry {index} of {n}")
        return self._entry(index % n)

    def __iter__(self) -> Iterator[DispatchEntry]:
        return iter(self.entries())

    def entries(self) -> list[DispatchEntry]:
        """Every row as a DispatchEntry (the per-entry form, for callers that want objects)."""
        n = len(self)
        topics = self.topics
        keys = self.keys.tolist() if self.keys else [""] * n
        uniq = self.uniq_keys.tolist() if self.uniq_keys else [""] * n
        return [
            DispatchEntry(topics[t], q, qo, o, sz, tc, ts, sf, k, u)
            for t, q, qo, o, sz, tc, ts, sf, k, u in zip(
                self.topic_indexes.tolist(),
                self.queue_ids.tolist(),
                self.queue_offsets.tolist(),
                self.commit_log_offsets.tolist(),
                self.sizes.tolist(),
                self.tags_codes.tolist(),
                self.store_timestamps_ms.tolist(),
                self.sys_flags.tolist(),
                keys,
                uniq,
                strict=True,
            )
        ]

    # -- column views ---------------------------------------------------------------------------

    @property
    def end_offsets(self) -> Column:
        return self.commit_log_offsets + self.sizes

    def end_offset(self, default: int) -> int:
        """The largest entry end, or `default` if larger (or the frame is empty)."""
        if not len(self):
            return default
        return max(default, int(self.end_offsets.max()))

    @property
    def goes_to_consume_queue(self) -> npt.NDArray[np.bool_]:
        """DispatchEntry.goes_to_consume_queue for every row."""
        kind = self.sys_flags & sysflag.TRANSACTION_MASK
        mask: npt.NDArray[np.bool_] = (kind == sysflag.TRANSACTION_NOT_TYPE) | (
            kind == sysflag.TRANSACTION_COMMIT_TYPE
        )
        return mask

    @property
    def goes_to_index(self) -> npt.NDArray[np.bool_]:
        """DispatchEntry.goes_to_index for every row."""
        kind = self.sys_flags & sysflag.TRANSACTION_MASK
        mask: npt.NDArray[np.bool_] = kind != sysflag.TRANSACTION_ROLLBACK_TYPE
        return mask

    def queue_keys(self) -> set[tuple[str, int]]:
        """Every (topic, queue id) a row names."""
        pairs = set(zip(self.topic_indexes.tolist(), self.queue_ids.tolist(), strict=True))
        return {(self.topics[t], q) for t, q in pairs}

    def queue_runs(self) -> QueueRuns:
        """The rows that go to a consume queue, grouped by (topic, queue) in the order each
        queue first appears, each group in frame order (what a dict of lists filled entry by
        entry gives; compiled: formats/_core_frames.pxi)."""
        keys, bounds, rows = _core.queue_runs(self.topic_indexes, self.queue_ids, self.sys_flags)
        return QueueRuns(
            [(self.topics[t], q) for t, q in keys],
            np.frombuffer(bounds, dtype=np.int64),
            np.frombuffer(rows, dtype=np.int64),
        )
