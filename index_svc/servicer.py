"""The Index gRPC service: QueryByKey, QueryByUniqKey, GetStatus.

A query, in order:

    1. validate         topic (validate_topic), key non-empty, at most 32,767 bytes and free of
                        spaces (KEYS is split on spaces, so such a key never matches; a unique
                        id is taken whole), max_messages >= 0, timestamps >= 0 and begin <= end
                        when end is given                             -> INVALID_ARGUMENT
    2. route            a key of another shard -> FAILED_PRECONDITION naming the right shard
                        (mqstore.sharding.shard_of); the client re-sends it there
    3. ready            before the replica caught up with the log -> UNAVAILABLE (any caught-up
                        replica of the shard answers alike)
    4. candidates       the engine's chain walk, newest first
    5. confirm          ONE commit-log Read of all candidates (records.py), decoded, kept only
                        when the topic is equal and the key is one of the KEYS tokens (or the
                        UNIQ_KEY is the id) and, for a key query, the store time lies in the
                        window; when candidates were dropped the engine widens the
                        walk and reads only the new candidates (engine.lookup)
    6. answer           common.v1.Message per match, newest first, at most the maximum

QueryByKey: begin/end are store times in ms, both inclusive, matched exactly to the millisecond:
the index keeps an entry's time in whole seconds from its file's begin (RocketMQ's layout), so
the walk takes every entry of the seconds the window touches, and step 5 keeps only the records
whose own store time lies in the window (RocketMQ's index answers at its 1-second resolution);
end 0 means now. max_messages 0 means the server's default (default_results, 64); any value
is capped at max_results (1,024, the bound of the candidate walk); nothing is allocated for the
maximum asked.

QueryByUniqKey: every message stored with that unique id in the topic, newest first, at most
uniq_max_results (32, RocketMQ's defaultQueryMaxNum), over all time. A unique id is meant to be
unique, but a producer's retry stores it twice, and an operator wants to see both. (RocketMQ's
client keeps one of them, the one with the smallest store timestamp: here that is the last.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import grpc

from index_svc import metrics
from index_svc.confirm import KeyedRecord, key_matches, uniq_matches
from index_svc.engine import IndexEngine
from index_svc.records import CommitLogReader, FetchedRecord
from mqstore.errors import (
    FailedPrecondition,
    InvalidArgument,
    MqstoreError,
    Unavailable,
)
from mqstore.formats.index_checkpoint import NO_STORE_ID
from mqstore.formats.record import validate_topic
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc as pb_grpc
from mqstore.sharding import shard_of

KEY_SEPARATOR = " "
# A key longer than a record's whole properties can never have been stored.
KEY_BYTES_MAX = MessageLimits().properties_bytes_max


def _check_key(key: str, field: str, *, token: bool) -> None:
    """A key query's key is one KEYS token (no space); a unique id is taken whole."""
    if not key:
        raise InvalidArgument(f"{field} is empty", field=field)
    if token and KEY_SEPARATOR in key:
        raise InvalidArgument(
            f"{field} holds a space: KEYS is split on spaces, so no message carries it",
            field=field,
        )
    if len(key.encode("utf-8", "surrogatepass")) > KEY_BYTES_MAX:
        raise InvalidArgument(f"{field} is longer than {KEY_BYTES_MAX} bytes", field=field)


def _result_of(err: BaseException) -> str:
    if isinstance(err, InvalidArgument):
        return "invalid"
    if isinstance(err, FailedPrecondition):
        return "wrong_shard"
    if isinstance(err, Unavailable):
        return "unavailable"
    return "error"


