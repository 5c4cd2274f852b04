"""PySpark data sources and jobs over mqstore.

    spark.read.format("mqstore")       a topic's queues through the services (batch and streaming)
    df.write.format("mqstore")         rows appended through the SDK, idempotent per task
    spark.read.format("mqstore-log")   commit-log segment files read directly, no service running

`register(spark)` registers every source with a session; pyspark is imported only here and in
the modules below, so the rest of mqstore never needs it.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the mqstore data sources with a SparkSession (`spark.dataSource.register`)."""
    # Imported here: pyspark is needed only by those who register (import mqstore stays light).
    from mqstore.spark.log_source import MqstoreLogDataSource  # noqa: PLC0415
    from mqstore.spark.service_source import MqstoreDataSource  # noqa: PLC0415

    spark.dataSource.register(MqstoreDataSource)
    spark.dataSource.register(MqstoreLogDataSource)
