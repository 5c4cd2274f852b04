"""What the three API targets share: calling through gRPC and judging the status.

The rule for every call: it answers, or it fails with the status of a typed error (the error
interceptor's mapping of an MqstoreError). An untyped exception in a handler reaches the client
as INTERNAL "internal error" (the interceptor's text for a bug); UNKNOWN means an exception
escaped even that; a unary call that hangs past its deadline is a finding too. INVALID_ARGUMENT
must name the field (BadRequest), as T13 asks.

Bytes that are not a request at all are INVALID_ARGUMENT with the field "request": the services
parse the bytes themselves (mqstore/rpc/admission.py; gRPC's own parse answered INTERNAL and
kept memory, issue 23), so that answer is typed like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from fuzz.findings import check
from fuzz.services import Stack
from mqstore.rpc.errors import error_from_rpc

T = TypeVar("T")

TYPED = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# The error interceptor's answer for an untyped exception (mqstore/rpc/errors.py).
BUG_DETAILS = "internal error"
CALL_TIMEOUT_S = 10.0

_STACKS: list[Stack] = []


def shared_stack() -> Stack:
    """One seeded stack per process: the atheris child runs one target for its whole life."""
    if not _STACKS:
        stack = Stack()
        stack.seed()
        _STACKS.append(stack)
    return _STACKS[0]


def replace_shared_stack() -> None:
    """A target broke the stack (a finding): the next shared_stack() is a fresh one."""
    if _STACKS:
        _STACKS.pop().stop()


class Failed(Exception):
    """A call that failed with a status: (code, message, BadRequest field)."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str) -> None:
        super().__init__(f"{code.name}: {message} [{field}]")
        self.code = code
        self.message = message
        self.field = field


def call(where: str, fn: Callable[[], T]) -> T | Failed:
    """The answer, or the failure after checking that its status is a typed one."""
    try:
        return fn()
    except grpc.RpcError as err:
        code, message, field = error_from_rpc(err)
    failed = Failed(code, message, field)
    check_failure(where, failed)
    return failed


def check_failure(where: str, failed: Failed) -> None:
    code = failed.code
    check(code in TYPED, f"{where}.{code.name}", failed.message)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        check(bool(failed.field), f"{where}.invalid-argument-without-field", failed.message)


def raw_unary(channel: grpc.Channel, service: str, method: str) -> Callable[..., Any]:
    """A unary method that sends and receives bytes as they are."""
    return channel.unary_unary(f"/{service}/{method}")
