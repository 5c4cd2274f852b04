"""`mqstore spark ...` and `mqstore.spark.session()` as a new user meets them: run with the
venv's programs by full path and no venv on PATH, on the data dir `mqstore up` made; a run ends
without a traceback, says what it is doing, binds to loopback, and fails in one line with the
documented exit code.

Two runs start a Spark JVM of their own (an audit job, and README's snippet as user_session.py),
each once for the module; the other tests fail before Spark starts, or use the shared session.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from click.testing import CliRunner
from rich.console import Console

from bench.spark_bench import write_log
from mqstore.cli import cli
from mqstore.spark.jobs import common, export
from mqstore.spark.jobs.progress import JobProgress
from mqstore.storage.layout import UP_COMMITLOG_DIR, UP_CQ_DIR, UP_INDEX_DIR, store_parts
from tests.spark.conftest import REPO_ROOT
from tests.spark.test_log_source import MESSAGES, LogStore, log_store

__all__ = ["log_store"]  # the fixture, shared with test_log_source.py

VENV_BIN: Final = os.path.dirname(sys.executable)
# PATH as a shell has it with no venv activated: `python3` there lacks pyspark and numpy.
BARE_PATH: Final = "/usr/bin:/bin"
# A Spark JVM of its own takes 10-20 s on an idle 2-core machine; minutes under load.
SPARK_RUN_TIMEOUT_S: Final = 540
# Fails before Spark: the Python interpreter's start and the check only.
NO_SPARK_TIMEOUT_S: Final = 60
# Enough rows that a task still writes batches when show() has its 3 (the JVM then closes the
# worker's socket): several 10,000-row batches of 1 KiB bodies.
SHOW_LOG_MESSAGES: Final = 30_000
SHOW_BODY_BYTES: Final = 1024
LOOPBACK_HEX: Final = (
    "0100007F",
    "0000000000000000FFFF00000100007F",
    "00000000000000000000000001000000",
)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str
    seconds: float


def user_env() -> dict[str, str]:
    """A user's environment: no venv, no PYSPARK_* or SPARK_LOCAL_IP (the session fixture of
    this process set them), this worktree's code first (PYTHONPATH, as for every subprocess)."""
    env = {"PATH": BARE_PATH, "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": REPO_ROOT}
    for name in ("JAVA_HOME", "TMPDIR", "LANG"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def run(argv: list[str], cwd: Path, timeout_s: float) -> Run:
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def mqstore(*args: str, cwd: Path, timeout_s: float = NO_SPARK_TIMEOUT_S) -> Run:
    return run([os.path.join(VENV_BIN, "mqstore"), *args], cwd, timeout_s)


def up_layout(store: LogStore, data: Path) -> Path:
    """The test store's parts copied where `mqstore up --data-dir DATA` keeps them."""
    shutil.copytree(store.log_dir, data / UP_COMMITLOG_DIR)
    shutil.copytree(store.cq_dir, data / UP_CQ_DIR)
    shutil.copytree(store.index_dir, data / UP_INDEX_DIR)
    return data


_RUNS: dict[str, Any] = {}


@pytest.fixture
def audit_run(log_store: LogStore, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """`mqstore spark audit data` in the directory above `data`, once for the module."""
    if "audit" not in _RUNS:
        work = tmp_path_factory.mktemp("user")
        up_layout(log_store, work / "data")
        _RUNS["audit"] = mqstore("spark", "audit", "data", cwd=work, timeout_s=SPARK_RUN_TIMEOUT_S)
    result: Run = _RUNS["audit"]
    return result


@pytest.fixture
def session_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, Any]]:
    """README's snippet (user_session.py) over an up data dir's log, once for the module."""
    if "session" not in _RUNS:
        pytest.importorskip("pyspark")
        work = tmp_path_factory.mktemp("snippet")
        segments = work / "data" / UP_COMMITLOG_DIR / "commitlog"
        write_log(str(segments), SHOW_LOG_MESSAGES, SHOW_BODY_BYTES)
        script = str(Path(__file__).with_name("user_session.py"))
        result = run([sys.executable, script, "data"], work, SPARK_RUN_TIMEOUT_S)
        last = result.out.strip().splitlines()[-1] if result.out.strip() else "{}"
        _RUNS["session"] = (result, json.loads(last) if last.startswith("{") else {})
    found: tuple[Run, dict[str, Any]] = _RUNS["session"]
    return found


