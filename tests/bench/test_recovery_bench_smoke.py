"""`python -m bench.recovery_bench --quick` runs end to end on a tiny log: a child process
builds and kills a store, and every row of the table is printed with its figures (no speed is
asserted: the machine is shared)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH_TIMEOUT_S = 110.0

pytestmark = pytest.mark.slow

ROWS = [
    "raw read, cold",
    "raw read, warm",
    "raw map walk, cold",
    "raw map walk, warm",
    "zlib.crc32 of the files, warm",
    "walk: scan_run (reference)",
    "walk: scan_run_fast",
    "abnormal open, cold",
    "abnormal open, warm",
    "normal open, cold",
    "normal open, warm",
]


@pytest.mark.timeout(BENCH_TIMEOUT_S + 10)
def test_the_quick_run_recovers_a_killed_store_and_prints_every_row(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.recovery_bench", "--quick", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    for body in (100, 1024):
        assert f"recovery, body {body} B:" in done.stdout, done.stdout
    for row in ROWS:
        found = re.findall(
            rf"^{re.escape(row)}\s+([\d.]+)\s+([\d,]*)\s+([\d.]+)", done.stdout, re.M
        )
        assert len(found) == 2, (row, done.stdout)  # one per body size
    # Both walks and every open checked the same records (the open only from its start file).
    walks = re.findall(r"^walk: \S+(?: \(reference\))?\s+[\d.]+\s+([\d,]+)", done.stdout, re.M)
    assert len(walks) == 4 and walks[0] == walks[1] and walks[2] == walks[3], done.stdout
    assert "page cache:" in done.stdout
    assert list(tmp_path.iterdir()) == [], "the benchmark left its temporary stores behind"
