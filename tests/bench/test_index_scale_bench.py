"""`python -m bench.index_scale_bench --quick` runs end to end: both shard counts measured, every
answer checked by the benchmark itself, a table with a positive rate for each (no speed is
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


def test_the_quick_run_measures_one_and_two_shards(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.index_scale_bench", "--quick", "--keys", "500",
         "--seconds", "0.5", "--dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    rows = re.findall(r"^\| (\d) \| ([\d,]+) \| ([\d.]+)x \|", done.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "2"], done.stdout
    assert all(int(r[1].replace(",", "")) > 0 for r in rows), done.stdout
    assert list(tmp_path.iterdir()) == [], "the benchmark left its temporary stores behind"
