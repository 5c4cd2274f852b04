"""The store end to end with mutual TLS and tokens everywhere: followers subscribe to the commit
log with their own certificate and token, the SDK and the `mqstore` command work with the
matching settings, each token does what its scopes say and no more, and no token ever reaches
a service's log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import pytest

from mqstore.client import Admin, Consumer, Producer
from mqstore.client.errors import PermissionDenied, Unauthenticated
from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.testing.cluster import Cluster
from tests.environ import environ_without

from .conftest import Material, client_settings

pytestmark = pytest.mark.timeout(120)
T = TypeVar("T")
WAIT_S = 20.0


def eventually(probe: Callable[[], T | None], timeout_s: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s: last value {value!r}")
        time.sleep(0.05)


def test_followers_subscribe_over_mutual_tls_with_their_own_token(
    secure_cluster: Cluster, material: Material
) -> None:
    security = material.security(token=material.tokens["admin"])
    with make_channel(secure_cluster.commitlog.target, security) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)

        def connected() -> set[str]:
            status = stub.GetStatus(cl.GetStatusRequest(), timeout=5)
            return {s.subscriber_id for s in status.subscribers if s.connected}

        assert eventually(lambda: connected() >= {"cq", "index"} and connected())


def test_sdk_produces_consumes_and_queries_with_least_privilege(
    secure_cluster: Cluster, material: Material
) -> None:
    topic = "orders-e2e"
    with Producer(client_settings(secure_cluster, material, "orders-producer")) as producer:
        sent = [
            producer.send_sync(topic, f"order {i}".encode(), key=f"order-{i}") for i in range(5)
        ]
        with pytest.raises(PermissionDenied):
            producer.send_sync("payments", b"not mine to write")

    consumer_settings = client_settings(secure_cluster, material, "orders-consumer")
    with Admin(consumer_settings) as admin:  # queues, then pulls: consume:orders* is enough
        eventually(lambda: sum(q.max_offset for q in admin.queues(topic)) == len(sent))
    with Consumer(consumer_settings, topic, start="earliest", long_poll_ms=0) as consumer:
        got = [m.body for m in consumer.messages(follow=False)]
    assert sorted(got) == sorted(f"order {i}".encode() for i in range(5))

    with Admin(consumer_settings) as admin:
        found = eventually(lambda: admin.query_by_key(topic, "order-3"))
        assert [m.body for m in found] == [b"order 3"]
        with pytest.raises(PermissionDenied):
            admin.topics()  # names every topic: admin only
        with pytest.raises(PermissionDenied):
            admin.get_message(sent[0].msg_id)  # a raw offset may be any topic's: consume:*
    with Admin(client_settings(secure_cluster, material, "reader-all")) as admin:
        assert admin.get_message(sent[0].msg_id).body == b"order 0"
    with Admin(client_settings(secure_cluster, material, "admin")) as admin:
        assert topic in admin.topics()
        status = admin.status()
        assert all(r.reachable for r in (*status.cq, *status.index)), status


def test_sdk_without_a_token_is_unauthenticated(
    secure_cluster: Cluster, material: Material
) -> None:
    with (
        Admin(client_settings(secure_cluster, material, None)) as admin,
        pytest.raises(Unauthenticated),
    ):
        admin.lag()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", *args],
        check=False,
        env=environ_without("MQSTORE_") | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_works_with_the_tls_and_token_variables(
    secure_cluster: Cluster, material: Material
) -> None:
    env = {
        "MQSTORE_COMMITLOG": secure_cluster.commitlog.target,
        "MQSTORE_CQ": secure_cluster.followers["cq"].target,
        "MQSTORE_INDEX": secure_cluster.followers["index"].target,
        "MQSTORE_TLS_CA": str(material.ca),
        "MQSTORE_TLS_CERT": str(material.client_cert),
        "MQSTORE_TLS_KEY": str(material.client_key),
        "MQSTORE_TOKEN_FILE": str(material.token_file("admin")),
    }
    done = _cli(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    replicas = [*status["cq"], *status["index"]]
    assert len(replicas) == 2 and all(r["reachable"] for r in replicas), status

    without_token = {k: v for k, v in env.items() if k != "MQSTORE_TOKEN_FILE"}
    refused = _cli(without_token, "status", "--json")
    assert refused.returncode == 1, refused.stderr
    assert "UNAUTHENTICATED" in refused.stderr


def test_no_token_reaches_a_service_log(secure_cluster: Cluster, material: Material) -> None:
    """Every token is used (valid, refused for its scope, and wrong), then every log line of
    every service is searched for every token and every token's hash."""
    wrong = "wrong-" + material.tokens["admin"][::-1]
    request = cl.AppendRequest(
        batches=[cl.MessageBatch(topic="payments", queue_ids=[0], bodies=[b"x"])]
    )
    for token in [*material.tokens.values(), wrong]:
        with make_channel(secure_cluster.commitlog.target, material.security(token=token)) as ch:
            stub = commitlog_pb2_grpc.CommitLogStub(ch)
            for method, message in (
                (stub.GetStatus, cl.GetStatusRequest()),
                (stub.Append, request),
            ):
                try:
                    method(message, timeout=5)
                except grpc.RpcError as err:
                    assert err.code() in (
                        grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.PERMISSION_DENIED,
                    )
    logs = {p.name: p.read_text(encoding="utf-8") for p in secure_cluster.logs.iterdir()}
    assert set(logs) >= {"commitlog.log", "cq.log", "index.log"}
    # The logs are the real ones: the refusals above are there, by token name.
    assert "refused" in logs["commitlog.log"] and "no-scopes" in logs["commitlog.log"]
    tokens_file = material.tokens_file.read_text(encoding="utf-8")
    hashes = [line.split('"')[1] for line in tokens_file.splitlines() if line.startswith("sha256")]
    assert len(hashes) == len(material.tokens)
    for name, text in logs.items():
        for secret in [*material.tokens.values(), wrong, *hashes]:
            assert secret not in text, f"a token or its hash is in {name}"
