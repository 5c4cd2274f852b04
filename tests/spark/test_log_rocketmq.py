"""format("mqstore-log") on a commit log laid out as RocketMQ's CommitLog writes it (records
from offset 0 of each file, END_OF_FILE blanks, IPv4 and IPv6 hosts, the all-zero spare file
RocketMQ pre-creates), split into byte ranges smaller than a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cli.segments import Msg, build_rocketmq_style, host_text

FILE_BYTES = 16384


def test_a_rocketmq_commit_log_reads_back_every_record_with_its_fields(
    spark: Any, tmp_path: Path
) -> None:
    msgs = [
        Msg(
            topic=f"rmq-{i % 3}",
            queue_id=i % 4,
            queue_offset=i // 4,
            body=b"rocketmq body %d " % i * (1 + i % 7),
            properties={"TAGS": f"t{i % 2}", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:08d}"},
            store_timestamp_ms=1_700_000_000_000 + i,
            store=("::1", 10911) if i % 5 == 0 else ("10.0.0.7", 10911),
            sys_flag=0x20 if i % 5 == 0 else 0,  # STOREHOSTADDRESS_V6_FLAG where the host is v6
        )
        for i in range(240)
    ]
    placed = build_rocketmq_style(tmp_path / "commitlog", FILE_BYTES, msgs, spare_files=1)
    assert placed[-1].offset > FILE_BYTES  # several files, each ending with a blank
    df = (
        spark.read.format("mqstore-log")
        .option("splitBytes", "4096")  # the minimum: ranges a quarter of a file
        .load(str(tmp_path / "commitlog"))
    )
    rows = sorted((r.asDict() for r in df.collect()), key=lambda r: r["commitLogOffset"])
    assert [r["commitLogOffset"] for r in rows] == [p.offset for p in placed]
    for row, p in zip(rows, placed, strict=True):
        m = p.msg
        assert (row["topic"], row["queueId"], row["queueOffset"]) == (
            m.topic,
            m.queue_id,
            m.queue_offset,
        )
        assert bytes(row["body"]) == m.body and row["totalSize"] == p.size
        assert (row["tags"], row["keys"], row["uniqKey"]) == (
            m.properties["TAGS"],
            m.properties["KEYS"],
            m.properties["UNIQ_KEY"],
        )
        assert row["storeHost"] == host_text(*m.store)
        assert row["storeTimestampMs"] == m.store_timestamp_ms
        assert row["badReason"] is None
