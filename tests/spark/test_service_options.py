"""Options of format("mqstore"): parsing without Spark, and bad options refused clearly,
both by the parser and through a real read (the error a user sees from load()/collect())."""

from __future__ import annotations

from typing import Any

import pytest

from mqstore.client import ClientSettings, Producer
from mqstore.errors import InvalidArgument
from mqstore.spark.options import (
    EARLIEST,
    LATEST,
    PULL_MESSAGES_DEFAULT,
    BadOption,
    client_settings,
    read_options,
    write_options,
)
from mqstore.testing.cluster import Cluster
from tests.spark.conftest import connection_options
from tests.spark.test_service_read import _wait_dispatched

NO_ENV: dict[str, str] = {}


def parse(streaming: bool = False, **options: str) -> Any:
    return read_options({"topic": "orders", **options}, streaming=streaming, env=NO_ENV)


def test_defaults_follow_the_kafka_connector() -> None:
    batch = parse()
    assert batch.subscription.topics == ("orders",) and batch.queues is None
    assert batch.starting.default == "earliest" and batch.ending.default == "latest"
    assert batch.fail_on_data_loss is True
    assert batch.pull_messages == PULL_MESSAGES_DEFAULT
    assert parse(streaming=True).starting.default == "latest"


def test_mode_is_spark_parse_mode_failfast_by_default() -> None:
    assert (parse().mode, parse().corrupt_record_column) == ("FAILFAST", "_corrupt_record")
    assert parse(mode="dropMalformed").mode == "DROPMALFORMED"
    got = parse(MODE="permissive", columnNameOfCorruptRecord="bad")
    assert (got.mode, got.corrupt_record_column) == ("PERMISSIVE", "bad")


def test_keys_are_case_insensitive_and_may_carry_the_mqstore_prefix() -> None:
    opts = read_options(
        {
            "TOPIC": "orders",
            "mqstore.commitlog": "h:1",
            "CQ": "a:1, b:2",
            "FailOnDataLoss": "False",
        },
        streaming=False,
        env=NO_ENV,
    )
    assert opts.settings.commitlog == "h:1"
    assert opts.settings.cq == ("a:1", "b:2")
    assert opts.fail_on_data_loss is False


def test_addresses_fall_back_to_the_environment() -> None:
    env = {"MQSTORE_COMMITLOG": "env:7100", "MQSTORE_CQ": "env:7200", "MQSTORE_TIMEOUT_S": "3"}
    s = client_settings({"cq": "opt:1"}, env)
    assert (s.commitlog, s.cq, s.timeout_s) == ("env:7100", ("opt:1",), 3.0)


def test_offset_json_per_queue_or_per_topic() -> None:
    a = parse(startingOffsets='{"0": 23, "1": -2}', endingOffsets='{"orders": {"0": 40, "2": -1}}')
    assert a.starting.offsets == {"orders": {0: 23, 1: EARLIEST}}
    assert a.ending.offsets == {"orders": {0: 40, 2: LATEST}}
    s = parse(streaming=True, startingOffsets='{"0": -1}')
    assert s.starting.offsets == {"orders": {0: LATEST}}


def test_timestamps_and_queues() -> None:
    o = parse(
        queues="[2, 0, 2]",
        startingTimestamp="1000",
        endingOffsetsByTimestamp='{"0": 5000}',
        minPartitions="4",
        maxRecordsPerPartition="100",
        pullMessages="1024",
    )
    assert o.queues == (2, 0)
    assert o.starting.all_timestamp == 1000 and o.starting.by_time
    assert o.ending.timestamps == {"orders": {0: 5000}}
    assert (o.min_partitions, o.max_records_per_partition, o.pull_messages) == (4, 100, 1024)


