"""What every job shares: its SparkSession and reading the log.

A job runs three ways, with the same code:

    python -m mqstore.spark.jobs.export ...            local[*] on this machine
    mqstore spark export ...                           the same, from the CLI
    spark-submit --master ... mqstore/spark/jobs/export.py ...   a cluster (deploy/spark/)

Under spark-submit the master and every setting come from spark-submit; run any other way, the
session is `local[*]` unless `--master` says otherwise, on loopback, its Python workers this
interpreter, no UI unless `--ui-port` (mqstore/spark/sessions.py); `--conf NAME=VALUE` sets
anything else. Files are read and written by executors:
on a cluster, the commit-log directory and the output directories must be on storage every
executor mounts at the same path (a shared volume, NFS), as deploy/spark/README.md describes.
A store's files are named by the data dir `mqstore up` made, a service's data dir or the part's
own directory (mqstore/storage/layout.py).

`run_job` runs a job's body and turns what it lets out into one line on stderr and an exit
code, the `mqstore` command's (mqstore/cli/options.py):

    0  success
    1  the job failed (a bad record under FAILFAST, a store error), or audit found differences
    2  bad arguments: a path that is not what it should be, an output folder that is not
       empty, a bad option value
    3  a service could not be reached (export --topic)
    130 interrupted (Ctrl-C)

Spark's own log is off (`--spark-log-level WARN` brings it back): an error is that one line,
not the 80 lines of Java and Python stack Spark would log for it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from mqstore import errors as domain
from mqstore.cli.options import EXIT_ERROR, EXIT_USAGE, exit_code_for_status
from mqstore.client.errors import ClientError
from mqstore.spark import sessions
from mqstore.spark.log_source import SOURCE_NAME, SPLIT_BYTES_DEFAULT, SPLIT_BYTES_MIN
from mqstore.storage.layout import store_parts
from mqstore.storage.logreader import LogDir

# Spark's default of 200 shuffle partitions is for clusters; a local run of a job over one log
# has far fewer groups (queues, index files) than that.
LOCAL_SHUFFLE_PARTITIONS: Final = "8"
# Local runs show their own progress (progress.py), not Spark's console bar.
LOCAL_DEFAULTS: Final = {
    "spark.sql.shuffle.partitions": LOCAL_SHUFFLE_PARTITIONS,
    "spark.ui.showConsoleProgress": "false",
}
SPARK_LOG_LEVELS: Final = ("OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG")
EXIT_INTERRUPTED: Final = 130
# Spark error conditions that are the caller's mistake (a path), not the job's failure.
_USAGE_CONDITIONS: Final = frozenset({"PATH_ALREADY_EXISTS", "PATH_NOT_FOUND"})
# An exception's line inside Spark's error text, "package.Class: message": the last line of a
# Python traceback (mqstore.errors.CorruptRecord: ..., ModuleNotFoundError: ...), or Java's.
_ERROR_LINE: Final = re.compile(
    r"^(?P<cls>(?:[A-Za-z_]\w*\.)*[A-Z]\w*): (?P<msg>.*)$", re.MULTILINE
)


# pyarrow ships no type information; imported this way it is Any whatever mypy's settings.
pa: Any = importlib.import_module("pyarrow")


class JobError(Exception):
    """A job stops with this line and exit code (usage errors found before Spark starts)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def session(app_name: str, master: str | None = None) -> Any:
    """A job's SparkSession (sessions.session with the jobs' local defaults)."""
    return sessions.session(app_name, master=master, local_defaults=LOCAL_DEFAULTS)


def session_for_main(app_name: str, args: argparse.Namespace) -> tuple[Any, bool]:
    """The session of a job's main(), and whether main() owns it (and must stop it): a job run
    from a program that already has a session (a notebook, the tests) uses that one."""
    owned = SparkSession.getActiveSession() is None
    spark = sessions.session(
        app_name,
        master=args.master,
        ui_port=args.ui_port,
        conf=parse_pairs("--conf", args.conf),
        local_defaults=LOCAL_DEFAULTS,
    )
    if owned:
        spark.sparkContext.setLogLevel(args.spark_log_level)
    return spark, owned


def stop_session(spark: Any, owned: bool) -> None:
    if owned:
        sessions.stop(spark)


def run_job(name: str, body: Callable[[], int]) -> int:
    """`body()`'s exit code; an error it lets out printed as one line, `error: ...`."""
    try:
        return body()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        code, line = describe_error(err)
        print(f"error: {name}: {line}", file=sys.stderr)
        return code


