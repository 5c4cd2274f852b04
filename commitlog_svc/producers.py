"""Producer idempotence: (producer id, sequence) -> what the request stored.

A producer that did not learn the outcome of an append (a deadline, a broken connection, a
commit log that restarted) sends it again with the same sequence; the store answers with the
first result (duplicate = true) and stores nothing.

    what the store knows of the producer        sequence of the request        answer
    nothing (new, or forgotten: LRU)            any                            store it
    L = its last stored sequence                > L                            store it
                                                one of those remembered        the first result
                                                <= L and not remembered        FAILED_PRECONDITION

Bounds: at most `producers_max` producers (the least recently used is forgotten first) and the
last `requests_max` stored requests of each (a pipelining producer has a few in flight; 5 covers
the SDK's window). A request is remembered only if it stored at least one message: one that was
refused as a whole changed nothing, and its retry is a new attempt.

Durability. The first record a request stores carries the property

    MQS_PSEQ = "<producer id>:<sequence>:<messages in the request>:<refused>"

where <refused> lists "index/status" for messages refused inside the request (comma
separated, usually empty). Its records are consecutive (one write), so the record offsets of
the request's messages follow from the tagged record and the refused list. The checkpoint holds
a snapshot of the table taken with the offset it vouches for (both under the write lock), and
recovery applies the tags of the records after that offset. A retry after a clean restart or a
kill -9 is therefore recognised exactly when its records survived recovery; a request whose
records were cut (a torn tail) is not stored, and its retry is stored anew.

The producer id is parsed from the right, so it may hold ':' but not the property separators
0x01 / 0x02.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from mqstore.errors import FailedPrecondition, InvalidArgument
from mqstore.formats.commitlog_checkpoint import ProducerEntry, ProducerRequest
from mqstore.formats.properties import PRODUCER_SEQ

# A producer id is a name, not a payload: bounded so a tag never crowds the properties limit.
PRODUCER_ID_BYTES_MAX = 256
# Past this the refused list is not written into the record; the retry is still recognised
# while the process lives (memory), not after a restart. Refusals inside a request are rare
# (a client bug), and a long list would eat the 32 KiB properties budget of the carrier.
TAG_BYTES_MAX = 2048
SEQUENCE_MAX = (1 << 64) - 1

TAG_PREFIX = PRODUCER_SEQ.encode() + b"\x01"


def check_producer_id(producer_id: str) -> None:
    raw = producer_id.encode("utf-8")
    if not raw or len(raw) > PRODUCER_ID_BYTES_MAX:
        raise InvalidArgument(
            f"producer id must be 1..{PRODUCER_ID_BYTES_MAX} bytes, got {len(raw)}",
            field="producer_id",
        )
    if b"\x01" in raw or b"\x02" in raw:
        raise InvalidArgument("producer id holds a 0x01 or 0x02 byte", field="producer_id")


def check_sequence(sequence: int) -> None:
    if not 0 <= sequence <= SEQUENCE_MAX:
        raise InvalidArgument(f"sequence {sequence} is not a u64", field="sequence")


def encode_tag(
    producer_id: str, sequence: int, count: int, refused: tuple[tuple[int, int], ...] = ()
) -> bytes:
    """The MQS_PSEQ property (key, value and terminator), ready to append to properties."""
    listed = ",".join(f"{index}/{status}" for index, status in refused)
    value = f"{producer_id}:{sequence}:{count}:{listed}".encode()
    return TAG_PREFIX + value + b"\x02"


@dataclass(frozen=True, slots=True)
class Tag:
    producer_id: str
    sequence: int
    count: int
    refused: tuple[tuple[int, int], ...]


def decode_tag(value: str) -> Tag | None:
    """The tag in an MQS_PSEQ value; None when it does not parse (never trusted blindly: the
    records it describes are checked when a retry replays them)."""
    parts = value.rsplit(":", 3)
    if len(parts) != 4 or not parts[0]:
        return None
    producer_id, seq_text, count_text, listed = parts
    try:
        sequence = int(seq_text)
        count = int(count_text)
        refused = tuple(
            (int(index), int(status))
            for index, status in (item.split("/", 1) for item in listed.split(",") if item)
        )
    except ValueError:
        return None
    if not 0 <= sequence <= SEQUENCE_MAX or count <= 0:
        return None
    if any(not 0 <= index < count for index, _ in refused) or len(refused) >= count:
        return None
    return Tag(producer_id, sequence, count, refused)


class ProducerState:
    """One producer: its lock (held from the duplicate check to the write, so two copies of
    one request never both store), its last stored sequence and its remembered requests."""

    __slots__ = ("last_sequence", "lock", "requests")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_sequence = -1  # none stored yet
        self.requests: OrderedDict[int, ProducerRequest] = OrderedDict()


class ProducerTable:
    def __init__(self, producers_max: int = 10_000, requests_max: int = 5) -> None:
        if producers_max < 1 or requests_max < 1:
            raise InvalidArgument("the producer table must hold at least one of each")
        self.producers_max = producers_max
        self.requests_max = requests_max
        self._lock = threading.Lock()
        self._producers: OrderedDict[str, ProducerState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def state(self, producer_id: str) -> ProducerState:
        """The producer's state, created if new; marks it most recently used."""
        with self._lock:
            st = self._producers.get(producer_id)
            if st is None:
                st = self._producers[producer_id] = ProducerState()
                self._evict()
            else:
                self._producers.move_to_end(producer_id)
            return st

    def _evict(self) -> None:
        while len(self._producers) > self.producers_max:
            self._producers.popitem(last=False)

    def check(self, st: ProducerState, producer_id: str, sequence: int) -> ProducerRequest | None:
        """With `st.lock` held: the remembered request (a retry), None for a new sequence, or
        FailedPrecondition for one that goes backwards."""
        found = st.requests.get(sequence)
        if found is not None:
            return found
        if sequence <= st.last_sequence:
            remembered = list(st.requests)
            window = f"{remembered[0]}..{remembered[-1]}" if remembered else "none"
            raise FailedPrecondition(
                f"sequence {sequence} of producer {producer_id!r} is not after its last stored "
                f"sequence {st.last_sequence} and is not among the remembered ones ({window}): "
                "sequences must increase; an older request cannot be confirmed any more"
            )
        return None

    def record(self, producer_id: str, st: ProducerState, request: ProducerRequest) -> None:
        """Remember a stored request (under the store's write lock, so that a checkpoint
        snapshot and the offset it vouches for agree)."""
        st.requests[request.sequence] = request
        st.last_sequence = max(st.last_sequence, request.sequence)
        while len(st.requests) > self.requests_max:
            st.requests.popitem(last=False)
        with self._lock:
            if self._producers.get(producer_id) is not st:
                # Forgotten (LRU) while this request was in flight: it is the newest again.
                self._producers[producer_id] = st
                self._evict()

    def apply(self, producer_id: str, request: ProducerRequest) -> None:
        """Recovery: a tagged record found after the checkpoint."""
        self.record(producer_id, self.state(producer_id), request)

    # -- checkpoint ---------------------------------------------------------------------------

    def snapshot(self) -> list[ProducerEntry]:
        with self._lock:
            # A producer whose requests were all refused stored nothing: nothing to remember
            # (its state exists only for its lock; last_sequence -1 has no encoding).
            return [
                ProducerEntry(pid, st.last_sequence, list(st.requests.values()))
                for pid, st in self._producers.items()
                if st.last_sequence >= 0
            ]

    def load(self, entries: list[ProducerEntry], *, end_offset: int) -> int:
        """Restore a snapshot, keeping only requests whose records end at or below `end_offset`
        (recovery may have cut below the checkpoint). Returns how many requests were dropped."""
        dropped = 0
        with self._lock:
            self._producers.clear()
        for entry in entries:
            kept = [r for r in entry.requests if r.end_offset <= end_offset]
            dropped += len(entry.requests) - len(kept)
            st = ProducerState()
            if len(kept) == len(entry.requests):
                st.last_sequence = entry.last_sequence
            else:
                # Its newest requests are gone, so they were not stored: their retries must be
                # taken as new. Older, forgotten sequences cannot be told apart any more.
                st.last_sequence = max((r.sequence for r in kept), default=-1)
            for r in kept[-self.requests_max :]:
                st.requests[r.sequence] = r
            with self._lock:
                self._producers[entry.producer_id] = st
                self._producers.move_to_end(entry.producer_id)
                self._evict()
        return dropped
