"""Audit job: the live consume queues and index compared with the commit log, on Spark.

    python -m mqstore.spark.jobs.audit DATA_DIR                    what `mqstore up` made
    python -m mqstore.spark.jobs.audit LOG_DIR [--cq CQ_DATA_DIR] [--index INDEX_DATA_DIR]
        [--units-per-file 300000] [--end-offset N] [--findings-max 1000] [--master URL]

Given the data dir of `mqstore up` (or any directory holding a store's parts), the log, the
consume queues and the index are found in it (mqstore/storage/layout.py), and both are audited
unless --cq or --index names one; each of LOG_DIR, --cq and --index may also be the part's
own directory. Exit status: 0 when nothing differs, 1 when any entry is missing, extra or
mismatched, 2 on bad arguments (a LOG_DIR that is no commit log, a --cq that is no cq_svc data
dir of the FILE store, an --index without an index checkpoint: a wrong path is never reported
as a damaged store), and as common.py says for the rest. One line per finding (up to
--findings-max), then a summary whose counts are exact: a queue or index file lists at most
1,000 findings of each kind, then one line saying how many more of that kind it has, and the
summary counts them all.

What the log says each file should hold is built as the rebuild job builds it (derived.py),
in memory, one consume queue or one index file per task, and compared with the files the
services wrote (read-only; a running service may be writing beside the audit):

    structure  finding     meaning
    cq         missing     a unit the log implies is not in the queue's files, or is invalid
                           there (zeroed, say: a pull finds no message and cq_svc's recovery
                           would end the queue there); the units after it are compared as they
                           are, so one damaged unit is one finding
    cq         extra       a valid unit at a queue offset the log does not fill
    cq         mismatched  the unit at that queue offset differs (offset, size, tags code), or
                           its time entry fails its check or holds another time
    index      missing     keys the log implies beyond what the file holds
    index      extra       entries beyond what the log implies, or a file too many
    index      mismatched  an entry (hash, offset, time, chain link), a slot, or the header
                           differs from the engine's bytes for the same keys

Scope: records below the end offset E (default: the end of the log when the audit starts); units
and entries pointing at or beyond E are ignored, since a running service may have applied them
after the log was read. The index geometry, exact mode and shard come from the live index's
checkpoint; the index is compared file by file, which assumes it was built from the log as it
is (a retention that deleted segments and index files makes the oldest differ).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from pyspark.sql import functions as sf

from mqstore.errors import InvalidArgument
from mqstore.formats import _core
from mqstore.formats import index_file as ifmt
from mqstore.formats.cq_time import TIME_BYTES
from mqstore.formats.cq_unit import BLANK_SIZE, UNIT_BYTES, UNIT_DTYPE
from mqstore.spark.jobs import derived
from mqstore.spark.jobs.common import (
    JobError,
    add_common_args,
    arrow_rows,
    log_dir_of,
    read_log,
    run_job,
    session_for_main,
    stop_session,
)
from mqstore.spark.jobs.progress import JobProgress
from mqstore.spark.jobs.rebuild import (
    build_file_of,
    index_keys_df,
    log_bounds,
    numbered_keys_df,
    queue_entries_df,
    queue_units_of,
)
from mqstore.storage.layout import store_parts
from mqstore.storage.logreader import list_segments
from mqstore.storage.mapped_file import file_name_to_offset, offset_to_file_name

FINDINGS_SCHEMA: Final = (
    "structure STRING, kind STRING, location STRING, detail STRING, findings LONG"
)
# Findings listed per kind in a queue or index file: a queue whose file was lost would
# otherwise list every unit; the rest are counted in one more line of that kind.
FINDINGS_PER_GROUP_MAX: Final = 1_000
FINDINGS_PRINTED_DEFAULT: Final = 1_000
KINDS: Final = ("missing", "extra", "mismatched")
# The row each queue or index file's check adds to its findings, so that the driver learns
# which groups the log implies from the check's own results, not from another pass over them.
CHECKED: Final = "checked"
# The log's columns the audit reads (log_bounds, queue_entries_df, index_keys_df): the cached
# copy of the log holds these, not the properties map, hosts and ids of every record.
LOG_COLUMNS: Final = (
    "commitLogOffset", "totalSize", "topic", "queueId", "queueOffset", "sysFlag", "tags", "keys",
    "uniqKey", "storeTimestampMs", "badReason",
)  # fmt: skip

EXIT_OK: Final = 0
EXIT_FOUND: Final = 1
EXIT_USAGE: Final = 2


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report: one finding, or (`findings` > 1) the count of those of its
    kind and location that were not listed one by one."""

    structure: str
    kind: str
    location: str
    detail: str
    findings: int = 1

    def line(self) -> str:
        return f"{self.structure} {self.kind} {self.location}: {self.detail}"


