"""The rebuild job writes what cq_svc and index_svc wrote for the same log, byte for byte; the
audit job finds nothing on the services' files and finds faults injected into copies of them.

Ignored in the byte comparison, because they hold wall-clock times: index file names (the
service names a file by the clock at its creation, the rebuild by its first key's store time;
files are paired in order), and in both checkpoints `written_at_ms` and each index file
record's `name_ms` (the checkpoints are compared field by field with those two left out).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from mqstore.cli import cli
from mqstore.formats import cq_checkpoint, index_checkpoint
from mqstore.formats import index_file as ifmt
from mqstore.spark.jobs import audit, derived, rebuild
from mqstore.storage.mapped_file import offset_to_file_name
from tests.e2e.support import data_files
from tests.spark.test_log_source import ENTRY_NUM, SLOT_NUM, UNITS_PER_FILE, LogStore, log_store

__all__ = ["log_store"]  # the fixture, shared with test_log_source.py

GEOMETRY = derived.IndexGeometry(slot_num=SLOT_NUM, entry_num=ENTRY_NUM)
_REBUILT: dict[str, Path] = {}


@pytest.fixture
def rebuilt(spark: Any, log_store: LogStore, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "out" not in _REBUILT:
        out = tmp_path_factory.mktemp("rebuilt")
        report = rebuild.rebuild(
            spark,
            str(log_store.log_dir),
            cq_out=str(out / "cq"),
            index_out=str(out / "index"),
            units_per_file=UNITS_PER_FILE,
            geometry=GEOMETRY,
            split_bytes=8192,
        )
        assert report.records == 600
        _REBUILT["out"] = out
    return _REBUILT["out"]


def _trees(root: Path, *trees: str) -> dict[str, bytes]:
    out = {}
    for tree in trees:
        for rel, data in data_files(str(root / tree)).items():
            out[f"{tree}/{rel}"] = data
    return out


def test_rebuilt_consume_queues_are_byte_identical(log_store: LogStore, rebuilt: Path) -> None:
    trees = (derived.CQ_UNITS_TREE, derived.CQ_TIMES_TREE)
    live = _trees(log_store.cq_dir, *trees)
    ours = _trees(rebuilt / "cq", *trees)
    assert len(live) > 12  # 3 topics x 4 queues, some past one 50-unit file
    assert sorted(ours) == sorted(live)
    for name in live:
        assert ours[name] == live[name], name
    live_ck = cq_checkpoint.decode((log_store.cq_dir / "cq_checkpoint").read_bytes())
    our_ck = cq_checkpoint.decode((rebuilt / "cq" / "cq_checkpoint").read_bytes())
    assert dataclasses.replace(our_ck, written_at_ms=0) == dataclasses.replace(
        live_ck, written_at_ms=0
    )


def _index_files(index_data_dir: Path) -> list[Path]:
    d = index_data_dir / "index"
    return sorted(d / n for n in os.listdir(d) if ifmt.NAME_PATTERN.match(n))


def test_rebuilt_index_files_are_byte_identical(log_store: LogStore, rebuilt: Path) -> None:
    live = _index_files(log_store.index_dir)
    ours = _index_files(rebuilt / "index")
    assert len(live) >= 3  # ~1,200 keys in files of 399: rollover happened
    assert len(ours) == len(live)
    for ours_file, live_file in zip(ours, live, strict=True):
        assert ours_file.read_bytes() == live_file.read_bytes(), live_file.name
    live_ck = derived.read_index_checkpoint(str(log_store.index_dir))
    our_ck = derived.read_index_checkpoint(str(rebuilt / "index"))
    assert live_ck is not None and our_ck is not None

    def wall_clock_free(ck: index_checkpoint.IndexCheckpoint) -> Any:
        files = [dataclasses.replace(f, name_ms=0) for f in ck.files]
        return dataclasses.replace(ck, written_at_ms=0, files=files)

    assert wall_clock_free(our_ck) == wall_clock_free(live_ck)


def test_audit_of_the_services_files_finds_nothing(spark: Any, log_store: LogStore) -> None:
    report = audit.audit(
        spark,
        str(log_store.log_dir),
        cq_dir=str(log_store.cq_dir),
        index_dir=str(log_store.index_dir),
        units_per_file=UNITS_PER_FILE,
    )
    assert report.ok, [f.line() for f in report.findings]
    assert report.queues == 12
    assert report.index_files >= 3


def _poke(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def test_audit_finds_injected_faults_and_exits_non_zero(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    cq = tmp_path / "cq"
    index = tmp_path / "index"
    shutil.copytree(log_store.cq_dir, cq)
    shutil.copytree(log_store.index_dir, index)
    # cq: unit 3 of orders/0 points elsewhere; the first file of refunds/1 is gone.
    _poke(
        cq / "consumequeue" / "orders" / "0" / offset_to_file_name(0),
        3 * 20,
        (7).to_bytes(8, "big"),
    )
    os.remove(cq / "consumequeue" / "refunds" / "1" / offset_to_file_name(0))
    # index: entry 5 of the first file gets another commit-log offset.
    first = _index_files(index)[0]
    _poke(first, ifmt.entry_pos(SLOT_NUM, 5) + 4, (1).to_bytes(8, "big"))

    result = CliRunner().invoke(
        cli,
        [
            "spark",
            "audit",
            str(log_store.log_dir),
            "--cq",
            str(cq),
            "--index",
            str(index),
            "--units-per-file",
            str(UNITS_PER_FILE),
        ],
    )
    assert result.exit_code == audit.EXIT_FOUND, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("cq mismatched orders/0@3:") for line in lines), result.output
    assert any(line.startswith("cq missing refunds/1@0:") for line in lines), result.output
    assert any(line.startswith(f"index mismatched {first.name}#5:") for line in lines)
    assert lines[-1].startswith("DIFFERENCES:")


def test_rebuilt_files_audit_clean_too(spark: Any, log_store: LogStore, rebuilt: Path) -> None:
    report = audit.audit(
        spark,
        str(log_store.log_dir),
        cq_dir=str(rebuilt / "cq"),
        index_dir=str(rebuilt / "index"),
        units_per_file=UNITS_PER_FILE,
    )
    assert report.ok, [f.line() for f in report.findings]


def test_one_zeroed_unit_is_one_finding_and_the_units_after_it_compare_as_they_are(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    """A consume-queue unit zeroed in the middle of a file: exactly one finding, missing, that
    says the unit is invalid (before: reading stopped there and every later unit of the file
    was reported missing)."""
    cq = tmp_path / "cq"
    shutil.copytree(log_store.cq_dir, cq)
    _poke(cq / "consumequeue" / "orders" / "0" / offset_to_file_name(0), 3 * 20, bytes(20))
    report = audit.audit(
        spark, str(log_store.log_dir), cq_dir=str(cq), index_dir=None, units_per_file=UNITS_PER_FILE
    )
    assert [(f.kind, f.location) for f in report.findings] == [("missing", "orders/0@3")]
    assert "invalid" in report.findings[0].detail
    assert [report.count(k) for k in audit.KINDS] == [1, 0, 0]
    assert audit.summary(report).endswith("1 missing, 0 extra, 0 mismatched")


def test_counts_are_exact_when_the_listing_is_capped() -> None:
    """A queue with more findings of a kind than are listed: the rest of each kind is one line
    of that kind, and the summary counts every finding (before: 1,000 of any kind were counted,
    and the rest as one "mismatched")."""
    cap = audit.FINDINGS_PER_GROUP_MAX
    out = audit._Capped("cq", "t/0")
    for i in range(cap + 500):
        out.add("missing", f"@{i}", "unit not in the files")
    for i in range(3):
        out.add("mismatched", f"@{10_000 + i}", "unit differs")
    report = audit.AuditReport(findings=out.findings())
    assert [report.count(k) for k in audit.KINDS] == [cap + 500, 0, 3]
    assert sum(1 for f in report.findings if f.kind == "missing") == cap + 1
    assert report.findings[-1].line() == "cq missing t/0: 500 more missing not listed"
    # The same through the frame Spark carries between the tasks and the driver.
    found, checked = audit._split_checked(list(out.table().to_pandas().itertuples(index=False)))
    assert checked == [("t/0", "")]  # the row saying the queue was checked
    again = audit.AuditReport(findings=found)
    assert [again.count(k) for k in audit.KINDS] == [cap + 500, 0, 3]
    assert f"{cap + 500} missing, 0 extra, 3 mismatched" in audit.summary(again)


def test_taking_findings_in_bulk_lists_and_counts_what_adding_one_by_one_does() -> None:
    """_Capped.take (the checks' loops format only what will be listed) leaves the same
    findings as add() called for every one, across two loops of one kind too."""
    cap = audit.FINDINGS_PER_GROUP_MAX
    one, bulk = audit._Capped("cq", "t/0"), audit._Capped("cq", "t/0")
    first, second = np.arange(cap - 10), np.arange(cap - 10, cap + 300)
    for picks in (first, second):
        for i in picks.tolist():
            one.add("extra", f"@{i}", "x")
        for i in bulk.take("extra", picks):
            bulk.add("extra", f"@{i}", "x")
    for i in bulk.take("missing", np.arange(0)):
        bulk.add("missing", f"@{i}", "x")
    assert bulk.findings() == one.findings()
    assert bulk.findings()[-1].findings == 300


@pytest.mark.parametrize("wrong", ["empty dir", "commit log's dir", "no such dir"])
def test_a_wrong_cq_path_is_a_usage_error_not_a_damaged_store(
    log_store: LogStore, tmp_path: Path, wrong: str
) -> None:
    path = {
        "empty dir": tmp_path,
        "commit log's dir": log_store.log_dir,
        "no such dir": tmp_path / "nowhere",
    }[wrong]
    result = CliRunner().invoke(cli, ["spark", "audit", str(log_store.log_dir), "--cq", str(path)])
    assert result.exit_code == audit.EXIT_USAGE, result.output
    assert str(path) in result.output and "DIFFERENCES" not in result.output


def test_a_wrong_log_or_index_path_is_a_usage_error(log_store: LogStore, tmp_path: Path) -> None:
    for args in (
        [str(tmp_path), "--cq", str(log_store.cq_dir)],
        [str(log_store.log_dir), "--index", str(tmp_path)],
    ):
        result = CliRunner().invoke(cli, ["spark", "audit", *args])
        assert result.exit_code == audit.EXIT_USAGE, result.output
        assert str(tmp_path) in result.output


def test_a_time_entry_failing_its_check_is_one_mismatch(
    spark: Any, log_store: LogStore, tmp_path: Path
) -> None:
    """A time entry whose check no longer matches its unit (its last byte flipped): one finding,
    mismatched, that says the entry fails its check; its neighbours compare clean."""
    cq = tmp_path / "cq"
    shutil.copytree(log_store.cq_dir, cq)
    times = cq / derived.CQ_TIMES_TREE / "orders" / "0" / offset_to_file_name(0)
    last = 4 * 8 + 7
    _poke(times, last, bytes([times.read_bytes()[last] ^ 0xFF]))
    report = audit.audit(
        spark, str(log_store.log_dir), cq_dir=str(cq), index_dir=None, units_per_file=UNITS_PER_FILE
    )
    assert [(f.kind, f.location) for f in report.findings] == [("mismatched", "orders/0@4")]
    assert "fails its check" in report.findings[0].detail
