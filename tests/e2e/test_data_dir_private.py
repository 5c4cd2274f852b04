"""A store's data directory is private: real `mqstore up` processes (and the three services it
starts) make every directory 0700 and every file 0600 under DATA_DIR, with and without
--secure, whatever the umask of the shell that started them (docs/security.md). Before: files
0644 under 0755 directories, readable by any local user."""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from .support import eventually, start_up

pytestmark = pytest.mark.timeout(240)

# The umask of a usual shell: it would make 0644 files and 0755 directories.
SHELL_UMASK = 0o022
TOPIC = "private-files"


def _up(data: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    return start_up(data, *flags, umask=SHELL_UMASK)


def _client_env(text: str) -> dict[str, str]:
    """What `mqstore up` printed a client needs: the export lines, or the plaintext targets."""
    env = {name: shlex.split(value)[0] for name, value in re.findall(r"export (\w+)=(.+)", text)}
    if not env:
        targets = dict(re.findall(r"^\s+(\w+)_svc\s+api (\S+)", text, re.M))
        env = {f"MQSTORE_{k.upper()}": v for k, v in targets.items()}
        env["MQSTORE_COMMITLOG"] = targets["commitlog"]
    return {**os.environ, **env}


def _mqstore(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        umask=SHELL_UMASK,
    )


def _loose(data: Path) -> list[str]:
    """Every entry under `data` (itself included) whose mode is not 0700 (directories) or
    0600 (files)."""
    found = []
    for root, dirs, files in os.walk(data):
        for name in [".", *dirs, *files]:
            path = os.path.normpath(os.path.join(root, name))
            st = os.lstat(path)
            want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
            if stat.S_ISLNK(st.st_mode):
                continue
            if stat.S_IMODE(st.st_mode) != want:
                found.append(f"{oct(stat.S_IMODE(st.st_mode))} {os.path.relpath(path, data)}")
    return sorted(set(found))


@pytest.mark.parametrize("flags", [("--secure",), ()], ids=["secure", "plaintext"])
def test_every_file_the_store_makes_is_private(tmp_path: Path, flags: tuple[str, ...]) -> None:
    data = tmp_path / "data"
    # An older store's leftovers: a loose directory and file, tightened at the start.
    old = data / "cq_svc" / "left-by-an-older-version"
    old.mkdir(parents=True, mode=0o755)
    (old / "notes").write_text("x")
    os.chmod(old / "notes", 0o644)
    os.chmod(data, 0o755)
    os.chmod(data / "cq_svc", 0o755)

    proc, text = _up(data, *flags)
    try:
        assert "Ctrl-C stops" in text, text
        env = _client_env(text)
        sent = _mqstore(env, "produce", TOPIC, "one", "two", "three", "--key", "k-1")
        assert sent.returncode == 0, sent.stdout + sent.stderr
        # The index has the key (its files exist), and a group commits its offsets.
        eventually(
            lambda: _mqstore(env, "query", "key", TOPIC, "k-1").stdout.count("k-1") >= 3,
            timeout_s=60,
            step_s=0.5,
        )
        read = _mqstore(env, "consume", TOPIC, "--group", "g-1", "--commit")
        assert read.returncode == 0 and "three" in read.stdout, read.stdout + read.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, text + out

    made = {os.path.relpath(os.path.join(r, n), data) for r, _, ns in os.walk(data) for n in ns}
    # What the check covers, at least: segments, checkpoints, queue and index files, logs.
    for expected in (
        r"commitlog_svc/commitlog/\d{20}",
        r"commitlog_svc/checkpoint",
        r"cq_svc/consumequeue/private-files/\d+/\d{20}",
        r"cq_svc/cq_checkpoint",
        r"index_svc/index/\d{17}",
        r"logs/commitlog_svc\.log",
        r"logs/index_svc\.log",
    ):
        assert any(re.fullmatch(expected, m) for m in made), (expected, sorted(made))
    if flags:
        assert {"secrets/ca.pem", "secrets/server.key", "secrets/admin.token"} <= made
    assert _loose(data) == []
