"""What a query meets before any record is read: validation, routing to the right shard,
readiness, and a commit log that cannot be reached. The engine is fed dispatch entries directly;
the commit log is a port nothing listens on, so any query that needs records must fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from index_svc.config import IndexConfig
from index_svc.engine import IndexEngine
from index_svc.records import CommitLogReader
from index_svc.servicer import IndexServicer
from mqstore.dispatch import DispatchEntry
from mqstore.rpc.channel import make_channel
from mqstore.rpc.errors import error_from_rpc
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from mqstore.sharding import shard_of
from tests.index_svc.support import STORE_ID, closed_port, queries, serve_servicer

NOW_MS = 1_700_000_000_000


def entry(offset: int, keys: str = "", uniq: str = "", topic: str = "T") -> DispatchEntry:
    return DispatchEntry(topic, 0, offset, offset * 100, 100, 0, NOW_MS, 0, keys, uniq)


Serve = Callable[..., index_pb2_grpc.IndexStub]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """An engine (config overrides as keywords) holding `entries`, behind a real server whose
    commit log is unreachable; `caught_up` as given."""
    stack: list[Callable[[], None]] = []

    def make(
        *, caught_up: bool = True, entries: list[DispatchEntry] | None = None, **overrides: object
    ) -> index_pb2_grpc.IndexStub:
        engine = IndexEngine(IndexConfig.for_tests(str(tmp_path / f"e{len(stack)}"), **overrides))
        engine.open()
        engine.handshake(STORE_ID, 0, 0)
        engine.apply(entries or [])
        channel = make_channel(f"127.0.0.1:{closed_port()}")
        servicer = IndexServicer(
            engine, CommitLogReader(channel), caught_up=lambda: caught_up, read_timeout_s=5
        )
        ctx = serve_servicer(servicer)
        stub = ctx.__enter__()
        stack.append(lambda: (ctx.__exit__(None, None, None), channel.close(), engine.close()))
        return stub

    yield make
    for close in reversed(stack):
        close()


def status_of(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return error_from_rpc(info.value)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"topic": "", "key": "k"}, "topic"),
        ({"topic": "bad/topic", "key": "k"}, "topic"),
        ({"topic": "T" * 128, "key": "k"}, "topic"),
        ({"topic": "T", "key": ""}, "key"),
        ({"topic": "T", "key": "two words"}, "key"),
        ({"topic": "T", "key": "k" * 32_768}, "key"),
        ({"topic": "T", "key": "k", "max_messages": -1}, "max_messages"),
        ({"topic": "T", "key": "k", "begin_timestamp_ms": -5}, "begin_timestamp_ms"),
        ({"topic": "T", "key": "k", "end_timestamp_ms": -5}, "end_timestamp_ms"),
        (
            {"topic": "T", "key": "k", "begin_timestamp_ms": 2_000, "end_timestamp_ms": 1_000},
            "begin_timestamp_ms",
        ),
    ],
)
def test_a_bad_key_query_is_invalid_argument_naming_the_field(
    serve: Serve, request_fields: dict[str, object], field: str
) -> None:
    stub = serve(caught_up=False)  # validation comes before readiness
    code, _, got_field = status_of(lambda: stub.QueryByKey(pb.QueryByKeyRequest(**request_fields)))
    assert (code, got_field) == (grpc.StatusCode.INVALID_ARGUMENT, field)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"topic": "", "uniq_key": "U"}, "topic"),
        ({"topic": "T", "uniq_key": ""}, "uniq_key"),
        ({"topic": "T", "uniq_key": "U" * 32_768}, "uniq_key"),
    ],
)
def test_a_bad_unique_id_query_is_invalid_argument_naming_the_field(
    serve: Serve, request_fields: dict[str, object], field: str
) -> None:
    stub = serve()
    code, _, got_field = status_of(
        lambda: stub.QueryByUniqKey(pb.QueryByUniqKeyRequest(**request_fields))
    )
    assert (code, got_field) == (grpc.StatusCode.INVALID_ARGUMENT, field)


def test_begin_after_now_with_end_zero_is_an_empty_answer_not_an_error(serve: Serve) -> None:
    stub = serve(entries=[entry(1, keys="k")])
    far_future = (1 << 62) - 1
    answer = stub.QueryByKey(
        pb.QueryByKeyRequest(topic="T", key="k", begin_timestamp_ms=far_future)
    )
    assert list(answer.messages) == []


def test_a_key_of_another_shard_is_failed_precondition_naming_the_right_shard(
    serve: Serve,
) -> None:
    stubs = [serve(caught_up=False, shard_count=3, shard_index=i) for i in range(3)]
    keys = [f"key-{i}" for i in range(12)]
    for key in keys:
        owner = shard_of("T", key, 3)
        for i, stub in enumerate(stubs):
            request = pb.QueryByKeyRequest(topic="T", key=key)
            if i == owner:
                # The right shard gets past routing (and answers: not caught up yet).
                code, _, _ = status_of(lambda s=stub, r=request: s.QueryByKey(r))
                assert code == grpc.StatusCode.UNAVAILABLE
                continue
            code, message, _ = status_of(lambda s=stub, r=request: s.QueryByKey(r))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"shard {owner} of 3" in message and f"this is shard {i}" in message
            code, message, _ = status_of(
                lambda s=stub, k=key: s.QueryByUniqKey(
                    pb.QueryByUniqKeyRequest(topic="T", uniq_key=k)
                )
            )
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert f"shard {shard_of('T', key, 3)} of 3" in message


def test_before_catching_up_every_query_is_unavailable_and_status_says_so(serve: Serve) -> None:
    stub = serve(caught_up=False, entries=[entry(1, keys="k", uniq="U1")])
    for call in (
        lambda: stub.QueryByKey(pb.QueryByKeyRequest(topic="T", key="k")),
        lambda: stub.QueryByUniqKey(pb.QueryByUniqKeyRequest(topic="T", uniq_key="U1")),
    ):
        code, message, _ = status_of(call)
        assert code == grpc.StatusCode.UNAVAILABLE
        assert "catching up" in message
    status = stub.GetStatus(pb.GetStatusRequest())
    assert not status.caught_up
    assert status.applied_offset == entry(1).end_offset


def test_a_query_whose_candidates_cannot_be_read_is_unavailable(serve: Serve) -> None:
    stub = serve(entries=[entry(1, keys="k", uniq="U1")])
    before = queries("key", "unavailable")
    code, message, _ = status_of(lambda: stub.QueryByKey(pb.QueryByKeyRequest(topic="T", key="k")))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "commit log" in message
    assert queries("key", "unavailable") == before + 1
    code, _, _ = status_of(
        lambda: stub.QueryByUniqKey(pb.QueryByUniqKeyRequest(topic="T", uniq_key="U1"))
    )
    assert code == grpc.StatusCode.UNAVAILABLE


def test_a_query_without_candidates_needs_no_commit_log(serve: Serve) -> None:
    stub = serve(entries=[entry(1, keys="k")])
    before = queries("key", "empty")
    assert list(stub.QueryByKey(pb.QueryByKeyRequest(topic="T", key="other")).messages) == []
    assert list(stub.QueryByKey(pb.QueryByKeyRequest(topic="U", key="k")).messages) == []
    assert queries("key", "empty") == before + 2


def test_status_reports_the_shard_the_store_and_the_offsets(serve: Serve) -> None:
    stub = serve(entries=[entry(1, keys="k"), entry(2)], shard_count=4, shard_index=2, exact=True)
    status = stub.GetStatus(pb.GetStatusRequest())
    assert (status.shard_count, status.shard_index, status.exact) == (4, 2, True)
    assert status.store_id == STORE_ID
    assert status.caught_up
    assert status.applied_offset == entry(2).end_offset
    assert status.confirmed_offset <= status.applied_offset
