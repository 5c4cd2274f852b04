"""`make run` until the services exist: the engine end to end on a local data directory.

Appends messages under sync flush, closes the store, opens it again (recovery), reads every
message back by offset and prints what it did. Run it twice: the second run finds the first
run's messages and appends after them.
"""

from __future__ import annotations

import argparse
import logging
import time

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from commitlog_svc.messages import MessageIn
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties

DEMO_TOPIC = "demo"
DEMO_QUEUES = 4


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", default="./data")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    config = CommitLogConfig(
        data_dir=f"{args.data_dir}/commitlog_svc", flush=FlushMode.SYNC, file_bytes=64 << 20
    )
    ids = UniqIdGenerator()
    log = CommitLog(config)
    report = log.open()
    start = log.max_offset
    print(
        f"opened {config.data_dir}: offsets [{log.min_offset}, {start}) after a "
        f"{'clean' if report.clean_exit else 'crash'} exit, recovery {report.duration_ms:.1f} ms"
    )

    began = time.perf_counter()
    appended = []
    for first in range(0, args.messages, args.batch):
        batch = []
        for i in range(first, min(first + args.batch, args.messages)):
            props = encode_properties(
                {"TAGS": f"tag{i % 3}", "KEYS": f"order-{i}", "UNIQ_KEY": ids.next_id()}
            )
            batch.append(MessageIn(DEMO_TOPIC, i % DEMO_QUEUES, f"message {i}".encode(), props))
        result = log.append_batch(batch)
        if not result.ok:
            print(f"append refused: {result.status.name}: {result.reasons[0]}")
            log.close()
            return 1
        appended.extend(result.offsets)
    took = time.perf_counter() - began
    print(
        f"appended {len(appended)} messages with sync flush in {took:.2f} s "
        f"({len(appended) / took:,.0f} msg/s); log end {log.max_offset}"
    )
    log.close()

    log = CommitLog(config)
    report = log.open()
    print(
        f"reopened: recovery checked {report.records_scanned} records in "
        f"{report.duration_ms:.1f} ms, log end {log.max_offset}"
    )
    for offset in appended:
        log.read_record(offset)
    last = log.read_record(appended[-1])
    print(
        f"read back all {len(appended)} messages by offset; the last: topic={last.topic} "
        f"queue={last.queue_id} queue offset={last.queue_offset} body={last.body!r}"
    )
    print("queue offsets:", {f"{t}/{q}": n for (t, q), n in sorted(log.queue_offsets().items())})
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
