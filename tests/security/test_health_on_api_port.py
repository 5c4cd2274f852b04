"""Health on the API ports of a secure store (mutual TLS and tokens: conftest.py's cluster):
Check needs no token, as grpc_health_probe and load balancers send none, but the port's TLS
still applies; reflection v1 needs a valid token, as v1alpha does; Watch stays on the health
port."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mqstore.rpc import reflection
from mqstore.rpc.channel import ChannelSecurity, make_channel
from mqstore.testing.cluster import Cluster
from tests.e2e.malformed import MALFORMED

from .conftest import Material

pytestmark = pytest.mark.timeout(60)
CALL_TIMEOUT_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
API = {
    "commitlog": "mqstore.commitlog.v1.CommitLog",
    "cq": "mqstore.consumequeue.v1.ConsumeQueue",
    "index": "mqstore.index.v1.Index",
}


def targets(c: Cluster) -> dict[str, str]:
    return {"commitlog": c.commitlog.target} | {n: p.target for n, p in c.followers.items()}


def code_of_check(target: str, security: ChannelSecurity, service: str = "") -> grpc.StatusCode:
    with make_channel(target, security) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            answer = stub.Check(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    assert answer.status == SERVING, (target, service)
    return grpc.StatusCode.OK


def test_check_needs_no_token_on_the_api_port(secure_cluster: Cluster, material: Material) -> None:
    no_token = material.security(token=None)
    for name, target in targets(secure_cluster).items():
        for service in ("", "readiness", API[name]):
            assert code_of_check(target, no_token, service) == grpc.StatusCode.OK, (name, service)


def test_check_does_not_look_at_a_token(secure_cluster: Cluster, material: Material) -> None:
    """A probe configured with a stale or wrong header still gets the port's health."""
    for token in ("not-a-token", material.tokens["expired-admin"], material.tokens["no-scopes"]):
        security = material.security(token=token)
        assert code_of_check(secure_cluster.commitlog.target, security) == grpc.StatusCode.OK


def test_check_on_the_api_port_still_needs_its_tls(
    secure_cluster: Cluster, material: Material
) -> None:
    target = secure_cluster.commitlog.target
    assert code_of_check(target, ChannelSecurity()) == grpc.StatusCode.UNAVAILABLE
    no_certificate = material.security(client_cert=False)
    assert code_of_check(target, no_certificate) == grpc.StatusCode.UNAVAILABLE


def test_watch_is_not_open_on_the_api_port(secure_cluster: Cluster, material: Material) -> None:
    request = health_pb2.HealthCheckRequest(service="readiness")
    for token in (None, material.tokens["admin"]):
        with make_channel(secure_cluster.commitlog.target, material.security(token=token)) as ch:
            with pytest.raises(grpc.RpcError) as caught:
                next(health_pb2_grpc.HealthStub(ch).Watch(request, timeout=CALL_TIMEOUT_S))
            assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def list_services_v1(target: str, security: ChannelSecurity) -> set[str]:
    request_class = reflection.v1_message("ServerReflectionRequest")
    response_class = reflection.v1_message("ServerReflectionResponse")
    with make_channel(target, security) as channel:
        info = channel.stream_stream(
            reflection.V1_METHOD,
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        answers = info(iter([request_class(list_services="")]), timeout=CALL_TIMEOUT_S)
        return {s.name for a in answers for s in a.list_services_response.service}  # type: ignore[attr-defined]


def test_reflection_v1_needs_a_valid_token_and_no_scope(
    secure_cluster: Cluster, material: Material
) -> None:
    target = secure_cluster.followers["index"].target
    listed = list_services_v1(target, material.security(token=material.tokens["no-scopes"]))
    assert API["index"] in listed and "grpc.health.v1.Health" in listed
    with pytest.raises(grpc.RpcError) as caught:
        list_services_v1(target, material.security(token=None))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_check_bytes_that_do_not_parse_are_invalid_argument_without_a_token(
    secure_cluster: Cluster, material: Material
) -> None:
    """Open does not mean unguarded: the bytes are parsed by admission.py as every method's."""
    for name, target in targets(secure_cluster).items():
        with make_channel(target, material.security(token=None)) as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            for payload in MALFORMED:
                with pytest.raises(grpc.RpcError) as caught:
                    check(payload, timeout=CALL_TIMEOUT_S)
                assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, payload)
        assert code_of_check(target, material.security(token=None)) == grpc.StatusCode.OK
