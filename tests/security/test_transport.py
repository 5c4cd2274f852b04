"""TLS and mutual TLS on the API ports, and the health port beside them: a failed handshake is
UNAVAILABLE at the client (it never reaches auth, reference E20); the health port answers
grpc.health.v1 in plaintext with no token, and nothing else."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mqstore.launcher import health_status
from mqstore.rpc.channel import ChannelSecurity, make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc
from mqstore.testing.cluster import Cluster

from .conftest import Material, follower_flags, server_flags

pytestmark = pytest.mark.timeout(60)
CALL_TIMEOUT_S = 5.0
WAIT_S = 20.0


def status_code(target: str, security: ChannelSecurity) -> grpc.StatusCode:
    with make_channel(target, security) as channel:
        stub = commitlog_pb2_grpc.CommitLogStub(channel)
        try:
            stub.GetStatus(cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def tls_only(material: Material, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A commit log serving TLS without client certificates and without tokens."""
    c = Cluster(
        tmp_path_factory.mktemp("tls-only"),
        extra={"commitlog_svc": server_flags(material, mtls=False, tokens=False)},
    )
    try:
        c.start_commitlog()
        yield c
    finally:
        c.stop_all()


# -- TLS ------------------------------------------------------------------------------------------


def test_a_tls_client_trusting_the_ca_is_served(tls_only: Cluster, material: Material) -> None:
    security = ChannelSecurity(tls=True, ca_file=str(material.ca))
    assert status_code(tls_only.commitlog.target, security) == grpc.StatusCode.OK


def test_the_name_checked_can_be_overridden_and_is_checked(
    tls_only: Cluster, material: Material
) -> None:
    port = tls_only.commitlog.ports["port"]
    good = ChannelSecurity(tls=True, ca_file=str(material.ca), server_name="localhost")
    assert status_code(f"127.0.0.1:{port}", good) == grpc.StatusCode.OK
    bad = ChannelSecurity(tls=True, ca_file=str(material.ca), server_name="elsewhere.example")
    assert status_code(f"127.0.0.1:{port}", bad) == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_client_to_a_tls_port_is_unavailable(tls_only: Cluster) -> None:
    assert status_code(tls_only.commitlog.target, ChannelSecurity()) == grpc.StatusCode.UNAVAILABLE


def test_a_client_trusting_another_ca_is_unavailable(tls_only: Cluster, material: Material) -> None:
    security = ChannelSecurity(tls=True, ca_file=str(material.other_ca))
    assert status_code(tls_only.commitlog.target, security) == grpc.StatusCode.UNAVAILABLE


# -- mutual TLS -----------------------------------------------------------------------------------


def test_mutual_tls_serves_a_client_with_a_certificate_from_the_ca(
    secure_cluster: Cluster, material: Material
) -> None:
    security = material.security(token=material.tokens["no-scopes"])
    assert status_code(secure_cluster.commitlog.target, security) == grpc.StatusCode.OK


def test_mutual_tls_refuses_a_client_without_a_certificate(
    secure_cluster: Cluster, material: Material
) -> None:
    security = material.security(token=material.tokens["admin"], client_cert=False)
    assert status_code(secure_cluster.commitlog.target, security) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_a_certificate_from_another_ca(
    secure_cluster: Cluster, material: Material
) -> None:
    security = ChannelSecurity(
        tls=True,
        ca_file=str(material.ca),
        cert_file=str(material.other_client_cert),
        key_file=str(material.other_client_key),
        token=material.tokens["admin"],
    )
    for name in ("commitlog", "cq", "index"):
        target = (
            secure_cluster.commitlog.target
            if name == "commitlog"
            else secure_cluster.followers[name].target
        )
        assert status_code(target, security) == grpc.StatusCode.UNAVAILABLE, name


def test_a_plaintext_client_to_a_mutual_tls_port_is_unavailable(secure_cluster: Cluster) -> None:
    security = ChannelSecurity(token="anything")
    assert status_code(secure_cluster.commitlog.target, security) == grpc.StatusCode.UNAVAILABLE


