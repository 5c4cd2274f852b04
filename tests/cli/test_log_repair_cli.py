"""`mqstore log repair`, as a user runs it (a subprocess of `python -m mqstore.cli`): what it
says and its exit codes. The repair itself is tested on the engine
(commitlog/test_commitlog_corruption.py) and through a real commitlog_svc start
(commitlog_svc/test_svc_process.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from tests.commitlog.message_in import MessageIn, as_batches

FILE_BYTES = 4096  # CommitLogConfig.for_tests


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "log", "repair", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def store(data: Path) -> CommitLog:
    """An open store of several segments."""
    log = CommitLog(CommitLogConfig.for_tests(str(data)))
    log.open()
    for i in range(60):
        log.append_batch(
            as_batches([MessageIn(topic="T", queue_id=0, body=bytes([65 + i % 26]) * 100)])
        )
    assert log.max_offset > 2 * FILE_BYTES
    return log


def test_a_sound_log_needs_no_repair_and_a_short_newest_segment_none_either(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    store(data).close()
    done = run(data)
    assert done.returncode == 0 and "nothing to repair" in done.stdout
    newest = sorted(os.listdir(data / "commitlog"))[-1]
    os.truncate(data / "commitlog" / newest, 100)  # commitlog_svc mends that itself
    done = run(data / "commitlog", "--yes")
    assert done.returncode == 0 and "nothing to repair" in done.stdout
    assert os.path.getsize(data / "commitlog" / newest) == 100


def test_a_directory_that_is_no_commit_log_is_a_usage_error(tmp_path: Path) -> None:
    done = run(tmp_path)
    assert done.returncode == 2
    assert "neither segment files nor a commitlog/ directory" in done.stderr


def test_a_running_store_is_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = store(data)
    try:
        before = sorted(os.listdir(data / "commitlog"))
        done = run(data, "--yes")
        assert done.returncode == 2
        assert "stop commitlog_svc" in done.stderr
        assert sorted(os.listdir(data / "commitlog")) == before
    finally:
        log.close()
