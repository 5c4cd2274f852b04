"""`mqstore spark ...`: the jobs' own flags behind the CLI, usage errors before any Spark."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mqstore.cli import cli


@pytest.mark.parametrize("job", ["export", "rebuild", "audit"])
def test_help_lists_the_jobs_flags(job: str) -> None:
    result = CliRunner().invoke(cli, ["spark", job, "-h"])
    assert result.exit_code == 0, result.output
    assert f"mqstore.spark.jobs.{job}" in result.output
    assert "--master" in result.output


@pytest.mark.parametrize(
    ("args", "needs"),
    [
        (["rebuild", "/nowhere"], "--cq-out"),
        (["audit", "/nowhere"], "--cq"),
        (["export", "/out"], "--log"),
    ],
)
def test_a_job_without_what_it_needs_is_a_usage_error(args: list[str], needs: str) -> None:
    result = CliRunner().invoke(cli, ["spark", *args])
    assert result.exit_code == 2
    assert needs in result.output
