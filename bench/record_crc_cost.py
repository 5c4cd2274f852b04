"""What the whole-record CRC costs the hot record paths, per record, against the code before it.

    python -m bench.record_crc_cost --base DIR [--calls 200] [--records 1000]

DIR holds the `mqstore` package of the commit to compare with, e.g. the one before the
whole-record CRC:

    mkdir -p /tmp/base && git archive <commit> mqstore | tar -x -C /tmp/base

The base's record_batch, record_columns and record_walk (a base before the walk moved into
record_columns) are loaded from DIR under other names
into this process, beside this tree's (they take the rest, the record codec and its constants,
from this tree: for the valid records measured here that is the same code), and the calls
alternate, base then this, --calls times each: a figure is the median of a path's calls, in CPU
time of the calling thread (ns per record), so that the machine's drift and other processes'
turns on a shared machine weigh on both alike. Paths measured, on a producer's batches (one
topic, a UNIQ_KEY property per message; bodies of 100 B and 1 KiB):

- encode:        record_batch.BatchEncoder.encode of one batch of --records messages (the
                 append path under the put lock);
- check:         record_columns.check_records of those records, bodies=False (a Read, cq_svc's
                 local reads) and bodies=True (the SDK's decode);
- walk:          record_columns.scan_run_fast over 20 such batches laid end to end (recovery).

Each side checks the records its own encoder writes: this tree's carry the whole-record CRC,
the base's do not. "no CRC" runs this tree on records without it (an older log).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from mqstore.formats import record_batch, record_columns
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties
from mqstore.limits import MessageLimits

WALK_BATCHES = 20
BODY_SIZES = (100, 1024)
STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"


def load_base(directory: str) -> dict[str, ModuleType]:
    """The base tree's three modules, by file, under names of their own."""
    out = {}
    for name in ("record_columns", "record_batch", "record_walk"):
        path = Path(directory) / "mqstore" / "formats" / f"{name}.py"
        if name == "record_walk" and not path.exists():
            continue  # the walk is record_columns'
        spec = importlib.util.spec_from_file_location(f"base_{name}", path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        out[name] = module
    return out


def _cpu_ns(fn: Callable[[], object]) -> int:
    started = time.thread_time_ns()
    fn()
    return time.thread_time_ns() - started


def paths(
    batch_mod: Any, columns: Any, walk: Any, batch: Any, records: int, **encoder: bool
) -> dict[str, tuple[Callable[[], object], int]]:
    """Each measured path as (a call, the records it handles), on records this side writes."""
    enc = batch_mod.BatchEncoder(STORE_HOST, MessageLimits(), **encoder)
    encode = functools.partial(enc.encode, [batch], store_timestamp_ms=1, queue_table={})
    written = encode(base_offset=0)
    # Record starts in the blob: a base before the compiled encoder names them `positions`.
    starts = getattr(written, "positions", None)
    offsets = list(written.offsets if starts is None else starts)  # base offset 0: the same
    blob, sizes = bytes(written.blob), list(written.sizes)
    log = bytearray()
    for _ in range(WALK_BATCHES):
        log += encode(base_offset=len(log)).blob
    walked = bytes(log)
    check = columns.check_records
    return {
        "encode": (functools.partial(encode, base_offset=0), records),
        "check": (functools.partial(check, blob, sizes, offsets, bodies=False), records),
        "check+bodies": (functools.partial(check, blob, sizes, offsets, bodies=True), records),
        "walk": (
            functools.partial(walk.scan_run_fast, walked, 0, len(walked), 0),
            WALK_BATCHES * records,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="directory holding the base's mqstore")
    parser.add_argument("--calls", type=int, default=200, help="calls of each path and side")
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    base = load_base(args.base)
    ids = UniqIdGenerator()
    print(f"ns per record (CPU), median of {args.calls} alternating calls")
    print(f"{'path':<22}{'base':>9}{'this':>9}{'this/base':>11}{'no CRC':>9}{'/base':>7}")
    for body_bytes in BODY_SIZES:
        body = os.urandom(body_bytes)
        batch = record_batch.MessageBatch(
            topic="bench",
            queue_ids=[i % 8 for i in range(args.records)],
            bodies=[body] * args.records,
            properties=[
                encode_properties({"UNIQ_KEY": ids.next_id()}) for _ in range(args.records)
            ],
        )
        walk = base.get("record_walk", base["record_columns"])
        mods = (base["record_batch"], base["record_columns"], walk)
        ours = (record_batch, record_columns, record_columns)
        sides = {
            "base": paths(*mods, batch, args.records),
            "this": paths(*ours, batch, args.records, record_crc=True),
            "no CRC": paths(*ours, batch, args.records, record_crc=False),
        }
        for path in sides["base"]:
            times: dict[str, list[float]] = {side: [] for side in sides}
            calls = args.calls if path != "walk" else max(1, args.calls // 10)
            for _ in range(calls):
                for side, measured in sides.items():
                    fn, count = measured[path]
                    times[side].append(_cpu_ns(fn) / count)
            got = {side: statistics.median(values) for side, values in times.items()}
            this, plain, was = got["this"], got["no CRC"], got["base"]
            print(f"{f'{path} {body_bytes} B':<22}{was:>9.0f}{this:>9.0f}{this / was:>10.2f}x"
                  f"{plain:>9.0f}{plain / was:>6.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
