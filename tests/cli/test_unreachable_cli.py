"""`mqstore` against a store it cannot reach, run as a user runs it (a process): one line on
stderr naming the address, the likely cause and the option to change, exit 3, within a few
seconds of the connect deadline (3 s) whatever `--timeout` says.

Before: `mqstore produce` was silent for its --timeout of retries (10 s by default) and then
said only that the commit log did not take the messages; a plaintext client at a TLS port said
"Socket closed"; a TLS client at a plaintext port printed gRPC's handshake log lines first.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mqstore.cli.options import EXIT_ERROR, EXIT_UNREACHABLE, EXIT_USAGE
from mqstore.testing.cluster import Cluster
from tests.client.reach import (
    MISMATCH_CONNECT_TIMEOUT_S,
    Secrets,
    free_address,
    plain,
    secrets,
    secure,
)
from tests.environ import environ_without

__all__ = ["plain", "secrets", "secure"]  # fixtures, used by name

REPO = Path(__file__).resolve().parents[2]
# A --timeout far above the connect deadline: the command must not wait for it. Before, the
# producer retried for the whole of it.
PATIENT_TIMEOUT_S = "30"
# Told within this of starting: the connect deadline (3 s) plus the interpreter's start, which
# takes 4-7 s on a loaded 2-core machine (`mqstore --help` alone). Before: over 30 s.
TOLD_WITHIN_S = 20.0
RUN_TIMEOUT_S = 60.0


def mqstore(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The command with no MQSTORE_* from the environment, and how long it took."""
    env = environ_without("MQSTORE_", "GRPC_")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "--timeout", PATIENT_TIMEOUT_S, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    return done, time.monotonic() - started


# The TLS mismatches' cause is the point; the default deadline is waited out by the test with
# nothing listening (tests/client/reach.py).
MISMATCH = ("--connect-timeout", str(MISMATCH_CONNECT_TIMEOUT_S))


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """stderr is exactly one line, "error: ..." (no traceback, no gRPC log, no warning)."""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_produce_and_consume_with_nothing_listening_exit_3_within_seconds() -> None:
    address = free_address()
    for args, named in (
        (("--commitlog", address, "produce", "demo", "hello"), "commitlog_svc at"),
        (("--cq", address, "consume", "demo"), "cq_svc at"),
    ):
        done, took_s = mqstore(*args)
        assert done.returncode == EXIT_UNREACHABLE, (args, done.stderr)
        line = one_error_line(done)
        assert f"{named} {address}" in line and "connection refused" in line, line
        assert took_s < TOLD_WITHIN_S, (args, took_s)
        print(f"{args[2]}, nothing listening: exit 3 after {took_s:.1f} s: {line}")  # a figure


def test_a_plaintext_command_at_a_tls_store_is_told_to_use_tls(secure: Cluster) -> None:
    address = secure.commitlog.target
    done, took_s = mqstore(*MISMATCH, "--commitlog", address, "produce", "demo", "hello")
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    line = one_error_line(done)
    assert address in line and "expects TLS" in line and "--tls-ca" in line, line
    assert took_s < TOLD_WITHIN_S, took_s
    print(f"plaintext at TLS: exit 3 after {took_s:.1f} s: {line}")


def test_a_tls_command_at_a_plaintext_store_is_told_it_answers_in_plaintext(
    plain: Cluster, secrets: Secrets
) -> None:
    address = plain.commitlog.target
    done, took_s = mqstore(
        *MISMATCH, "--commitlog", address, "--tls-ca", str(secrets.ca), "produce", "demo", "hello"
    )
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    line = one_error_line(done)  # and none of gRPC's "Handshake failed" log lines
    assert address in line and "plaintext" in line, line
    assert took_s < TOLD_WITHIN_S, took_s


def test_mtls_without_a_client_certificate_is_told_to_give_one(
    secure: Cluster, secrets: Secrets
) -> None:
    address = secure.commitlog.target
    done, took_s = mqstore(
        *MISMATCH, "--commitlog", address, "--tls-ca", str(secrets.ca), "--token-file",
        str(secrets.token_file), "produce", "demo", "hello",
    )  # fmt: skip
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    line = one_error_line(done)
    assert address in line and "requires a client certificate" in line, line
    assert "--tls-cert" in line, line
    assert took_s < TOLD_WITHIN_S, took_s


def test_a_missing_token_is_an_answer_of_the_store_naming_the_option(
    secure: Cluster, secrets: Secrets
) -> None:
    """The store was reached and refused the call: exit 1 (the store answered an error)."""
    address = secure.commitlog.target
    done, took_s = mqstore(
        "--commitlog", address, "--tls-ca", str(secrets.ca), "--tls-cert",
        str(secrets.client_cert), "--tls-key", str(secrets.client_key),
        "produce", "demo", "hello",
    )  # fmt: skip
    assert done.returncode == EXIT_ERROR, done.stderr
    line = one_error_line(done)
    assert "UNAUTHENTICATED" in line and address in line and "--token-file" in line, line
    assert took_s < TOLD_WITHIN_S, took_s  # not retried: the store's answer is final


def test_a_connect_timeout_that_is_not_seconds_is_a_bad_argument() -> None:
    done, _ = mqstore("--connect-timeout", "soon", "--commitlog", free_address(), "status")
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "--connect-timeout" in one_error_line(done)