# -- a job run ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_a_job_runs_from_the_venv_by_full_path_with_no_venv_on_path(audit_run: Run) -> None:
    """Before: the Python workers ran `python3` from PATH: "No module named 'numpy'"."""
    assert audit_run.code == 0, audit_run.err[-3000:]
    assert "No module named" not in audit_run.err


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_audit_finds_the_parts_of_the_data_dir_mqstore_up_made(audit_run: Run) -> None:
    """`audit data`: the log, the queues and the index of data/commitlog_svc, data/cq_svc,
    data/index_svc (before: `--cq data/cq` named nothing and every unit was missing)."""
    summary = audit_run.out.strip().splitlines()[-1]
    assert summary.startswith(f"ok: {MESSAGES} records"), audit_run.out
    assert "12 queues" in summary and "0 missing, 0 extra, 0 mismatched" in summary


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_a_job_ends_without_a_traceback(audit_run: Run) -> None:
    assert "Traceback" not in audit_run.err, audit_run.err[-3000:]
    assert "BrokenPipeError" not in audit_run.err
    assert "Exception" not in audit_run.err


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_a_job_says_what_it_does_in_lines_when_stderr_is_not_a_terminal(audit_run: Run) -> None:
    """Before: minutes of silence (Spark's console bar is off)."""
    lines = audit_run.err.splitlines()
    steps = ("[1/3] reading the log", "[2/3] checking consume queues", "[3/3] checking index")
    for step in steps:
        assert f"mqstore audit {step}" in audit_run.err
        assert any(
            line.startswith(f"mqstore audit {step}") and ": done, " in line for line in lines
        )


# -- README's snippet: mqstore.spark.session() ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_the_readme_session_works_without_the_venv_and_show_ends_cleanly(
    session_run: tuple[Run, dict[str, Any]],
) -> None:
    """Before: "No module named 'mqstore'" (or numpy) from the workers, and after show() a
    BrokenPipeError traceback per task the JVM stopped reading."""
    result, _ = session_run
    assert result.code == 0, result.err[-3000:]
    assert "only showing top 3 rows" in result.out
    assert "Traceback" not in result.err and "BrokenPipeError" not in result.err, result.err[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(SPARK_RUN_TIMEOUT_S + 60)
def test_a_local_session_listens_on_loopback_only_and_has_no_ui(
    session_run: tuple[Run, dict[str, Any]],
) -> None:
    """Before: the driver and block manager listened on the machine's address, the UI on 4040."""
    result, found = session_run
    assert found, result.out[-2000:] + result.err[-2000:]
    conf = found["conf"]
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.ui.enabled"] == "false"
    listening = found["listening"]
    assert listening, "the JVM listens on nothing?"
    assert all(addr.split(":")[0] in LOOPBACK_HEX for addr in listening), listening


# -- failures: one line, the documented exit code ------------------------------------------------


def test_export_into_a_folder_that_is_not_empty_is_refused_before_reading(
    tmp_path: Path,
) -> None:
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "old.parquet").write_bytes(b"x")
    (tmp_path / "data" / UP_COMMITLOG_DIR / "commitlog").mkdir(parents=True)
    write_log(str(tmp_path / "data" / UP_COMMITLOG_DIR / "commitlog"), 10, 10)
    result = mqstore("spark", "export", "lake", "--log", "data", cwd=tmp_path)
    assert result.code == 2, result.err
    assert result.err.strip().splitlines() == [result.err.strip()], result.err
    assert str(tmp_path / "lake") in result.err or "lake" in result.err
    assert "--write-mode overwrite" in result.err
    assert "Spark" not in result.err  # refused before any session started


def test_a_path_without_a_store_is_a_bad_argument_in_one_line(tmp_path: Path) -> None:
    for args in (
        ["export", "lake", "--log", "nowhere"],
        ["rebuild", "nowhere", "--cq-out", "cq"],
        ["audit", str(tmp_path)],
    ):
        result = mqstore("spark", *args, cwd=tmp_path)
        assert result.code == 2, (args, result.err)
        assert len(result.err.strip().splitlines()) == 1, result.err
        assert result.err.startswith("error: "), result.err


