"""Health and reflection on the services' API ports, as grpc_health_probe and grpcurl use them:
real commitlog_svc, cq_svc and index_svc processes on loopback (mqstore/testing/cluster.py)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_pb2_grpc

from mqstore.launcher import ServiceProcess
from mqstore.rpc import reflection
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.testing.cluster import Cluster, start_store

pytestmark = pytest.mark.timeout(60)
CALL_TIMEOUT_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH = "grpc.health.v1.Health"
PROBES = ("", "startup", "readiness", "liveness")
# The API service of each process, by the name of its generated descriptor.
API = {
    "commitlog": cl.DESCRIPTOR.services_by_name["CommitLog"].full_name,
    "cq": cq.DESCRIPTOR.services_by_name["ConsumeQueue"].full_name,
    "index": ix.DESCRIPTOR.services_by_name["Index"].full_name,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_store(tmp_path_factory.mktemp("health-api"))
    try:
        yield c
    finally:
        c.stop_all()


def processes(c: Cluster) -> dict[str, ServiceProcess]:
    return {"commitlog": c.commitlog, "cq": c.followers["cq"], "index": c.followers["index"]}


def check(target: str, service: str) -> int:
    """The status Check answers, as grpc_health_probe -addr=<target> -service=<service> asks."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return int(stub.Check(request, timeout=CALL_TIMEOUT_S).status)


def reflect_v1(target: str, requests: list[object]) -> list[object]:
    """The answers of one grpc.reflection.v1 stream, as grpcurl asks it first."""
    request_class = reflection.v1_message("ServerReflectionRequest")
    response_class = reflection.v1_message("ServerReflectionResponse")
    with grpc.insecure_channel(target) as channel:
        info = channel.stream_stream(
            reflection.V1_METHOD,
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        return list(info(iter(requests), timeout=CALL_TIMEOUT_S))


def v1_request(**fields: str) -> object:
    return reflection.v1_message("ServerReflectionRequest")(**fields)


# -- health ---------------------------------------------------------------------------------------


def test_check_on_the_api_port_answers_for_the_process_and_each_service(store: Cluster) -> None:
    for name, process in processes(store).items():
        for service in (*PROBES, API[name]):
            assert check(process.target, service) == SERVING, (name, service)
        # The health port holds the same state.
        assert check(process.health_target, API[name]) == SERVING, name


def test_check_of_a_service_a_port_does_not_serve_is_not_found(store: Cluster) -> None:
    for name, process in processes(store).items():
        others = [s for n, s in API.items() if n != name]
        for service in ("no.such.Service", *others):
            with pytest.raises(grpc.RpcError) as caught:
                check(process.target, service)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND, (name, service)


def test_watch_is_left_to_the_health_port(store: Cluster) -> None:
    """On the API port a Watch would hold a server thread for as long as it is open."""
    request = health_pb2.HealthCheckRequest(service="readiness")
    with grpc.insecure_channel(store.commitlog.target) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            next(health_pb2_grpc.HealthStub(channel).Watch(request, timeout=CALL_TIMEOUT_S))
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with grpc.insecure_channel(store.commitlog.health_target) as channel:
        first = next(health_pb2_grpc.HealthStub(channel).Watch(request, timeout=CALL_TIMEOUT_S))
        assert first.status == SERVING


# -- reflection -----------------------------------------------------------------------------------


def test_reflection_v1_lists_the_api_health_and_reflection(store: Cluster) -> None:
    for name, process in processes(store).items():
        (answer,) = reflect_v1(process.target, [v1_request(list_services="")])
        listed = {s.name for s in answer.list_services_response.service}  # type: ignore[attr-defined]
        assert listed == {API[name], HEALTH, *reflection.SERVICE_NAMES}, name


def test_reflection_v1_describes_every_service_it_lists(store: Cluster) -> None:
    """What `grpcurl describe` does: the file of each symbol, with its dependencies."""
    target = store.followers["cq"].target
    (listing,) = reflect_v1(target, [v1_request(list_services="")])
    names = [s.name for s in listing.list_services_response.service]  # type: ignore[attr-defined]
    answers = reflect_v1(target, [v1_request(file_containing_symbol=n) for n in names])
    for name, answer in zip(names, answers, strict=True):
        assert answer.WhichOneof("message_response") == "file_descriptor_response", name  # type: ignore[attr-defined]
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in answer.file_descriptor_response.file_descriptor_proto  # type: ignore[attr-defined]
        ]
        services = {f"{f.package}.{s.name}" for f in files for s in f.service}
        assert name in services, name
    (missing,) = reflect_v1(target, [v1_request(file_containing_symbol="no.such.Symbol")])
    assert missing.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]  # type: ignore[attr-defined]