@dataclass(slots=True)
class AuditReport:
    end_offset: int = 0
    records: int = 0
    queues: int = 0
    index_files: int = 0
    findings: list[Finding] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """Every finding of `kind`, listed or not."""
        return sum(f.findings for f in self.findings if f.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.findings


class _Capped:
    """The findings of one queue or index file: listed up to FINDINGS_PER_GROUP_MAX per kind,
    every one counted."""

    def __init__(self, structure: str, location: str) -> None:
        self.structure = structure
        self.location = location
        self.rows: list[Finding] = []
        self.listed: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.unlisted: dict[str, int] = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, where: str, detail: str) -> None:
        if self.listed[kind] < FINDINGS_PER_GROUP_MAX:
            self.listed[kind] += 1
            self.rows.append(Finding(self.structure, kind, f"{self.location}{where}", detail))
        else:
            self.unlisted[kind] += 1

    def take(self, kind: str, picks: npt.NDArray[np.intp]) -> list[int]:
        """The first of `picks` (findings of `kind` to come, in order) that will be listed; the
        rest are counted here, not formatted one by one (a lost file: 300 k of them)."""
        room = max(0, FINDINGS_PER_GROUP_MAX - self.listed[kind])
        self.unlisted[kind] += max(0, len(picks) - room)
        listed: list[int] = picks[:room].tolist()
        return listed

    def findings(self) -> list[Finding]:
        out = list(self.rows)
        for kind, n in self.unlisted.items():
            if n:
                out.append(
                    Finding(self.structure, kind, self.location, f"{n} more {kind} not listed", n)
                )
        return out

    def table(self, checked: str = "") -> Any:
        """The findings as an Arrow table of FINDINGS_SCHEMA, then the CHECKED row of this
        group (`checked` its detail)."""
        done = Finding(self.structure, CHECKED, self.location, checked, 0)
        rows = [dataclasses.astuple(f) for f in [*self.findings(), done]]
        return arrow_rows(rows, FINDINGS_SCHEMA)


# ---------------------------------------------------------------------------------------------
# Consume queues


@dataclass(slots=True)
class QueueColumns:
    """A queue's units as columns, by queue offset (`offsets` ascending): unit fields, and the
    indexed time with `time_ok` False where the time entry fails its check or is missing."""

    offsets: npt.NDArray[np.int64]
    phy: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    tags: npt.NDArray[np.int64]
    time: npt.NDArray[np.int64]
    time_ok: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, parts: Sequence[tuple[npt.NDArray[Any], ...]]) -> QueueColumns:
        if not parts:
            empty = np.empty(0, dtype=np.int64)
            return cls(empty, empty, empty, empty, empty, np.empty(0, dtype=np.bool_))
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        return cls(*cols)