def describe_error(err: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an error a job let out: ours, or Spark's wrapping
    of one raised in a task or a data source (found by its class name in Spark's text)."""
    if isinstance(err, JobError):
        return err.exit_code, str(err)
    if isinstance(err, domain.MqstoreError):
        return _code_of(type(err)), _one_line(str(err))
    text = str(err)
    found = list(_ERROR_LINE.finditer(text))
    ours = [m for m in found if m["cls"].startswith("mqstore.")]
    python = [m for m in found if "." not in m["cls"]]  # a builtin: ValueError, OSError
    candidates = ours or python or found
    match = candidates[-1] if candidates else None
    if match is not None:
        cls = _class_named(match["cls"])
        message = match["msg"].split(" SQLSTATE:")[0].strip()
        if cls is not None and issubclass(cls, domain.MqstoreError):
            return _code_of(cls), _one_line(message)
        return EXIT_ERROR, _one_line(f"{match['cls'].rsplit('.', 1)[-1]}: {message}")
    condition = getattr(err, "getCondition", lambda: None)()
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return (EXIT_USAGE if condition in _USAGE_CONDITIONS else EXIT_ERROR), _one_line(first)


def _code_of(cls: type[domain.MqstoreError]) -> int:
    if issubclass(cls, ClientError):
        return exit_code_for_status(cls.status.name)
    if issubclass(cls, domain.InvalidArgument):
        return EXIT_USAGE  # raised here, not answered by a service: the job's arguments
    return exit_code_for_status(cls.grpc_code)


def _class_named(dotted: str) -> type | None:
    module, _, name = dotted.rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def _one_line(text: str) -> str:
    return " ".join(text.split())


# The Spark types of the jobs' grouped-map results, as Arrow types (applyInArrow's results).
_ARROW_TYPES: Final = {"STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(),
                       "LONG": pa.int64()}  # fmt: skip


def arrow_rows(rows: Sequence[Sequence[Any]], ddl: str) -> pa.Table:
    """`rows` as the Arrow table of a grouped-map result whose schema is `ddl` ("name TYPE,
    ..." of the types in _ARROW_TYPES)."""
    fields = [field.split() for field in ddl.split(",")]
    schema = pa.schema([(name, _ARROW_TYPES[kind.upper()]) for name, kind in fields])
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(fields)
    return pa.table([list(c) for c in columns], schema=schema)


def log_dir_of(path: str) -> str:
    """The segment directory for `path` (a data dir, commitlog_svc's, or the segments')."""
    return store_parts(path).require_commitlog(path)


def require_empty_output(path: str, how: str) -> bool:
    """JobError unless `path` is absent or an empty folder, refused before any record is read;
    False when it is not on this machine (hdfs://, s3a://: Spark's own check decides then)."""
    parsed = urlparse(path)
    if parsed.scheme not in ("", "file"):
        return False
    local = parsed.path if parsed.scheme else path
    if not os.path.exists(local):
        return True
    if not os.path.isdir(local):
        raise JobError(f"{local} is a file, not a folder: {how}")
    if os.listdir(local):
        raise JobError(f"{local} exists and is not empty: {how}")
    return True


def read_log(
    spark: Any,
    log_dir: str,
    *,
    mode: str = "FAILFAST",
    include_body: bool = True,
    split_bytes: int | None = None,
    topics: str | None = None,
) -> Any:
    reader = spark.read.format(SOURCE_NAME).option("mode", mode)
    reader = reader.option("includeBody", "true" if include_body else "false")
    if split_bytes is None:
        split_bytes = split_bytes_for(spark, log_dir)
    reader = reader.option("splitBytes", str(split_bytes))
    if topics:
        reader = reader.option("topics", topics)
    return reader.load(os.path.abspath(log_dir))


def split_bytes_for(spark: Any, log_dir: str) -> int:
    """A job's task size: the source's default (64 MiB), or less when the log's files are
    fewer bytes than that for every core, so that each core gets a range to read. (A 52 MiB
    log was one task on local[2]: one core idle through the whole job.)"""
    log = LogDir(log_dir_of(log_dir))
    cores = max(1, int(spark.sparkContext.defaultParallelism))
    per_core = -(-(log.end_offset - log.min_offset) // cores)
    return max(SPLIT_BYTES_MIN, min(SPLIT_BYTES_DEFAULT, per_core))


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--split-bytes",
        type=int,
        default=None,
        help="largest byte range of the log read by one task (default 64 MiB, or less "
        "when the log is smaller than that for each core)",
    )
    parser.add_argument(
        "--ui-port",
        type=int,
        default=None,
        help="local mode: serve Spark's UI on 127.0.0.1:PORT (0: any free port; default: no UI)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Spark setting, repeatable (e.g. spark.driver.bindAddress=0.0.0.0)",
    )
    parser.add_argument(
        "--spark-log-level",
        default="OFF",
        choices=SPARK_LOG_LEVELS,
        help="Spark's own log on stderr (default OFF: errors are one line of this job's)",
    )


def parse_pairs(flag: str, pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise JobError(f"{flag} wants NAME=VALUE, not {pair!r}")
        out[name] = value
    return out


def now_ms() -> int:
    return time.time_ns() // 1_000_000
