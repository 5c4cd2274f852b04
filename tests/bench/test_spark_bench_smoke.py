"""`bench/spark_bench.py --quick` runs end to end (its own local Spark, a small log)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_spark_bench_quick_prints_its_figures() -> None:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime")
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "spark_bench.py"), "--quick", "--master", "local[2]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=BENCH_TIMEOUT_S - 10,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plain Python chunked read:" in result.stdout
    assert "sequential read (read_ranges, no Spark):" in result.stdout
    assert re.search(
        r"spark read \(local, \d+ cores\): [\d,]+ rows/s \([\d.]+x the chunked read\)",
        result.stdout,
    ), result.stdout
    assert "export to Parquet:" in result.stdout
    assert re.search(r"audit of \d+ records: [\d.]+ s", result.stdout), result.stdout
