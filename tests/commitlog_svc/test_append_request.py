"""The served Append and AppendStream take their requests as the core reads them
(commitlog_svc/append_request.py): the registration swaps only their deserializer, admission
still names the message and refuses bytes that do not parse, and auth reads the topics."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from commitlog_svc.append_request import (
    AppendRequestColumns,
    RequestBatch,
    add_servicer_to_server,
)
from mqstore.errors import MalformedRequest
from mqstore.formats._core import append_request_wire
from mqstore.rpc.admission import Decoder
from mqstore.rpc.auth import PRODUCE_BATCHES
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

METHOD = "/mqstore.commitlog.v1.CommitLog/Append"


class _Recording:
    def __init__(self) -> None:
        self.generic: list[Any] = []
        self.registered: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.registered = handlers


def test_only_the_append_methods_take_the_cores_columns() -> None:
    server = _Recording()
    add_servicer_to_server(pb_grpc.CommitLogServicer(), server)  # type: ignore[abstract, arg-type]
    assert len(server.generic) == 1
    plain = _Recording()
    pb_grpc.add_CommitLogServicer_to_server(pb_grpc.CommitLogServicer(), plain)  # type: ignore[abstract, arg-type]
    assert server.registered.keys() == plain.registered.keys()
    for name, handler in server.registered.items():
        if name in ("Append", "AppendStream"):
            assert handler.request_deserializer == AppendRequestColumns.FromString
        else:
            assert handler.request_deserializer == plain.registered[name].request_deserializer


def test_admission_names_the_message_and_refuses_what_does_not_parse() -> None:
    decode = Decoder(METHOD, AppendRequestColumns.FromString)
    assert decode.message == pb.AppendRequest.DESCRIPTOR.full_name
    with pytest.raises(MalformedRequest) as err:
        decode(b"\x0a\x05\x0a")
    assert err.value.field == "request"
    wire = append_request_wire("p", 7, [("t", [1], [b"body"], [], [], 5)])
    request = decode(wire)
    assert request == AppendRequestColumns(
        [RequestBatch("t", [1], [b"body"], [], [], 0, 0, 5, "", 0, 0)], "p", 7
    )


def test_auth_reads_each_batchs_topic() -> None:
    wire = append_request_wire(
        "", 0, [("a", [0], [b"x"], [], [], 0), ("b", [0], [b"y"], [], [], 0)]
    )
    assert PRODUCE_BATCHES.topics is not None
    assert set(PRODUCE_BATCHES.topics(AppendRequestColumns.FromString(wire))) == {"a", "b"}
