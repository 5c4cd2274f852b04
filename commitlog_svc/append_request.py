"""An AppendRequest as the service takes it: read by the compiled core straight from the
request bytes into the columns a MessageBatch takes (formats/_core_append.pxi,
read_append_request, pinned to the protobuf runtime by tests/formats/test_append_wire.py).

Why not the generated class: upb parsed each request into a message, and then every batch's
repeated fields were copied again, one Python object at a time, into the lists the encoder
takes (0.15-0.2 us a message on top of the parse). Here each body becomes its bytes object
once, and the lists are the ones the encoder reads.

The request reaches the servicer through admission (rpc/admission.py) like any other: its
Decoder calls `AppendRequestColumns.FromString` (named by `DESCRIPTOR`, as a generated class
is), so malformed bytes are counted and refused as before, and the caller's produce scope is
checked on `batches[i].topic` (rpc/auth.py) as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc

from mqstore.formats._core import read_append_request
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

# The methods whose requests are AppendRequests.
APPEND_METHODS = ("Append", "AppendStream")


class RequestBatch(NamedTuple):
    """One MessageBatch of a request, its fields as protobuf parses them (lists empty when
    the sender left them out; born_host the sender's text)."""

    topic: str
    queue_ids: list[int]
    bodies: list[bytes]
    properties: list[bytes]
    sys_flags: list[int]
    sys_flag: int
    flag: int
    born_timestamp_ms: int
    born_host: str
    reconsume_times: int
    prepared_tx_offset: int


@dataclass(frozen=True, slots=True)
class AppendRequestColumns:
    """An AppendRequest's fields (the proto's names)."""

    batches: list[RequestBatch]
    producer_id: str
    sequence: int

    # Admission names the message in its refusal of bytes that do not parse.
    DESCRIPTOR = pb.AppendRequest.DESCRIPTOR

    @classmethod
    def FromString(cls, raw: bytes) -> AppendRequestColumns:  # noqa: N802 (protobuf's name)
        """The request in `raw`; ValueError when protobuf would refuse the bytes."""
        batches, producer_id, sequence = read_append_request(raw)
        return cls([RequestBatch._make(b) for b in batches], producer_id, sequence)


def add_servicer_to_server(servicer: pb_grpc.CommitLogServicer, server: grpc.Server) -> None:
    """The generated registration, but with Append and AppendStream taking their requests as
    AppendRequestColumns."""
    pb_grpc.add_CommitLogServicer_to_server(servicer, _ColumnsServer(server))  # type: ignore[arg-type]


class _ColumnsServer:
    """What the generated registration sees as its server: it hands the method handlers on
    with the append methods' deserializer swapped."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers come again through add_registered_method_handlers

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        handlers = dict(handlers)
        for name in APPEND_METHODS:
            handlers[name] = handlers[name]._replace(  # type: ignore[attr-defined]
                request_deserializer=AppendRequestColumns.FromString
            )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, handlers),)
        )
        self._server.add_registered_method_handlers(service, handlers)
