"""PySpark data sources and jobs over mqstore.

    spark.read.format("mqstore")       a topic's queues through the services (batch and streaming)
    df.write.format("mqstore")         rows appended through the SDK, idempotent per task
    spark.read.format("mqstore-log")   commit-log segment files read directly, no service running

`session()` is a SparkSession that works from a venv without activating it (local[*] on
loopback by default, sessions.py); `register(spark)` registers every source with a session of
your own; `write(df, ...)` writes a DataFrame and returns what it stored (WriteReport).
pyspark is imported only here and in the modules below, so the rest of mqstore never needs it.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mqstore.spark.write_ledger import WriteReport


def session(
    app_name: str = "mqstore",
    *,
    master: str | None = None,
    ui_port: int | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession with the mqstore sources registered; local[*] on loopback, its Python
    workers this interpreter, unless told otherwise (mqstore/spark/sessions.py)."""
    from mqstore.spark.sessions import session as make  # noqa: PLC0415 (needs pyspark)

    return make(app_name, master=master, ui_port=ui_port, conf=conf)


def register(spark: Any) -> None:
    """Register the mqstore data sources with a SparkSession (`spark.dataSource.register`)."""
    # Imported here: pyspark is needed only by those who register (import mqstore stays light).
    from mqstore.spark.log_source import MqstoreLogDataSource  # noqa: PLC0415 - needs pyspark
    from mqstore.spark.service_source import MqstoreDataSource  # noqa: PLC0415 - needs pyspark

    spark.dataSource.register(MqstoreDataSource)
    spark.dataSource.register(MqstoreLogDataSource)


def write(df: Any, **options: Any) -> WriteReport:
    """`df.write.format("mqstore").mode("append")` with `options` (topic, writeId, the
    connection, ...), and what it did: rows, stored, already stored (a rerun), per topic.

    The report travels from the write's commit, which runs on the driver's host, through a
    file there (the `reportFile` option)."""
    from mqstore.spark.write_ledger import WriteReport  # noqa: PLC0415 (keeps the import light)

    register(df.sparkSession)
    with tempfile.TemporaryDirectory(prefix="mqstore-write-") as directory:
        path = os.path.join(directory, "report.json")
        writer = df.write.format("mqstore").mode("append")
        for name, value in options.items():
            writer = writer.option(name, str(value))
        writer.option("reportFile", path).save()
        with open(path, encoding="utf-8") as f:
            return WriteReport.from_json(json.load(f))