class IndexServicer(pb_grpc.IndexServicer):
    def __init__(
        self,
        engine: IndexEngine,
        reader: CommitLogReader,
        *,
        caught_up: Callable[[], bool],
        default_results: int = 64,
        read_timeout_s: float = 10.0,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.engine = engine
        self.reader = reader
        self._caught_up = caught_up
        self._default_results = default_results
        self._read_timeout_s = read_timeout_s
        self._now_ms = now_ms

    # -- queries --------------------------------------------------------------------------------

    def QueryByKey(  # noqa: N802 - the gRPC method name
        self, request: pb.QueryByKeyRequest, context: grpc.ServicerContext
    ) -> pb.QueryResponse:
        return self._answer("key", lambda: self._query_by_key(request, context))

    def QueryByUniqKey(  # noqa: N802 - the gRPC method name
        self, request: pb.QueryByUniqKeyRequest, context: grpc.ServicerContext
    ) -> pb.QueryResponse:
        return self._answer("uniq", lambda: self._query_by_uniq_key(request, context))

    def _query_by_key(
        self, request: pb.QueryByKeyRequest, context: grpc.ServicerContext
    ) -> list[common_pb2.Message]:
        topic, key = request.topic, request.key
        validate_topic(topic)
        _check_key(key, "key", token=True)
        if request.max_messages < 0:
            raise InvalidArgument("max_messages must not be negative", field="max_messages")
        begin, end = request.begin_timestamp_ms, request.end_timestamp_ms
        if begin < 0:
            raise InvalidArgument(
                "begin_timestamp_ms must not be negative", field="begin_timestamp_ms"
            )
        if end < 0:
            raise InvalidArgument(
                "end_timestamp_ms must not be negative (0 means now)", field="end_timestamp_ms"
            )
        if end and begin > end:
            raise InvalidArgument(
                f"begin_timestamp_ms {begin} is after end_timestamp_ms {end}",
                field="begin_timestamp_ms",
            )
        self._route(topic, key)
        self._check_caught_up()
        end = end or self._now_ms()
        want = request.max_messages or self._default_results
        fetch, fetched = self._fetcher(context)
        offsets = self.engine.lookup(topic, key, begin, end, want, fetch)
        self._count_confirmation("key", fetched, lambda r: key_matches(r, topic, key))
        return [fetched[o].message for o in offsets]

    def _query_by_uniq_key(
        self, request: pb.QueryByUniqKeyRequest, context: grpc.ServicerContext
    ) -> list[common_pb2.Message]:
        topic, uniq_key = request.topic, request.uniq_key
        validate_topic(topic)
        _check_key(uniq_key, "uniq_key", token=False)
        self._route(topic, uniq_key)
        self._check_caught_up()
        fetch, fetched = self._fetcher(context)
        offsets = self.engine.lookup_uniq(topic, uniq_key, fetch)
        self._count_confirmation("uniq", fetched, lambda r: uniq_matches(r, topic, uniq_key))
        return [fetched[o].message for o in offsets]

    @staticmethod
    def _answer(kind: str, query: Callable[[], list[common_pb2.Message]]) -> pb.QueryResponse:
        """Runs a query, timing it and counting its result."""
        began = time.perf_counter()
        result = "error"
        try:
            messages = query()
            result = "found" if messages else "empty"
            return pb.QueryResponse(messages=messages)
        except MqstoreError as err:
            result = _result_of(err)
            raise
        finally:
            metrics.QUERIES.labels(kind, result).inc()
            metrics.QUERY_SECONDS.labels(kind).observe(time.perf_counter() - began)

    # -- GetStatus ------------------------------------------------------------------------------

    def GetStatus(  # noqa: N802 - the gRPC method name
        self, request: pb.GetStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetStatusResponse:
        config = self.engine.config
        store_id = self.engine.store_id
        return pb.GetStatusResponse(
            store_id=b"" if store_id == NO_STORE_ID else store_id,
            confirmed_offset=self.engine.confirmed_offset,
            applied_offset=self.engine.applied_offset,
            caught_up=self._caught_up(),
            shard_count=config.shard_count,
            shard_index=config.shard_index,
            exact=config.exact,
        )

    # -- pieces ---------------------------------------------------------------------------------

    def _route(self, topic: str, key: str) -> None:
        config = self.engine.config
        if config.shard_count == 1:
            return
        owner = shard_of(topic, key, config.shard_count)
        if owner != config.shard_index:
            raise FailedPrecondition(
                f"key belongs to shard {owner} of {config.shard_count}, "
                f"this is shard {config.shard_index}"
            )

    def _check_caught_up(self) -> None:
        if not self._caught_up():
            raise Unavailable(
                "the index is catching up with the commit log "
                f"(applied up to offset {self.engine.applied_offset}); retry, or ask another "
                "replica of this shard"
            )

    def _fetcher(
        self, context: grpc.ServicerContext
    ) -> tuple[Callable[[Sequence[int]], Mapping[int, KeyedRecord]], dict[int, FetchedRecord]]:
        """The engine's `fetch`: one Read per call, bounded by the caller's deadline and by
        read_timeout_s; every record read is kept in `fetched` to build the answer from."""
        fetched: dict[int, FetchedRecord] = {}

        def fetch(offsets: Sequence[int]) -> Mapping[int, KeyedRecord]:
            # Without a deadline, gRPC reports about 9e18 s remaining; read_timeout_s bounds it.
            remaining = context.time_remaining()
            timeout_s = self._read_timeout_s
            if remaining is not None:
                timeout_s = min(remaining, timeout_s)
            outcome = self.reader.read(offsets, timeout_s)
            fetched.update(outcome.records)
            return outcome.records

        return fetch, fetched

    @staticmethod
    def _count_confirmation(
        kind: str, fetched: Mapping[int, FetchedRecord], matches: Callable[[KeyedRecord], bool]
    ) -> None:
        confirmed = sum(1 for r in fetched.values() if matches(r))
        metrics.CANDIDATES.labels(kind).inc(len(fetched))
        metrics.CONFIRMED.labels(kind).inc(confirmed)
        if confirmed < len(fetched):
            metrics.COLLISIONS.labels(kind).inc(len(fetched) - confirmed)
