"""What a harness reports when a rule breaks, and how findings are told apart.

A harness raises `Finding` for a broken rule it checks (a wrong status, a partial write, a
decoder that misreads); any other exception escaping a harness is a finding too (the decoder
or the service raised something untyped). `signature` names a finding so that one bug hit a
million times is reported once: the Finding's kind, or the exception type and the innermost
function of project code.
"""

from __future__ import annotations

import os
import traceback

PROJECT_PACKAGES = ("mqstore", "commitlog_svc", "cq_svc", "index_svc")


class Finding(AssertionError):
    """A rule of the target is broken. `kind` is short and stable (it names the finding across
    inputs); the message tells what this input did."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def check(condition: bool, kind: str, message: str) -> None:
    if not condition:
        raise Finding(kind, message)


def signature(exc: BaseException) -> str:
    if isinstance(exc, Finding):
        return exc.kind
    where = "?"
    for frame in traceback.extract_tb(exc.__traceback__):
        parts = frame.filename.replace(os.sep, "/").split("/")
        if any(p in PROJECT_PACKAGES for p in parts[-3:-1]):
            where = f"{'/'.join(parts[-2:])}:{frame.name}"
    return f"{type(exc).__name__}@{where}"
