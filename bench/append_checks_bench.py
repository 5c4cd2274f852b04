"""What the append's poison checks (commitlog_svc/append_checks.py) add to the produce path.

    python -m bench.append_checks_bench [--runs R] [--quick]

For each workload, batches of 1,000 messages as the SDK hands them over, measured in the same
run, interleaved: the engine's append of a batch (CommitLog.append_batch, async flush: encode,
queue offsets, the write into the mapped segment: the path the check is added to), and the
check of the same batch (refuse_unreadable). "before" is the append alone, "after" the check
plus the append; the ratio is after / before. For the properties check, the same check done
blob by blob with the grammar's regex (property_shape.well_formed mapped over the blobs) is
shown next to it: what a per-message check would cost.

Workloads: 100 B and 1 KiB bodies with the SDK's usual properties (UNIQ_KEY), 100 B with
UNIQ_KEY + TAGS + KEYS, and 8 KiB JSON-like bodies zlib-compressed by the producer (4 KiB
threshold), whose check decompresses every body. Figures vary with the machine's load: each
is the median of --runs runs; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from bench.engine_append import make_batches
from commitlog_svc.append_checks import refuse_unreadable
from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig, FlushMode
from mqstore.client.compression import Compression, compress
from mqstore.formats.msgid import UniqIdGenerator
from mqstore.formats.properties import encode_properties
from mqstore.formats.property_shape import well_formed
from mqstore.formats.record_batch import MessageBatch
from mqstore.limits import MessageLimits

SEGMENT_BYTES = 256 << 20  # every run's appends fit one segment
BODY_LIMIT = MessageLimits().body_bytes_max


def with_tags_and_keys(count: int) -> list[MessageBatch]:
    ids = UniqIdGenerator()
    out = make_batches(count, 100)
    for batch in out:
        batch.properties = [
            encode_properties({"UNIQ_KEY": ids.next_id(), "TAGS": "TagA", "KEYS": f"order-{i}"})
            for i in range(len(batch))
        ]
    return out


def compressed(count: int) -> list[MessageBatch]:
    """8 KiB JSON-like bodies, each zlib-compressed as the producer does (~4x here)."""
    out = make_batches(count, 10)
    for batch in out:
        bodies, flags = [], []
        for i in range(len(batch)):
            doc = [
                {"order": i * 100 + k, "sku": f"SKU-{k % 37:05d}", "qty": k % 7} for k in range(160)
            ]
            body, flag = compress(json.dumps(doc).encode()[:8192], Compression.ZLIB)
            bodies.append(body)
            flags.append(flag)
        batch.bodies, batch.sys_flags = bodies, flags
    return out


WORKLOADS: dict[str, Callable[[int], list[MessageBatch]]] = {
    "100 B, UNIQ_KEY": lambda n: make_batches(n, 100),
    "1 KiB, UNIQ_KEY": lambda n: make_batches(n, 1024),
    "100 B, UNIQ_KEY+TAGS+KEYS": with_tags_and_keys,
    "8 KiB zlib-compressed": compressed,
}


def timed(work: Callable[[], object]) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


def run(name: str, batches: list[MessageBatch], runs: int) -> None:
    count = sum(map(len, batches))
    appends, checks, per_blob = [], [], []
    for _ in range(runs):
        directory = tempfile.mkdtemp(prefix="mqs-checks-")
        config = CommitLogConfig(
            data_dir=directory, flush=FlushMode.ASYNC, file_bytes=SEGMENT_BYTES
        )
        engine = CommitLog(config)
        engine.open()
        # As in engine_append: the warmer's head start a running store has (at most 2 s).
        settle = time.monotonic() + 2.0
        while engine.warmed_bytes < config.warm_ahead_bytes and time.monotonic() < settle:
            time.sleep(0.01)
        try:
            checks.append(timed(lambda: [refuse_unreadable([b], BODY_LIMIT) for b in batches]))
            appends.append(timed(lambda: [engine.append_batch(b) for b in batches]))  # noqa: B023 - called at once
            per_blob.append(
                timed(lambda: [list(map(well_formed, b.properties or ())) for b in batches])
            )
        finally:
            engine.close()
            shutil.rmtree(directory, ignore_errors=True)
    before = statistics.median(appends) / count * 1e6
    check = statistics.median(checks) / count * 1e6
    regex = statistics.median(per_blob) / count * 1e6
    print(
        f"{name:28s} append {before:6.2f} us/msg  check {check:6.3f} us/msg  "
        f"after/before {(before + check) / before:5.3f}  (per-blob regex {regex:5.3f} us/msg)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    runs, messages = (3, 4_000) if args.quick else (args.runs, args.messages)
    for name, make in WORKLOADS.items():
        run(name, make(messages if "compressed" not in name else messages // 10), runs)


if __name__ == "__main__":
    main()
