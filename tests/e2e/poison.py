"""A store holding poison records for the SDK's and the Spark source's tests (issue 23, item 3).

commitlog_svc refuses at append a body marked compressed that does not decompress, so the
poison is written with the commit-log engine itself (the CommitLog library) into what will be
commitlog_svc's data directory, before the services start on it: real files, real services.

    POISONED_TOPIC, queues 0 and 1: POISON_BODIES, the one at POISON_AT marked zlib-compressed
    though it is not a zlib stream (its CRC is right: the store serves it, no reader decodes it)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from commitlog_svc.commitlog import CommitLog
from commitlog_svc.config import CommitLogConfig
from mqstore.formats import sysflag
from mqstore.formats.properties import encode_properties
from mqstore.testing.cluster import TEST_SEGMENT_BYTES, Cluster, start_all
from tests.commitlog.message_in import MessageIn, as_batches

ZLIB = sysflag.COMPRESSED | sysflag.COMPRESSION_ZLIB
POISONED_TOPIC = "Poisoned"
POISONED_QUEUES = (0, 1)
POISON_BODIES = (b"good-0", b"good-1", b"not a zlib stream", b"good-3", b"good-4")
POISON_AT = 2
GOOD_BODIES = tuple(b for i, b in enumerate(POISON_BODIES) if i != POISON_AT)


@dataclass
class PoisonedStore:
    cluster: Cluster
    poison_offsets: dict[int, int]  # queue id -> the poison's commit-log offset


def write_with_the_engine(data_dir: Path) -> dict[int, int]:
    """POISONED_TOPIC's queues, written by the CommitLog library into `data_dir`."""
    engine = CommitLog(CommitLogConfig(data_dir=str(data_dir), file_bytes=TEST_SEGMENT_BYTES))
    engine.open()
    poison = {}
    try:
        for queue_id in POISONED_QUEUES:
            for i, body in enumerate(POISON_BODIES):
                result = engine.append_batch(
                    as_batches(
                        [
                            MessageIn(
                                POISONED_TOPIC,
                                queue_id,
                                body,
                                properties=encode_properties({"TAGS": "t"}),
                                sys_flag=ZLIB if i == POISON_AT else 0,
                            )
                        ]
                    )
                )
                assert result.ok, result.reasons
                if i == POISON_AT:
                    poison[queue_id] = result.offsets[0]
        return poison
    finally:
        engine.close()


def start_poisoned(root: Path, *, local_reads: bool = True) -> PoisonedStore:
    """The poison written, then commitlog_svc, cq_svc and index_svc started on it. No tail
    records: a record damaged on disk after its append (a test may do that too) is then read
    from the segment files (local reads) or the commit log's Read, never from the appends'
    own copy."""
    root.mkdir(parents=True)
    poison = write_with_the_engine(root / "commitlog")
    cluster = start_all(
        Cluster(root, flush="sync", extra={"cq_svc": ["--tail-records-mib", "0"]},
                local_reads=local_reads)
    )  # fmt: skip
    return PoisonedStore(cluster, poison)
