"""`bench/spark_bench.py --quick` runs end to end (a small log) on the Spark tests' session.

Its main() is called with that session rather than run as a process with a local Spark of its
own: a JVM and its Python workers cost 20-90 s to start on a 2-core machine, and the session
every job command builds (mqstore.spark.jobs.common.session) is started as a user starts it by
tests/spark/test_jobs_ux.py's `mqstore spark audit` and the README's `mqstore spark ...` steps
(tests/docs). `make bench` runs the script itself.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from bench import spark_bench

BENCH_TIMEOUT_S = 240


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_spark_bench_quick_prints_its_figures(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spark_bench.main(["--quick"], spark=spark) == 0
    out = capsys.readouterr().out
    assert "plain Python chunked read:" in out
    assert "sequential read (read_ranges, no Spark):" in out
    assert re.search(
        r"spark read \(local, \d+ cores\): [\d,]+ rows/s \([\d.]+x the chunked read\)", out
    ), out
    assert "export to Parquet:" in out
    assert re.search(r"audit of \d+ records: [\d.]+ s", out), out
    assert not spark.sparkContext._jsc.sc().isStopped()  # the shared session is left running
