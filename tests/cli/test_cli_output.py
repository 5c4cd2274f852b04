"""In-process rules of the command's output: every error's exit code, and a message that never
spans two lines of a terminal."""

from __future__ import annotations

import grpc
import pytest

from mqstore import errors as domain
from mqstore.cli.options import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_UNREACHABLE,
    as_command_error,
    exit_code_for,
)
from mqstore.cli.render import BODY_CHARS_MAX, body_text, message_block, message_line
from mqstore.client.errors import error_for, refusal
from mqstore.client.message import Message
from mqstore.client.settings import ClientSettings

EXPECTED_EXIT = {
    grpc.StatusCode.UNAVAILABLE: EXIT_UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNREACHABLE,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
}


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK])
def test_every_status_code_has_its_exit_code(code: grpc.StatusCode) -> None:
    err = error_for(code, "details", method="X/Y")
    assert exit_code_for(err) == EXPECTED_EXIT.get(code, EXIT_ERROR)
    assert as_command_error(err).exit_code == exit_code_for(err)


def test_a_refused_message_exits_by_what_the_refusal_amounts_to() -> None:
    assert exit_code_for(refusal("MESSAGE_ILLEGAL", "bad")) == EXIT_ERROR
    assert exit_code_for(refusal("CREATE_MAPPED_FILE_FAILED", "disk full")) == EXIT_ERROR
    assert exit_code_for(refusal("SERVICE_NOT_AVAILABLE", "stopping")) == EXIT_UNREACHABLE


def test_domain_errors_map_like_their_status() -> None:
    assert exit_code_for(domain.NotFound("x")) == EXIT_NOT_FOUND
    assert exit_code_for(domain.Unavailable("x")) == EXIT_UNREACHABLE
    assert exit_code_for(domain.InvalidArgument("x")) == EXIT_ERROR


def test_an_error_prints_as_one_line_naming_the_unreachable_address() -> None:
    settings = ClientSettings(commitlog="cl:1", cq=("cq-a:2", "cq-b:2"), index=("ix:3",))
    err = error_for(grpc.StatusCode.UNAVAILABLE, "connect\nfailed", method="ConsumeQueue/Pull")
    text = as_command_error(err, settings).format_message()
    assert "\n" not in text
    assert "cq_svc at cq-a:2,cq-b:2" in text and "connect failed" in text
    not_found = error_for(grpc.StatusCode.NOT_FOUND, "gone", method="CommitLog/GetMessage")
    assert "commitlog_svc at" not in as_command_error(not_found, settings).format_message()


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        (b"plain", "plain"),
        ("wörld ✓".encode(), "wörld ✓"),
        (b"two\nlines\r\n", "two\\nlines\\r\\n"),
        (b"tab\there", "tab\\there"),
        (b"\x1b[2Jclear", "\\x1b[2Jclear"),  # no escape sequence reaches the terminal
        (b"\xff\xfe not utf-8", "\\xff\\xfe not utf-8"),
        (b"", ""),
    ],
)
def test_a_body_prints_on_one_line_with_control_characters_escaped(body: bytes, shown: str) -> None:
    assert body_text(body) == shown


def test_a_long_body_is_cut_to_the_limit_with_an_ellipsis() -> None:
    text = body_text(b"x" * 1000)
    assert len(text) == BODY_CHARS_MAX and text.endswith("…")
    assert body_text(b"x" * BODY_CHARS_MAX) == "x" * BODY_CHARS_MAX
    assert body_text(b"x" * 1000, None) == "x" * 1000


def test_message_line_and_block() -> None:
    m = Message(
        topic="orders",
        queue_id=2,
        queue_offset=7,
        commit_log_offset=99,
        body=b'{\n  "id": 42\n}',
        properties={"KEYS": "k1 k2", "TAGS": "created", "UNIQ_KEY": "U1", "region": "eu"},
        store_timestamp_ms=0,
        msg_id="MSGID",
    )
    line = message_line(m)
    assert line.startswith("2:7  1970-01-01T") and line.endswith('  k1 k2  {\\n  "id": 42\\n}')
    block = message_block(m).splitlines()
    assert "msg_id             MSGID" in block
    assert "property region    eu" in block
    assert block[-4:] == ["body:", "{", '  "id": 42', "}"]  # the whole body, as written