# -- the health port ------------------------------------------------------------------------------


def _processes(c: Cluster) -> dict[str, str]:
    return {"commitlog": c.commitlog.health_target} | {
        name: p.health_target for name, p in c.followers.items()
    }


def test_the_health_port_answers_in_plaintext_without_a_token(secure_cluster: Cluster) -> None:
    for name, target in _processes(secure_cluster).items():
        for service in ("", "readiness", "liveness"):
            assert health_status(target, service) == health_pb2.HealthCheckResponse.SERVING, (
                name,
                service,
            )


def test_the_health_port_serves_nothing_but_health(
    secure_cluster: Cluster, material: Material
) -> None:
    """Not the API, not reflection: not even with a valid token."""
    metadata = [("authorization", "Bearer " + material.tokens["admin"])]
    for name, target in _processes(secure_cluster).items():
        with grpc.insecure_channel(target) as channel:
            calls = [
                lambda ch=channel: commitlog_pb2_grpc.CommitLogStub(ch).GetStatus(
                    cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S, metadata=metadata
                ),
                lambda ch=channel: consumequeue_pb2_grpc.ConsumeQueueStub(ch).Pull(
                    cq.PullRequest(topic="orders"), timeout=CALL_TIMEOUT_S, metadata=metadata
                ),
                lambda ch=channel: list(
                    reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                        timeout=CALL_TIMEOUT_S,
                    )
                ),
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call()
                assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED, name
            health = health_pb2_grpc.HealthStub(channel)
            assert health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S).status == (
                health_pb2.HealthCheckResponse.SERVING
            )


# -- followers ------------------------------------------------------------------------------------


def test_a_follower_without_its_token_is_refused_and_never_ready(
    secure_cluster: Cluster, material: Material
) -> None:
    flags = follower_flags(material)
    at = flags.index("--commitlog-token-file")
    del flags[at : at + 2]
    secure_cluster.extra["cq_svc"] = flags  # only this follower: added and started below
    try:
        secure_cluster.add("cq_svc", "cq-no-token")
    finally:
        secure_cluster.extra["cq_svc"] = follower_flags(material)
    try:
        process = secure_cluster.start("cq-no-token", ready=False)
        log = secure_cluster.logs / "cq-no-token.log"
        deadline = time.monotonic() + WAIT_S
        while "UNAUTHENTICATED" not in log.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, log.read_text(encoding="utf-8")
            time.sleep(0.05)
        readiness = health_status(process.health_target, "readiness")
        assert readiness == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        secure_cluster.followers.pop("cq-no-token").stop()


def test_tokens_work_without_tls_for_a_follower_and_a_client(
    material: Material, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Plaintext with tokens (loopback, or a mesh doing the TLS): gRPC would refuse call
    credentials here, so the token must travel as plain metadata, from followers too."""
    tokens = ["--tokens-file", str(material.tokens_file)]
    c = Cluster(
        tmp_path_factory.mktemp("plaintext-tokens"),
        extra={
            "commitlog_svc": tokens,
            "cq_svc": [
                *tokens,
                "--commitlog-token-file",
                str(material.token_file("followers")),
            ],
        },
    )
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.start("cq")  # ready: it subscribed with its token over plaintext
        target = c.followers["cq"].target
        no_scopes = ChannelSecurity(token=material.tokens["no-scopes"])
        with make_channel(target, no_scopes) as channel:
            stub = consumequeue_pb2_grpc.ConsumeQueueStub(channel)
            assert stub.GetStatus(cq.GetStatusRequest(), timeout=CALL_TIMEOUT_S).caught_up
        with make_channel(target) as channel:
            stub = consumequeue_pb2_grpc.ConsumeQueueStub(channel)
            with pytest.raises(grpc.RpcError) as caught:
                stub.GetStatus(cq.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        c.stop_all()