def test_reflection_v1alpha_still_answers_the_same(store: Cluster) -> None:
    with grpc.insecure_channel(store.commitlog.target) as channel:
        stub = v1alpha_pb2_grpc.ServerReflectionStub(channel)
        request = v1alpha_pb2.ServerReflectionRequest(list_services="")
        (answer,) = stub.ServerReflectionInfo(iter([request]), timeout=CALL_TIMEOUT_S)
    listed = {s.name for s in answer.list_services_response.service}
    assert listed == {API["commitlog"], HEALTH, *reflection.SERVICE_NAMES}


# Field numbers and types of grpc/reflection/v1/reflection.proto as published: a v1 client
# (grpcurl) compiled from it must read our answers.
V1_FIELDS = {
    "ServerReflectionRequest": {
        "host": (1, "string"),
        "file_by_filename": (3, "string"),
        "file_containing_symbol": (4, "string"),
        "file_containing_extension": (5, "ExtensionRequest"),
        "all_extension_numbers_of_type": (6, "string"),
        "list_services": (7, "string"),
    },
    "ExtensionRequest": {"containing_type": (1, "string"), "extension_number": (2, "int32")},
    "ServerReflectionResponse": {
        "valid_host": (1, "string"),
        "original_request": (2, "ServerReflectionRequest"),
        "file_descriptor_response": (4, "FileDescriptorResponse"),
        "all_extension_numbers_response": (5, "ExtensionNumberResponse"),
        "list_services_response": (6, "ListServiceResponse"),
        "error_response": (7, "ErrorResponse"),
    },
    "FileDescriptorResponse": {"file_descriptor_proto": (1, "bytes")},
    "ExtensionNumberResponse": {"base_type_name": (1, "string"), "extension_number": (2, "int32")},
    "ListServiceResponse": {"service": (1, "ServiceResponse")},
    "ServiceResponse": {"name": (1, "string")},
    "ErrorResponse": {"error_code": (1, "int32"), "error_message": (2, "string")},
}
_SCALARS = {9: "string", 5: "int32", 12: "bytes"}


def test_the_v1_descriptor_is_the_published_one() -> None:
    file = reflection.v1_file()
    assert (file.name, file.package) == (
        "grpc/reflection/v1/reflection.proto",
        "grpc.reflection.v1",
    )
    got = {
        message.name: {
            f.name: (
                f.number,
                f.message_type.full_name.removeprefix("grpc.reflection.v1.")
                if f.message_type is not None
                else _SCALARS[f.type],
            )
            for f in message.fields
        }
        for message in file.message_types_by_name.values()
    }
    assert got == V1_FIELDS
    method = file.services_by_name["ServerReflection"].methods_by_name["ServerReflectionInfo"]
    assert method.full_name == "grpc.reflection.v1.ServerReflection.ServerReflectionInfo"
    assert method.input_type.name == "ServerReflectionRequest"
    assert method.output_type.name == "ServerReflectionResponse"


# -- graceful shutdown ----------------------------------------------------------------------------


def test_a_graceful_stop_turns_the_api_ports_health_off_before_the_port_closes(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """SIGTERM: during drain_delay_s the API port still answers, and says NOT_SERVING for
    readiness, "" and its service, so that a balancer probing it takes it out first."""
    c = Cluster(
        tmp_path_factory.mktemp("health-drain"),
        extra={"commitlog_svc": ["--drain-delay-s", "2"]},
    )
    try:
        process = c.start_commitlog()
        assert check(process.target, API["commitlog"]) == SERVING
        process.signal(signal.SIGTERM)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while check(process.target, "readiness") != NOT_SERVING:
            assert time.monotonic() < deadline, "readiness stayed SERVING"
            time.sleep(0.02)
        for service in ("", API["commitlog"], "startup"):
            assert check(process.target, service) == NOT_SERVING, service
        assert check(process.health_target, "readiness") == NOT_SERVING
        assert process.proc is not None
        assert process.proc.wait(30) == 0
    finally:
        c.stop_all()
