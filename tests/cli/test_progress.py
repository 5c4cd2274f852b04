"""Progress on stderr: a bar on a terminal, a plain line now and then in a log, and stdout left
to the messages either way."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys

from rich.console import Console

from mqstore.cli.progress import PROGRESS_CHECK_EVERY, Reporter
from tests.cli.test_client_commands import REPO, RUN_TIMEOUT_S, Store, store, topic

__all__ = ["store", "topic"]  # fixtures, used by name


def test_a_log_gets_a_plain_line_with_count_total_and_rate() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with Reporter("consumed", total=1000, unit="messages", console=console, line_every_s=0):
        pass
    assert out.getvalue() == ""  # nothing done: nothing to say
    with Reporter(
        "consumed", total=1000, unit="messages", console=console, line_every_s=0
    ) as progress:
        for _ in range(PROGRESS_CHECK_EVERY):
            progress.advance()
    line = out.getvalue().strip()
    assert line.startswith(f"consumed: {PROGRESS_CHECK_EVERY} of 1,000 messages (6%), "), line
    assert "messages/s" in line


def test_consume_count_on_a_terminal_draws_a_bar_and_keeps_stdout_for_messages(
    store: Store, topic: str
) -> None:
    store.ok("produce", topic, "--count", "300", "--size", "10")
    store.wait_dispatched(topic, 300)
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mqstore.cli", "consume", topic, "--count", "300", "--raw"],
            stdout=subprocess.PIPE,
            stderr=follower,
            env={**store.env, "TERM": "xterm", "COLUMNS": "120"},
            cwd=REPO,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 300  # every message on stdout, none on the bar's
    screen = drawn.decode(errors="replace")
    assert "consumed" in screen and "300/300" in screen and "100%" in screen, screen[-500:]
