"""Server reflection on the API ports, as grpc.reflection.v1 and grpc.reflection.v1alpha.

    grpc.reflection.v1.ServerReflection         what grpcurl, grpcui and Postman ask first
    grpc.reflection.v1alpha.ServerReflection    what older clients ask (and the fallback of
                                                those that ask v1 first)

grpcio-reflection (1.85) serves v1alpha only. v1 is the same protocol under another package
name: the same messages with the same field numbers, so the same bytes on the wire. So v1 is
served here by v1alpha's servicer: its requests are read as v1 messages and handed over as
v1alpha ones (re-encoding a request of a few bytes; reflection calls are rare), its answers are
written as they are. The v1 file descriptor is v1alpha's with the package renamed, added to the
default descriptor pool so that reflection can describe the v1 service too. Should something
have put a v1 descriptor in the pool already, that one is used.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any, Final

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection as v1alpha
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc as v1alpha_pb2_grpc

V1ALPHA_SERVICE_NAME: Final[str] = v1alpha.SERVICE_NAME
V1_PACKAGE: Final = "grpc.reflection.v1"
V1_SERVICE_NAME: Final = V1_PACKAGE + ".ServerReflection"
V1_FILE: Final = "grpc/reflection/v1/reflection.proto"
METHOD_NAME: Final = "ServerReflectionInfo"
V1_METHOD: Final = f"/{V1_SERVICE_NAME}/{METHOD_NAME}"
V1ALPHA_METHOD: Final = f"/{V1ALPHA_SERVICE_NAME}/{METHOD_NAME}"
SERVICE_NAMES: Final = (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)


def _renamed(type_name: str, old: str, new: str) -> str:
    """A fully qualified type name of package `old` (".grpc.reflection.v1alpha.X") in `new`."""
    prefix = f".{old}."
    return f".{new}.{type_name[len(prefix) :]}" if type_name.startswith(prefix) else type_name


def _rename_fields(message: descriptor_pb2.DescriptorProto, old: str, new: str) -> None:
    for field in message.field:
        if field.type_name:
            field.type_name = _renamed(field.type_name, old, new)
    for nested in message.nested_type:
        _rename_fields(nested, old, new)


@functools.cache
def v1_file() -> FileDescriptor:
    """grpc/reflection/v1/reflection.proto in the default pool (module docstring)."""
    pool = descriptor_pool.Default()
    try:
        found: FileDescriptor = pool.FindFileContainingSymbol(V1_SERVICE_NAME)
        return found
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(proto)
    old = proto.package
    proto.name = V1_FILE
    proto.package = V1_PACKAGE
    proto.ClearField("options")  # v1alpha's java/go packages and its `deprecated`
    for message in proto.message_type:
        _rename_fields(message, old, V1_PACKAGE)
    for service in proto.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type, old, V1_PACKAGE)
            method.output_type = _renamed(method.output_type, old, V1_PACKAGE)
    pool.AddSerializedFile(proto.SerializeToString())
    added: FileDescriptor = pool.FindFileByName(V1_FILE)
    return added


def v1_message(name: str) -> type[Message]:
    """A message class of grpc.reflection.v1 ("ServerReflectionRequest", ...): for clients."""
    return message_factory.GetMessageClass(v1_file().message_types_by_name[name])


def _v1_handler(servicer: v1alpha.ReflectionServicer) -> grpc.GenericRpcHandler:
    request_class = v1_message("ServerReflectionRequest")
    to_v1alpha = v1alpha_pb2.ServerReflectionRequest.FromString

    def info(requests: Iterator[Message], context: grpc.ServicerContext) -> Iterator[Any]:
        alpha = (to_v1alpha(request.SerializeToString()) for request in requests)
        answers: Iterator[Any] = servicer.ServerReflectionInfo(alpha, context)
        return answers

    handler = grpc.stream_stream_rpc_method_handler(
        info,
        request_deserializer=request_class.FromString,
        response_serializer=v1alpha_pb2.ServerReflectionResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {METHOD_NAME: handler})


def enable_reflection(server: grpc.Server, service_names: Iterable[str]) -> list[str]:
    """Reflection v1 and v1alpha on `server`, listing `service_names` and themselves; the
    names listed, sorted."""
    names = sorted({*service_names, *SERVICE_NAMES})
    v1_file()  # before the first call: describing the v1 service needs its descriptor
    servicer = v1alpha.ReflectionServicer(names)
    server.add_generic_rpc_handlers((_v1_handler(servicer),))
    v1alpha_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    return names