def test_a_bad_record_fails_the_job_in_one_line_with_exit_1(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    """FAILFAST on a damaged log: the error raised in a Spark task, told in one line."""
    data = tmp_path / "data"
    shutil.copytree(log_store.log_dir, data / UP_COMMITLOG_DIR)
    segment = sorted((data / UP_COMMITLOG_DIR / "commitlog").iterdir())[0]
    with open(segment, "r+b") as f:
        f.seek(300)  # inside the first record's body: its CRC fails
        byte = f.read(1)
        f.seek(300)
        f.write(bytes([byte[0] ^ 0xFF]))
    result = CliRunner().invoke(
        cli, ["spark", "export", str(tmp_path / "lake"), "--log", str(data)]
    )
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert "export" in errors[0] and "Traceback" not in result.output
    assert "offset" in errors[0], errors[0]


def test_an_unreachable_store_is_exit_3_in_one_line(spark: Any, tmp_path: Path) -> None:
    """export --topic with nothing listening on the given addresses."""
    result = CliRunner().invoke(
        cli,
        ["spark", "export", str(tmp_path / "lake"), "--topic", "orders",
         "--option", "commitlog=127.0.0.1:9", "--option", "cq=127.0.0.1:9",
         "--option", "timeoutS=2"],
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    assert "UNAVAILABLE" in errors[0] or "127.0.0.1:9" in errors[0], errors[0]


def test_errors_spark_wraps_are_told_by_their_python_class() -> None:
    text = (
        "An error occurred while calling o81.count.\n: org.apache.spark.SparkException: Job "
        "aborted\norg.apache.spark.api.python.PythonException: Traceback (most recent call "
        'last):\n  File "x.py", line 1, in read\nmqstore.storage.logreader.LogDirError: '
        "no segment files in /x\n\tat org.apache.spark.api.python.BasePythonRunner"
    )
    assert common.describe_error(RuntimeError(text)) == (2, "no segment files in /x")
    unreachable = "mqstore.client.errors.Unavailable: CommitLog/Append: UNAVAILABLE: refused"
    assert common.describe_error(RuntimeError(unreachable))[0] == 3
    other = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'numpy'"
    assert common.describe_error(RuntimeError(other)) == (
        1,
        "ModuleNotFoundError: No module named 'numpy'",
    )


# -- the data dir `mqstore up` made --------------------------------------------------------------


def test_store_parts_finds_every_part_from_the_up_data_dir(
    log_store: LogStore, tmp_path: Path
) -> None:
    data = up_layout(log_store, tmp_path / "data")
    parts = store_parts(str(data))
    assert parts.commitlog == str(data / UP_COMMITLOG_DIR / "commitlog")
    assert parts.cq == str(data / UP_CQ_DIR)
    assert parts.index == str(data / UP_INDEX_DIR)
    # Each part's own directory finds that part.
    assert store_parts(str(data / UP_COMMITLOG_DIR)).commitlog == parts.commitlog
    assert store_parts(parts.commitlog).commitlog == parts.commitlog
    assert store_parts(str(data / UP_CQ_DIR)).cq == parts.cq
    assert store_parts(str(data / UP_INDEX_DIR)).index == parts.index
    # Replicas (`mqstore up --replicas 3`): the commit log is the caller's choice.
    for i in range(3):
        shutil.copytree(log_store.log_dir, tmp_path / "r" / f"{UP_COMMITLOG_DIR}-{i}")
    replicas = store_parts(str(tmp_path / "r"))
    assert replicas.commitlog is None and len(replicas.commitlog_replicas) == 3


def test_the_log_source_reads_the_up_data_dir(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    """Before: load("data/commitlog") named nothing, load("data") found no segments."""
    data = up_layout(log_store, tmp_path / "data")
    for path in (data, data / UP_COMMITLOG_DIR, data / UP_COMMITLOG_DIR / "commitlog"):
        assert spark.read.format("mqstore-log").load(str(path)).count() == MESSAGES


# -- job descriptions ----------------------------------------------------------------------------


def test_each_step_names_its_spark_jobs(spark: Any) -> None:
    """Before: every job was "count at NativeMethodAccessorImpl.java:0" in Spark's UI."""
    sc = spark.sparkContext
    steps = JobProgress(spark, "ux-test", 2, show=False)
    with steps.step("counting a range"):
        assert sc.getLocalProperty("spark.job.description") == "mqstore ux-test: counting a range"
        spark.range(100).count()
    with steps.step("summing it"):
        spark.range(100).groupBy().sum().collect()
    assert sc.getLocalProperty("spark.job.description") is None  # not left on the thread
    tracker = sc.statusTracker()
    assert tracker.getJobIdsForGroup("mqstore-ux-test-1")
    assert tracker.getJobIdsForGroup("mqstore-ux-test-2")


def test_job_functions_name_their_steps_too(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    export.export(spark, str(tmp_path / "lake"), log_dir=str(log_store.log_dir))
    tracker = spark.sparkContext.statusTracker()
    assert tracker.getJobIdsForGroup("mqstore-export-1")  # reading the log, writing Parquet


def test_on_a_terminal_a_step_is_a_progress_bar_with_rate_and_time_left(spark: Any) -> None:
    out = io.StringIO()
    steps = JobProgress(spark, "ux-bar", 1, stream=out)
    steps.console = Console(file=out, force_terminal=True, width=160)
    with steps.step("counting"):
        spark.range(1000, numPartitions=4).count()
    shown = out.getvalue()
    assert "mqstore ux-bar [1/1] counting" in shown
    # Every task of the step counted (4 for the range; adaptive execution may add stages, and
    # a session that ran other jobs before plans this one in more tasks): done/total, equal.
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    done = re.findall(r"(\d+)/(\d+) ", plain)
    assert done and done[-1][0] == done[-1][1] and int(done[-1][1]) >= 4, plain
    assert "tasks/s" in plain