@pytest.mark.parametrize(
    ("streaming", "options", "option", "message"),
    [
        (False, {"topic": ""}, "topic", "non-empty"),
        (False, {"topic": "a/b"}, "topic", "must be non-empty and match"),
        (False, {"startingOffsets": "latest"}, "startingOffsets", "streaming reads only"),
        (False, {"startingOffsets": '{"0": -1}'}, "startingOffsets", "streaming reads only"),
        (False, {"startingOffsets": '{"0": -3}'}, "startingOffsets", ">= 0, -2 or -1"),
        (False, {"startingOffsets": "[1]"}, "startingOffsets", "JSON object"),
        (False, {"startingOffsets": "{0: 1}"}, "startingOffsets", "not JSON"),
        (False, {"startingOffsets": '{"x": 1}'}, "startingOffsets", "not a queue id"),
        (False, {"startingOffsets": '{"0": "1"}'}, "startingOffsets", "not an integer"),
        (False, {"startingOffsets": '{"other": {"0": 1}}'}, "startingOffsets", "other than"),
        (False, {"endingOffsets": '{"0": -2}'}, "endingOffsets", "not allowed as an end"),
        (False, {"endingOffsets": "earliest"}, "endingOffsets", "read nothing"),
        (False, {"startingTimestamp": "-5"}, "startingTimestamp", "outside"),
        (False, {"startingTimestamp": "yesterday"}, "startingTimestamp", "not an integer"),
        (False, {"endingOffsetsByTimestamp": '{"0": -1}'}, "endingOffsetsByTimestamp", ">= 0"),
        (False, {"queues": ""}, "queues", "lists no queue"),
        (False, {"queues": "1,x"}, "queues", "not a queue id"),
        (False, {"queues": "70000"}, "queues", "outside"),
        (False, {"queues": "[1.5]"}, "queues", "not a queue id"),
        (False, {"minPartitions": "0"}, "minPartitions", "outside"),
        (False, {"maxRecordsPerPartition": "0"}, "maxRecordsPerPartition", "outside"),
        (False, {"failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
        (False, {"mode": "lenient"}, "mode", "not one of PERMISSIVE, DROPMALFORMED, FAILFAST"),
        (False, {"columnNameOfCorruptRecord": " "}, "columnNameOfCorruptRecord", "is empty"),
        (False, {"pullMessages": "5000"}, "pullMessages", "outside"),
        (False, {"maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger", "streaming reads only"),
        (False, {"timeoutS": "-1"}, "timeoutS", "positive"),
        (False, {"cq": " , "}, "cq", "no address"),
        (False, {"tlsCert": "c.pem"}, "connection", "cert_file and key_file"),
        (True, {"endingOffsets": "latest"}, "endingOffsets", "batch reads only"),
        (True, {"endingTimestamp": "5"}, "endingTimestamp", "batch reads only"),
        (True, {"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "outside"),
    ],
)
def test_bad_read_options_name_the_option(
    streaming: bool, options: dict[str, str], option: str, message: str
) -> None:
    with pytest.raises(BadOption, match=message) as err:
        read_options({"topic": "orders", **options}, streaming=streaming, env=NO_ENV)
    assert err.value.field == option
    assert isinstance(err.value, InvalidArgument)  # maps to INVALID_ARGUMENT like any bad input
    assert repr(option) in str(err.value)


def test_topic_is_required_for_reads_only() -> None:
    with pytest.raises(BadOption, match="required"):
        read_options({}, streaming=False, env=NO_ENV)
    assert write_options({}, NO_ENV).topic is None


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"writeId": ""}, "writeId"),
        ({"writeId": "x" * 201}, "writeId"),
        ({"writeId": "a\x01b"}, "writeId"),
        ({"writeBatchMessages": "10001"}, "writeBatchMessages"),
        ({"queuesPerTopic": "0"}, "queuesPerTopic"),
        ({"endingOffsets": "latest"}, "endingOffsets"),
    ],
)
def test_bad_write_options_name_the_option(options: dict[str, str], option: str) -> None:
    with pytest.raises(BadOption) as err:
        write_options(options, NO_ENV)
    assert err.value.field == option


# -- through Spark ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'topic': is required"),
        ({"topic": "t", "startingOffsets": "latest"}, "streaming reads only"),
        ({"topic": "t", "failOnDataLoss": "perhaps"}, "'failOnDataLoss'"),
    ],
)
def test_bad_options_fail_the_read_with_the_message(
    spark: Any, mqstore_cluster: Cluster, options: dict[str, str], message: str
) -> None:
    r = spark.read.format("mqstore")
    for k, v in {**connection_options(mqstore_cluster), **options}.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=message):
        r.load().collect()


def test_offsets_the_store_does_not_have_fail_at_planning(
    spark: Any, mqstore_cluster: Cluster
) -> None:
    topic = "spark-opts-range"
    settings = ClientSettings(
        commitlog=mqstore_cluster.commitlog.target, cq=(mqstore_cluster.followers["cq"].target,)
    )
    with Producer(settings) as p:
        p.send(topic, b"x", queue_id=0).result(timeout=30)
    _wait_dispatched(mqstore_cluster, topic, {0: 1})
    base = {**connection_options(mqstore_cluster), "topic": topic}
    cases = [
        ({"startingOffsets": '{"0": 5}'}, "past the queue's end"),
        ({"queues": "0", "startingOffsets": '{"3": 0}'}, "does not cover"),
        ({"startingOffsets": '{"0": 1}', "endingOffsets": '{"0": 0}'}, "before its start"),
    ]
    for options, message in cases:
        r = spark.read.format("mqstore")
        for k, v in {**base, **options}.items():
            r = r.option(k, v)
        with pytest.raises(Exception, match=message):
            r.load().collect()


def test_a_schema_of_ones_own_is_refused(spark: Any, mqstore_cluster: Cluster) -> None:
    r = spark.read.format("mqstore").schema("body binary")
    for k, v in {**connection_options(mqstore_cluster), "topic": "t"}.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match="reads its own schema"):
        r.load().collect()
