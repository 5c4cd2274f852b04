"""index_svc as a process while its commit log is away: it starts, reports itself alive but not
ready, refuses queries with UNAVAILABLE, and stops cleanly on SIGTERM."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from mqstore.formats.index_checkpoint import decode_checkpoint
from mqstore.rpc.gen.index.v1 import index_pb2 as pb
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from tests.index_svc.conftest import INDEX_GEOMETRY, Launch
from tests.index_svc.support import closed_port, health_status


def test_without_a_commit_log_the_replica_lives_but_is_never_ready(launch: Launch) -> None:
    index = launch(
        "index_svc", "index-0", *INDEX_GEOMETRY, "--commitlog-target", f"127.0.0.1:{closed_port()}"
    )
    assert health_status(index.health_target, "startup") == "SERVING"
    assert health_status(index.health_target, "liveness") == "SERVING"
    assert health_status(index.health_target, "readiness") == "NOT_SERVING"
    with grpc.insecure_channel(index.target) as channel:
        stub = index_pb2_grpc.IndexStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.QueryByKey(pb.QueryByKeyRequest(topic="T", key="k"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
        assert not status.caught_up
        assert (status.shard_count, status.shard_index) == (1, 0)
        assert (status.store_id, status.applied_offset) == (b"", 0)  # never subscribed


def test_sigterm_stops_the_replica_with_a_clean_checkpoint(launch: Launch) -> None:
    index = launch(
        "index_svc", "index-0", *INDEX_GEOMETRY, "--commitlog-target", f"127.0.0.1:{closed_port()}"
    )
    assert index.stop() == 0
    with open(f"{index.data_dir}/index/checkpoint", "rb") as f:
        checkpoint = decode_checkpoint(f.read(), path="checkpoint")
    assert checkpoint.clean_close


def test_a_replica_takes_its_shard_from_its_pod_ordinal(launch: Launch) -> None:
    index = launch(
        "index_svc",
        "index-5",
        *INDEX_GEOMETRY,
        "--commitlog-target",
        f"127.0.0.1:{closed_port()}",
        "--subscriber-id",
        "index-5",
        "--shard-count",
        "3",
        "--shard-from-ordinal",
        "true",
    )
    with grpc.insecure_channel(index.target) as channel:
        status = index_pb2_grpc.IndexStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10)
    assert (status.shard_count, status.shard_index) == (3, 2)


def test_a_second_replica_on_the_same_directory_refuses_to_start(launch: Launch) -> None:
    target = f"127.0.0.1:{closed_port()}"
    launch("index_svc", "index-0", *INDEX_GEOMETRY, "--commitlog-target", target)
    twin = launch(
        "index_svc", "index-0", *INDEX_GEOMETRY, "--commitlog-target", target, start=False
    )
    twin.ports_file = twin.data_dir + "/twin.ports.json"
    twin.start()
    with pytest.raises(RuntimeError, match="exited with 1"):
        twin.wait_listening()


def test_the_api_port_offers_reflection_and_the_metrics_port_the_index_series(
    launch: Launch,
) -> None:
    index = launch(
        "index_svc", "index-0", *INDEX_GEOMETRY, "--commitlog-target", f"127.0.0.1:{closed_port()}"
    )
    with grpc.insecure_channel(index.target) as channel:
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert "mqstore.index.v1.Index" in services
        stub = index_pb2_grpc.IndexStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.QueryByKey(pb.QueryByKeyRequest(topic="T", key="k"), timeout=10)
    url = f"http://127.0.0.1:{index.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert "mqstore_index_caught_up 0.0" in text
    assert 'mqstore_index_queries_total{kind="key",result="unavailable"} 1.0' in text
    for series in ("mqstore_index_keys_indexed_total", "mqstore_index_dispatch_behind_bytes"):
        assert series in text