def live_queue_columns(
    cq_dir: str, topic: str, queue_id: int, units_per_file: int
) -> tuple[QueueColumns, npt.NDArray[np.int64]]:
    """Every unit a cq_svc data dir holds for a queue, as columns: the valid units (blanks
    included), and the queue offsets of the invalid ones (zeroed, say) that lie below a valid
    unit of their file: damage in the middle, where a pull finds no message and cq_svc's
    recovery would end the queue. Invalid units after a file's last valid one are its unwritten
    space. Each file is read whole, past an invalid unit too, so that one damaged unit is one
    finding, not the rest of its file."""
    udir = os.path.join(cq_dir, derived.CQ_UNITS_TREE, topic, str(queue_id))
    tdir = os.path.join(cq_dir, derived.CQ_TIMES_TREE, topic, str(queue_id))
    parts: list[tuple[npt.NDArray[Any], ...]] = []
    invalid: list[npt.NDArray[np.int64]] = []
    names = sorted(os.listdir(udir)) if os.path.isdir(udir) else []
    for name in names:
        byte_offset = file_name_to_offset(name)
        if byte_offset is None:
            continue
        first = byte_offset // UNIT_BYTES
        with open(os.path.join(udir, name), "rb") as f:
            raw = f.read()
        n = min(len(raw) // UNIT_BYTES, units_per_file)
        units = np.frombuffer(raw, dtype=UNIT_DTYPE, count=n)
        valid = (units["phy"] >= 0) & (units["size"] > 0)
        where = np.flatnonzero(valid)
        if not len(where):
            continue
        below = np.flatnonzero(~valid[: where[-1]])
        invalid.append(first + below.astype(np.int64))
        tpath = os.path.join(tdir, offset_to_file_name(first * TIME_BYTES))
        entries = b""
        if os.path.exists(tpath):
            with open(tpath, "rb") as f:
                entries = f.read(n * TIME_BYTES)
        has = len(entries) // TIME_BYTES
        stored = np.zeros(n, dtype=np.int64)
        ok = np.zeros(n, dtype=np.bool_)
        if has:
            words = np.frombuffer(entries, dtype=">u8", count=has)
            stored[:has] = (words >> np.uint64(16)).astype(np.int64)
            ok[:has] = np.frombuffer(_core.time_entries_ok(raw, entries), dtype=np.bool_)
        picked = units[where]
        parts.append(
            (
                first + where.astype(np.int64),
                picked["phy"].astype(np.int64),
                picked["size"].astype(np.int64),
                picked["tags"].astype(np.int64),
                stored[where],
                ok[where],
            )
        )
    gone = np.concatenate(invalid) if invalid else np.empty(0, dtype=np.int64)
    return QueueColumns.of(parts), gone


def expected_queue_columns(expected: derived.QueueUnits | None) -> QueueColumns:
    if expected is None or not len(expected.phy):
        return QueueColumns.of([])
    offsets = np.arange(expected.first_file_offset, expected.max_offset, dtype=np.int64)
    ok = np.ones(len(offsets), dtype=np.bool_)
    return QueueColumns(offsets, expected.phy, expected.size, expected.tags, expected.time, ok)


def audit_queue(
    cq_dir: str,
    topic: str,
    queue_id: int,
    expected: derived.QueueUnits | None,
    units_per_file: int,
    end_offset: int,
    out: _Capped,
) -> None:
    """The queue's files against the units the log implies, compared column by column; each
    difference is a finding (listed in queue-offset order, per kind)."""
    live, invalid = live_queue_columns(cq_dir, topic, queue_id, units_per_file)
    want = expected_queue_columns(expected)
    at = np.searchsorted(live.offsets, want.offsets)
    found = at < len(live.offsets)
    found[found] = live.offsets[at[found]] == want.offsets[found]
    for i in out.take("missing", np.flatnonzero(~found)):
        off = int(want.offsets[i])
        where = (
            "invalid in the files (zeroed?): a pull finds no message there"
            if off in invalid
            else "not in the files"
        )
        unit = (int(want.phy[i]), int(want.size[i]), int(want.tags[i]))
        out.add("missing", f"@{off}", f"unit {unit} {where}")
    mine, theirs = np.flatnonzero(found), at[found]
    unit_differs = (
        (live.phy[theirs] != want.phy[mine])
        | (live.size[theirs] != want.size[mine])
        | (live.tags[theirs] != want.tags[mine])
    )
    time_differs = ~live.time_ok[theirs] | (live.time[theirs] != want.time[mine])
    for k in out.take("mismatched", np.flatnonzero(unit_differs | time_differs)):
        i, j = int(mine[k]), int(theirs[k])
        off = int(want.offsets[i])
        wanted = (int(want.phy[i]), int(want.size[i]), int(want.tags[i]))
        got = (int(live.phy[j]), int(live.size[j]), int(live.tags[j]))
        if unit_differs[k]:
            out.add("mismatched", f"@{off}", f"unit {got}, the log says {wanted}")
        else:
            what = "fails its check" if not live.time_ok[j] else f"holds {int(live.time[j])}"
            out.add("mismatched", f"@{off}", f"time entry {what}, the log says {int(want.time[i])}")
    extra = ~np.isin(live.offsets, want.offsets)
    blank = (live.phy == 0) & (live.size == BLANK_SIZE)
    for j in out.take("extra", np.flatnonzero(extra & ((live.phy < end_offset) | blank))):
        unit = (int(live.phy[j]), int(live.size[j]), int(live.tags[j]))
        out.add("extra", f"@{int(live.offsets[j])}", f"unit {unit} the log does not imply")
    for off in out.take("extra", np.unique(invalid[~np.isin(invalid, want.offsets)])):
        out.add("extra", f"@{off}", "an invalid unit (zeroed?) where the log implies none")


# ---------------------------------------------------------------------------------------------
# Index


def audit_index_file(
    path: str | None,
    expected: derived.IndexImage | None,
    geometry: derived.IndexGeometry,
    end_offset: int,
    out: _Capped,
) -> None:
    s, n = geometry.slot_num, geometry.entry_num
    if path is None or not os.path.exists(path):
        if expected is not None:
            out.add("missing", "", f"file absent; the log implies {expected.header.entries} keys")
        return
    with open(path, "rb") as f:
        live = f.read()
    if len(live) != ifmt.file_bytes(s, n):
        out.add("mismatched", "", f"{len(live)} bytes, expected {ifmt.file_bytes(s, n)}")
        return
    header = ifmt.decode_header(live)
    count = min(max(header.index_count, 1), n)
    live_entries = np.frombuffer(live, dtype=ifmt.ENTRY_DTYPE, count=n, offset=ifmt.entries_pos(s))
    in_scope = 1 + int(np.count_nonzero(live_entries["phy"][1:count] < end_offset))
    if expected is None:
        if in_scope > 1:
            out.add("extra", "", f"{in_scope - 1} entries the log does not imply")
        return
    exp_entries = np.frombuffer(
        bytes(expected.data), dtype=ifmt.ENTRY_DTYPE, count=n, offset=ifmt.entries_pos(s)
    )
    exp_count = expected.header.index_count
    common = min(in_scope, exp_count)
    differs = np.flatnonzero(live_entries[1:common] != exp_entries[1:common]) + 1
    for number in out.take("mismatched", differs):
        out.add(
            "mismatched",
            f"#{number}",
            f"entry {tuple(live_entries[number].tolist())}, "
            f"the log says {tuple(exp_entries[number].tolist())}",
        )
    if exp_count > in_scope:
        first = exp_entries[in_scope]
        out.add(
            "missing",
            f"#{in_scope}",
            f"{exp_count - in_scope} entries from offset {int(first['phy'])} not in the file",
        )
    elif in_scope > exp_count:
        out.add("extra", f"#{exp_count}", f"{in_scope - exp_count} entries beyond the log's")
    if in_scope == count and exp_count == count:
        # The whole file is in scope: its slots and header must be the engine's too.
        slots_live = np.frombuffer(live, dtype=ifmt.SLOT_DTYPE, count=s, offset=ifmt.HEADER_BYTES)
        slots_exp = np.frombuffer(
            bytes(expected.data), dtype=ifmt.SLOT_DTYPE, count=s, offset=ifmt.HEADER_BYTES
        )
        for slot in out.take("mismatched", np.flatnonzero(slots_live != slots_exp)):
            out.add(
                "mismatched",
                f" slot {slot}",
                f"holds {int(slots_live[slot])}, the log says {int(slots_exp[slot])}",
            )
        if live[: ifmt.HEADER_BYTES] != bytes(expected.data[: ifmt.HEADER_BYTES]):
            out.add("mismatched", " header", f"{header}, the log says {expected.header}")


def live_index_files(index_data_dir: str) -> tuple[derived.IndexGeometry, list[str]]:
    """Geometry and file paths (oldest first) of a live index, from its checkpoint."""
    ckpt = derived.read_index_checkpoint(index_data_dir)
    if ckpt is None:
        raise InvalidArgument(f"{index_data_dir} holds no index checkpoint (index/checkpoint)")
    index_dir = os.path.join(index_data_dir, derived.INDEX_SUBDIR)
    paths = [os.path.join(index_dir, ifmt.name_of(rec.name_ms)) for rec in ckpt.files]
    first = ckpt.files[0] if ckpt.files else None
    geometry = derived.IndexGeometry(
        slot_num=first.slot_num if first else ifmt.DEFAULT_SLOT_NUM,
        entry_num=first.entry_num if first else ifmt.DEFAULT_ENTRY_NUM,
        exact=ckpt.exact,
        shard_count=ckpt.shard_count,
        shard_index=ckpt.shard_index,
    )
    return geometry, paths


# ---------------------------------------------------------------------------------------------
# The job


def audit(
    spark: Any,
    log_dir: str,
    *,
    cq_dir: str | None,
    index_dir: str | None,
    units_per_file: int = derived.UNITS_PER_FILE_DEFAULT,
    end_offset: int | None = None,
    split_bytes: int | None = None,
    progress: JobProgress | None = None,
) -> AuditReport:
    steps = 1 + (cq_dir is not None) + (index_dir is not None)
    progress = progress or JobProgress(spark, "audit", steps, show=False)
    log_df = read_log(spark, log_dir, include_body=False, split_bytes=split_bytes)
    # Read once: the bounds' pass fills the cache the checks read.
    cached = log_df.select(*LOG_COLUMNS).cache()
    report = AuditReport()
    try:
        with progress.step("reading the log"):
            records, _, log_end = log_bounds(cached, log_dir)
            end = log_end if end_offset is None else min(end_offset, log_end)
            report.end_offset = end
            scoped = cached.filter(sf.col("commitLogOffset") < end)
            report.records = records if end == log_end else scoped.count()
        if cq_dir is not None:
            with progress.step("checking consume queues"):
                _audit_cqs(scoped, os.path.abspath(cq_dir), units_per_file, end, report)
        if index_dir is not None:
            with progress.step("checking index files"):
                _audit_index(scoped, os.path.abspath(index_dir), end, report)
    finally:
        cached.unpersist()
    return report


def _audit_cqs(log_df: Any, cq_dir: str, upf: int, end: int, report: AuditReport) -> None:
    def check_group(key: tuple[Any, Any], table: Any) -> Any:
        topic, qid = str(key[0].as_py()), int(key[1].as_py())
        where = f"{topic}/{qid}"
        out = _Capped("cq", where)
        expected = queue_units_of(table, upf, where)
        audit_queue(cq_dir, topic, qid, expected, upf, end, out)
        return out.table()

    entries = queue_entries_df(log_df)
    rows = entries.groupBy("topic", "queueId").applyInArrow(check_group, FINDINGS_SCHEMA)
    found, checked = _split_checked(rows.collect())
    in_log = {location for location, _ in checked}
    report.queues = len(in_log)
    for topic, qid in derived.list_queues(cq_dir):
        if f"{topic}/{qid}" not in in_log:
            out = _Capped("cq", f"{topic}/{qid}")
            audit_queue(cq_dir, topic, qid, None, upf, end, out)
            found.extend(out.findings())
    report.findings.extend(sorted(found, key=lambda f: (f.location, f.kind)))


def _audit_index(log_df: Any, index_data_dir: str, end: int, report: AuditReport) -> None:
    geometry, paths = live_index_files(index_data_dir)

    def check_file(key: tuple[Any], table: Any) -> Any:
        file_no = int(key[0].as_py())
        path = paths[file_no] if file_no < len(paths) else None
        out = _Capped("index", os.path.basename(path) if path else f"file {file_no} (absent)")
        audit_index_file(path, build_file_of(table, geometry), geometry, end, out)
        return out.table(checked=str(file_no))

    numbered = numbered_keys_df(index_keys_df(log_df, geometry), geometry)
    rows = numbered.groupBy("fileNo").applyInArrow(check_file, FINDINGS_SCHEMA).collect()
    found, checked = _split_checked(rows)
    implied = len(checked)  # files are numbered 0, 1, ... in key order: none is skipped
    report.index_files = len(paths)
    for file_no in range(implied, len(paths)):
        out = _Capped("index", os.path.basename(paths[file_no]))
        audit_index_file(paths[file_no], None, geometry, end, out)
        found.extend(out.findings())
    report.findings.extend(sorted(found, key=lambda f: (f.location, f.kind)))


def _split_checked(rows: Sequence[Any]) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The findings among the rows of the checks, and (location, detail) of each CHECKED row."""
    found = [Finding(*r) for r in rows if r.kind != CHECKED]
    checked = [(r.location, r.detail) for r in rows if r.kind == CHECKED]
    return found, checked


# ---------------------------------------------------------------------------------------------
# Command line


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mqstore.spark.jobs.audit",
        description="Compare live consume queues and index files with the commit log.",
    )
    p.add_argument(
        "log_dir", help="the data dir `mqstore up` made, commitlog_svc's, or the segments' dir"
    )
    p.add_argument("--cq", default=None, help="cq_svc data dir to audit (FILE store)")
    p.add_argument("--index", default=None, help="index_svc data dir to audit")
    p.add_argument(
        "--units-per-file",
        type=int,
        default=derived.UNITS_PER_FILE_DEFAULT,
        help="cq_svc's units_per_file (default 300000)",
    )
    p.add_argument("--end-offset", type=int, default=None, help="audit records below this")
    p.add_argument("--findings-max", type=int, default=FINDINGS_PRINTED_DEFAULT)
    add_common_args(p)
    return p


def summary(report: AuditReport) -> str:
    counts = ", ".join(f"{report.count(k)} {k}" for k in KINDS)
    verdict = "ok" if report.ok else "DIFFERENCES"
    return (
        f"{verdict}: {report.records} records below offset {report.end_offset}, "
        f"{report.queues} queues, {report.index_files} index files: {counts}"
    )


def print_report(report: AuditReport, findings_max: int) -> None:
    for finding in report.findings[:findings_max]:
        print(finding.line())
    rest = report.findings[findings_max:]
    if rest:
        print(f"... {sum(f.findings for f in rest)} more findings not printed (--findings-max)")
    print(summary(report))


def check_paths(log_dir: str, cq_dir: str | None, index_dir: str | None) -> None:
    """InvalidArgument for a path that is not what its argument names (before any Spark)."""
    list_segments(log_dir)
    if cq_dir is not None:
        derived.check_cq_data_dir(cq_dir)
    if index_dir is not None:
        live_index_files(index_dir)


def resolve_paths(args: argparse.Namespace) -> tuple[str, str | None, str | None]:
    """(segment dir, cq_svc data dir, index_svc data dir) from what the user named: a store's
    data dir gives all three unless --cq or --index names one; each may be the part itself."""
    cq, index = args.cq, args.index
    if cq is None and index is None:
        found = store_parts(args.log_dir)
        cq, index = found.cq, found.index
        if cq is None and index is None:
            raise JobError(f"give --cq, --index or both ({args.log_dir} holds neither)")
    else:
        cq = None if cq is None else store_parts(cq).cq or cq
        index = None if index is None else store_parts(index).index or index
    log_dir = log_dir_of(args.log_dir)
    check_paths(log_dir, cq, index)
    return log_dir, cq, index


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_job("audit", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    log_dir, cq, index = resolve_paths(args)
    spark, owned = session_for_main("mqstore-audit", args)
    try:
        progress = JobProgress(spark, "audit", 1 + (cq is not None) + (index is not None))
        report = audit(
            spark,
            log_dir,
            cq_dir=cq,
            index_dir=index,
            units_per_file=args.units_per_file,
            end_offset=args.end_offset,
            split_bytes=args.split_bytes,
            progress=progress,
        )
    finally:
        stop_session(spark, owned)
    print_report(report, args.findings_max)
    return EXIT_OK if report.ok else EXIT_FOUND


if __name__ == "__main__":
    sys.exit(main())
