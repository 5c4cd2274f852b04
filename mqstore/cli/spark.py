"""`mqstore spark`: the Spark jobs, run on this machine (local[*]) or on a given master.

    mqstore spark export OUT --log DATA | --topic T [...]    Parquet by topic and date
    mqstore spark rebuild DATA --cq-out D --index-out D      cq_svc / index_svc files from a log
    mqstore spark audit DATA [--cq D] [--index D] [...]      live files against the log

DATA is the data dir `mqstore up` made (its commit log, consume queues and index are found in
it) or a part's own directory.

Each command hands its arguments to the job's own parser (`mqstore spark rebuild --help`
prints them), so the CLI, `python -m mqstore.spark.jobs.<job>` and spark-submit take the same
flags. pyspark is imported only when a command runs.

Exit codes (mqstore/spark/jobs/common.py): 0 success; 1 the job failed, or audit found
differences; 2 bad arguments (a path without a store, an export into a folder that is not
empty); 3 a service could not be reached; 130 interrupted. A failure is one line on stderr.
"""

from __future__ import annotations

import importlib
from typing import Final

import click

JOBS: Final = {
    "export": "Write a topic, or a raw commit log, as Parquet partitioned by topic and date.",
    "rebuild": "Build cq_svc's and index_svc's files from a commit log, byte for byte.",
    "audit": "Compare live consume queues and index files with the log (exit 1 on differences).",
}


@click.group("spark")
def spark_group() -> None:
    """Spark jobs over the store's files and services (PySpark 4, Java 17).

    \b
    Examples:
      mqstore spark export ./lake --log ./data
      mqstore spark rebuild ./data --cq-out ./cq-new --index-out ./index-new
      mqstore spark audit ./data
      mqstore spark audit ./data --cq ./data/cq_svc
    """


def _job_command(name: str, help_text: str) -> click.Command:
    @click.command(
        name,
        help=f"{help_text} (`mqstore spark {name} -h` lists the flags.)",
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
        add_help_option=False,
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def command(ctx: click.Context, args: tuple[str, ...]) -> None:
        module = importlib.import_module(f"mqstore.spark.jobs.{name}")
        try:
            code = int(module.main(list(args)))
        except SystemExit as exc:  # argparse: -h (0) and usage errors (2)
            code = exc.code if isinstance(exc.code, int) else 2
        ctx.exit(code)

    return command


for _name, _help in JOBS.items():
    spark_group.add_command(_job_command(_name, _help))
