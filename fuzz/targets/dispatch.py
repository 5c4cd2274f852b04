"""The dispatch batch decoder (mqstore/rpc/dispatch_codec.py) over arbitrary DispatchBatch frames.

Input: a mode byte; bit 0 set: the rest is protobuf wire bytes (what a subscriber's stream would
deserialize), else a DispatchBatch built column by column from the input (columns of drawn,
often unequal, lengths and topic indexes in and out of the table). Rules:

    decode_dispatch  returns a list of DispatchEntry or raises an MqstoreError; nothing else
    a returned list  has one entry per commit-log offset, every column was that long (keys
                     and uniq_keys: that long or empty), every entry's topic is the table
                     entry its index names (0 <= index < table size), and the entries encode
                     and decode to themselves
    records          (when the frame has them) add up to the sizes, none negative, or the
                     frame is refused; decode_columns accepts and refuses exactly what
                     decode_dispatch does and hands the records on unchanged
Bytes that are not a DispatchBatch at all are protobuf's to refuse (DecodeError): gRPC ends the
stream before the decoder sees them.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.message import DecodeError

from fuzz.draw import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, Draw
from fuzz.findings import check
from mqstore.dispatch import DispatchEntry
from mqstore.errors import MqstoreError
from mqstore.rpc.dispatch_codec import decode_columns, decode_dispatch, encode_dispatch
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

DESCRIPTION = (
    "decode_dispatch over arbitrary DispatchBatch frames: a typed error or one entry per "
    "offset, every column as long, topic indexes inside the table"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore",)

COLUMNS = (
    "topic_indexes",
    "queue_ids",
    "queue_offsets",
    "commit_log_offsets",
    "sizes",
    "tags_codes",
    "store_timestamps_ms",
    "sys_flags",
)
_INT32_COLUMNS = {"topic_indexes", "queue_ids", "sizes", "sys_flags"}
ENTRIES_MAX = 8


def check_batch(batch: pb.DispatchBatch) -> list[DispatchEntry] | None:
    """The rules above for one frame; the entries when it decoded, None when refused."""
    try:
        columns = decode_columns(batch)
    except MqstoreError:
        columns = None
    try:
        entries = decode_dispatch(batch)
    except MqstoreError:
        check(columns is None, "dispatch.columns-accept-a-refused-frame", str(batch)[:200])
        return None
    check(columns is not None, "dispatch.columns-refuse-an-accepted-frame", str(batch)[:200])
    assert columns is not None
    check(columns.records == batch.records, "dispatch.records-changed", "")
    if batch.records:
        check(
            len(batch.records) == sum(batch.sizes) and min(batch.sizes) >= 0,
            "dispatch.records-not-matching-sizes-accepted",
            f"{len(batch.records)} bytes of records for sizes {list(batch.sizes)}",
        )
    n = len(batch.commit_log_offsets)
    check(len(entries) == n, "dispatch.entry-count", f"{len(entries)} entries for {n} offsets")
    lengths = {name: len(getattr(batch, name)) for name in COLUMNS}
    check(
        set(lengths.values()) <= {n},
        "dispatch.ragged-columns-accepted",
        f"column lengths {lengths} decoded to {n} entries",
    )
    optional = {"keys": len(batch.keys), "uniq_keys": len(batch.uniq_keys)}
    check(
        set(optional.values()) <= {0, n},
        "dispatch.ragged-key-columns-accepted",
        f"{optional} for {n} entries: the odd column was dropped",
    )
    topics = list(batch.topics)
    for i, (entry, index) in enumerate(zip(entries, batch.topic_indexes, strict=True)):
        check(
            0 <= index < len(topics),
            "dispatch.topic-index-outside-table",
            f"entry {i} has topic index {index} in a table of {len(topics)}: read as "
            f"{entry.topic!r}",
        )
        check(entry.topic == topics[index], "dispatch.wrong-topic", f"entry {i}: {entry}")
    again = encode_dispatch(
        entries, start_offset=batch.start_offset, next_offset=batch.next_offset, include_keys=True
    )
    check(
        decode_dispatch(pb.DispatchBatch.FromString(again.SerializeToString())) == entries,
        "dispatch.round-trip",
        "the decoded entries do not survive encode + decode",
    )
    return entries


def check_wire(data: bytes) -> None:
    try:
        batch = pb.DispatchBatch.FromString(data)
    except DecodeError:
        return
    check_batch(batch)


def draw_batch(draw: Draw) -> pb.DispatchBatch:
    n = draw.integer(0, ENTRIES_MAX)
    topics = [draw.text(12) for _ in range(draw.integer(0, 3))]
    batch = pb.DispatchBatch(
        start_offset=draw.integer(0, 1 << 20, (-1, INT64_MAX)),
        next_offset=draw.integer(0, 1 << 20, (-1, INT64_MAX)),
        topics=topics,
    )
    for name in COLUMNS:
        # Mostly n long; sometimes one more or one less (a ragged frame).
        length = max(0, n + draw.choice((0, 0, 0, 0, 0, 1, -1)))
        column = getattr(batch, name)
        for _ in range(length):
            if name == "topic_indexes":
                column.append(
                    draw.integer(0, max(0, len(topics) - 1), (-1, len(topics), INT32_MIN))
                )
            elif name in _INT32_COLUMNS:
                column.append(draw.integer(0, 1 << 16, (-1, 0, INT32_MAX, INT32_MIN)))
            else:
                column.append(draw.integer(0, 1 << 40, (-1, 0, INT64_MAX, INT64_MIN)))
    if draw.boolean():
        batch.keys.extend(draw.text(10) for _ in range(max(0, n + draw.choice((0, 0, -1)))))
        batch.uniq_keys.extend(draw.text(10) for _ in range(max(0, n + draw.choice((0, 0, -1)))))
    if draw.boolean():
        # Records as a frame of held appends carries them: as long as the sizes say, or not.
        total = sum(batch.sizes)
        if abs(total) <= 1 << 20:
            batch.records = b"r" * max(0, total + draw.choice((0, 0, 0, 1, -1)))
    return batch


def one_input(data: bytes) -> None:
    if data[:1] and data[0] & 1:
        check_wire(data[1:])
    else:
        check_batch(draw_batch(Draw(data[1:])))


def setup() -> Callable[[bytes], None]:
    return one_input


def sample_entries() -> list[DispatchEntry]:
    return [
        DispatchEntry("T", 0, 0, 0, 120, 97, 1_000, 0, "k1 k2", "U1"),
        DispatchEntry("%RETRY%g", 3, 7, 120, 130, 0, 1_001, 0x8),
        DispatchEntry("T", 1, 0, 250, 100, 98, 1_002),
    ]


def seeds() -> list[bytes]:
    frame = encode_dispatch(sample_entries(), start_offset=0, next_offset=350, include_keys=True)
    return [b"\x01" + frame.SerializeToString(), b"\x00" + bytes(range(64))]
