"""The append path's encoder alone: microseconds a message.

    python -m bench.encode_bench [--repeat R]

record_batch.BatchEncoder.encode of one batch as the SDK hands it over (each message its own
UNIQ_KEY property, 8 queues), with the whole-record CRC on, for bodies of 100 B and 1 KiB and
batches of 1, 10 and 1,000 messages. Each cell is the best of --repeat timings of calls
encoding 20,000 messages in all, in CPU time (the machine is shared and noisy: the best is the
least disturbed).
"""

from __future__ import annotations

import argparse
import os
import time

from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import pack_host
from mqstore.formats.record_batch import BatchEncoder, MessageBatch
from mqstore.limits import MessageLimits

QUEUES = 8


def us_per_message(body_bytes: int, count: int, repeat: int) -> float:
    ids = UniqIdGenerator()
    body = os.urandom(body_bytes)
    batch = MessageBatch(
        topic="bench",
        queue_ids=[i % QUEUES for i in range(count)],
        bodies=[body] * count,
        properties=[encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in range(count)],
    )
    encoder = BatchEncoder(pack_host("10.0.0.1", 10911), MessageLimits())
    table: dict[str, dict[int, int]] = {}
    calls = max(1, 20_000 // count)
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(calls):
            encoder.encode([batch], base_offset=0, store_timestamp_ms=1, queue_table=table)
        best = min(best, time.process_time() - start)
    return best / (calls * count) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'body':>6} {'batch':>6} {'us/msg':>8}")
    for body_bytes in (100, 1024):
        for count in (1, 10, 1000):
            us = us_per_message(body_bytes, count, args.repeat)
            print(f"{body_bytes:>6} {count:>6} {us:>8.3f}")


if __name__ == "__main__":
    main()
