"""The Spark batch writer's digest of its rows (mqstore/spark/write_ledger.py): what it adds to
the writer's own per-row Python work, before any gRPC.

    python -m bench.spark_write_digest_bench [--rows 50000] [--rounds 7]

The same Arrow batch (100-byte bodies, one key, a tag) goes through service_source._rows, the
writer's per-row loop, for a write with a writeId (a write without one only counts its rows),
with WriteDigest.add and with it replaced by a no-op, interleaved round by round; the best
round of each is kept, in CPU time of this process (other processes on the machine disturb it
less than the wall clock). A ratio, not a speed: it is what to quote.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from bench.meters import Stopwatch
from mqstore.spark import service_source
from mqstore.spark.options import write_options
from mqstore.spark.write_ledger import WriteDigest


def _per_row_us(batch: Any, add: Callable[..., None]) -> float:
    opts = write_options({"topic": "orders", "writeId": "bench", "commitlog": "127.0.0.1:1"})
    real = WriteDigest.add
    WriteDigest.add = add  # type: ignore[method-assign]
    try:
        with Stopwatch() as clock:
            for _ in service_source._rows(opts, 0, iter([batch]), WriteDigest()):
                pass
        return clock.cpu_s / int(batch.num_rows) * 1e6
    finally:
        WriteDigest.add = real  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.rows
    batch = pa.RecordBatch.from_pydict(
        {
            "body": [b"x" * 100 + str(i).encode() for i in range(n)],
            "keys": [[f"k{i}"] for i in range(n)],
            "tags": ["tag"] * n,
        }
    )
    with_digest, without = [], []
    for _ in range(args.rounds):
        with_digest.append(_per_row_us(batch, WriteDigest.add))
        without.append(_per_row_us(batch, lambda self, *row: None))
    a, b = min(with_digest), min(without)
    print(f"_rows with the digest {a:.2f} us/row, without {b:.2f} us/row: ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
