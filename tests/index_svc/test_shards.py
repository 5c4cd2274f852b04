"""Two shards following one commit log: each indexes and answers only the keys that
mqstore.sharding routes to it, and sends a query for the other's keys away with
FAILED_PRECONDITION naming the right shard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mqstore.launcher import ServiceProcess
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.sharding import shard_of
from tests.index_svc.conftest import Replica, start_replica, stop_replica
from tests.index_svc.support import append, offsets_of, wait_applied

SHARDS = 2


@pytest.fixture
def shards(commitlog: ServiceProcess, tmp_path: Path) -> Iterator[list[Replica]]:
    replicas = [
        start_replica(tmp_path / f"index-{i}", commitlog.target, shard_count=SHARDS, shard_index=i)
        for i in range(SHARDS)
    ]
    yield replicas
    for r in replicas:
        stop_replica(r)


def test_each_shard_answers_exactly_its_own_keys(
    commitlog_stub: commitlog_pb2_grpc.CommitLogStub, shards: list[Replica]
) -> None:
    keys = [f"key-{i}" for i in range(16)]
    owners = {k: shard_of("Sharded", k, SHARDS) for k in keys}
    assert set(owners.values()) == set(range(SHARDS))  # both shards own some of them
    stored = append(
        commitlog_stub, "Sharded", [(f"{k} shared-{i % 2}", f"U-{k}") for i, k in enumerate(keys)]
    )
    for r in shards:
        wait_applied(r.stub, stored.end_offset)
    for i, key in enumerate(keys):
        owner = owners[key]
        for shard, r in enumerate(shards):
            request = pb.QueryByKeyRequest(topic="Sharded", key=key)
            uniq = pb.QueryByUniqKeyRequest(topic="Sharded", uniq_key=f"U-{key}")
            if shard == owner:
                assert offsets_of(r.stub.QueryByKey(request)) == [stored.offsets[i]]
                if shard_of("Sharded", f"U-{key}", SHARDS) == shard:
                    assert offsets_of(r.stub.QueryByUniqKey(uniq)) == [stored.offsets[i]]
                continue
            with pytest.raises(grpc.RpcError) as info:
                r.stub.QueryByKey(request)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"shard {owner} of {SHARDS}" in (info.value.details() or "")
    # A key shared by many messages lives whole in its one shard.
    for token in ("shared-0", "shared-1"):
        expected = sorted(
            (o for i, o in enumerate(stored.offsets) if f"shared-{i % 2}" == token), reverse=True
        )
        request = pb.QueryByKeyRequest(topic="Sharded", key=token)
        owner = shard_of("Sharded", token, SHARDS)
        assert offsets_of(shards[owner].stub.QueryByKey(request)) == expected
        with pytest.raises(grpc.RpcError) as info:
            shards[1 - owner].stub.QueryByKey(request)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
