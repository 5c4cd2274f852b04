"""The decoders of mqstore's own metadata files: checkpoints, store meta, subscriber registry,
group offsets, ack segments and journals, index checkpoint and hash companions.

Input: a selector byte (which decoder), a mode byte, then the file. Most of these files sit in
a CRC32C frame (framing.py), which random bytes never pass; in "framed" mode (mode bit 0) the
harness wraps the rest in a frame with the decoder's magic, a drawn version and a correct CRC,
so that the payload parser itself is fuzzed. Rules:

    decode          returns a value or raises CorruptFile; nothing else
    a value         encodes back to a file that decodes to the same value (for the log-shaped
                    files: the valid prefix re-encodes to exactly the bytes kept)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c

from cq_svc import ack_journal, ack_segment, group_offsets
from fuzz.draw import Draw
from fuzz.findings import check
from mqstore.errors import CorruptFile
from mqstore.formats import commitlog_checkpoint as cl
from mqstore.formats import cq_checkpoint, index_checkpoint, index_hash64
from mqstore.formats.framing import frame

DESCRIPTION = (
    "checkpoint / meta / registry / offsets / ack decoders of all three services: CorruptFile "
    "or a value that re-encodes to itself"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore", "cq_svc", "index_svc")

SEGMENT_ENTRIES = 16_384  # cq's ack segment size


@dataclass(frozen=True)
class Decoder:
    name: str
    magic: bytes  # b"" for files without a frame
    versions: tuple[int, ...]
    check: Callable[[bytes], None]
    decode: Callable[[bytes], object]  # the decoder itself: a value, or CorruptFile


def _commitlog_checkpoint(data: bytes) -> None:
    try:
        value = cl.decode_checkpoint(data)
    except CorruptFile:
        return
    _same("commitlog checkpoint", cl.decode_checkpoint(cl.encode_checkpoint(value)), value)


def _commitlog_meta(data: bytes) -> None:
    try:
        value = cl.decode_meta(data)
    except CorruptFile:
        return
    _same("store meta", cl.decode_meta(cl.encode_meta(value)), value)


def _subscribers(data: bytes) -> None:
    try:
        store_id, subs = cl.decode_subscribers(data)
    except CorruptFile:
        return
    again = cl.decode_subscribers(cl.encode_subscribers(store_id, subs))
    _same("subscribers", again, (store_id, subs))


def _cq_checkpoint(data: bytes) -> None:
    try:
        value = cq_checkpoint.decode(data)
    except CorruptFile:
        return
    _same("cq checkpoint", cq_checkpoint.decode(cq_checkpoint.encode(value)), value)


def _offsets_snapshot(data: bytes) -> None:
    try:
        value = group_offsets.decode_snapshot(data, path="offsets.snap")
    except CorruptFile:
        return
    again = group_offsets.decode_snapshot(group_offsets.encode_snapshot(value), path="again")
    _same("offsets snapshot", again, value)


def _offsets_log(data: bytes) -> None:
    records, good = group_offsets.decode_records(data)
    check(0 <= good <= len(data), "metafiles.offsets-log-length", f"kept {good} of {len(data)}")
    kept = b"".join(group_offsets.encode_record(k, v) for k, v in records)
    check(kept == data[:good], "metafiles.offsets-log-prefix", "the kept records re-encode")


def _ack_segment(data: bytes) -> None:
    try:
        slots = ack_segment.decode_segment(data, SEGMENT_ENTRIES)
    except CorruptFile:
        return
    segment = min(slots) // SEGMENT_ENTRIES if slots else 0
    again = ack_segment.decode_segment(
        ack_segment.encode_segment(segment, SEGMENT_ENTRIES, slots), SEGMENT_ENTRIES
    )
    _same("ack segment", again, slots)


def _ack_meta(data: bytes) -> None:
    try:
        value = ack_segment.decode_meta(data)
    except CorruptFile:
        return
    _same("ack meta", ack_segment.decode_meta(ack_segment.encode_meta(value)), value)


def _ack_journal(data: bytes) -> None:
    entries, keep, bad = ack_journal.decode_entries(data)
    size = ack_journal.ENTRY_BYTES
    check(
        0 <= keep <= len(data) and keep % size == 0 and bad >= 0,
        "metafiles.journal-bounds",
        f"keep {keep}, bad {bad} of {len(data)} bytes",
    )
    check(
        len(entries) + bad == keep // size,
        "metafiles.journal-count",
        f"{len(entries)} good + {bad} bad entries in {keep} kept bytes",
    )
    again, _, _ = ack_journal.decode_entries(ack_journal.encode_entries(entries))
    _same("ack journal", again, entries)


def _index_checkpoint(data: bytes) -> None:
    try:
        value = index_checkpoint.decode_checkpoint(data)
    except CorruptFile:
        return
    again = index_checkpoint.decode_checkpoint(index_checkpoint.encode_checkpoint(value))
    _same("index checkpoint", again, value)


def _hash64_header(data: bytes) -> None:
    try:
        entry_num = index_hash64.decode_header(data)
    except CorruptFile:
        return
    _same(
        "hash64 header",
        index_hash64.decode_header(index_hash64.encode_header(entry_num)),
        entry_num,
    )


def _same(what: str, again: object, value: object) -> None:
    check(again == value, f"metafiles.{what.replace(' ', '-')}-round-trip", f"{again} != {value}")


DECODERS = (
    Decoder(
        "commitlog checkpoint",
        cl.CHECKPOINT_MAGIC,
        (1, 2),
        _commitlog_checkpoint,
        cl.decode_checkpoint,
    ),
    Decoder("store meta", cl.META_MAGIC, (1,), _commitlog_meta, cl.decode_meta),
    Decoder("subscribers", cl.SUBSCRIBERS_MAGIC, (1,), _subscribers, cl.decode_subscribers),
    Decoder("cq checkpoint", cq_checkpoint.MAGIC, (1,), _cq_checkpoint, cq_checkpoint.decode),
    Decoder(
        "offsets snapshot",
        group_offsets.SNAP_MAGIC,
        (1,),
        _offsets_snapshot,
        lambda data: group_offsets.decode_snapshot(data, path="offsets.snap"),
    ),
    Decoder("offsets log", b"", (), _offsets_log, group_offsets.decode_records),
    Decoder(
        "ack segment",
        ack_segment.SEGMENT_MAGIC,
        (1,),
        _ack_segment,
        lambda data: ack_segment.decode_segment(data, SEGMENT_ENTRIES),
    ),
    Decoder("ack meta", ack_segment.META_MAGIC, (1,), _ack_meta, ack_segment.decode_meta),
    Decoder("ack journal", b"", (), _ack_journal, ack_journal.decode_entries),
    Decoder(
        "index checkpoint",
        index_checkpoint.MAGIC,
        (1,),
        _index_checkpoint,
        index_checkpoint.decode_checkpoint,
    ),
    Decoder("hash64 header", index_hash64.MAGIC, (1,), _hash64_header, index_hash64.decode_header),
)
BY_NAME = {d.name: d for d in DECODERS}


def hash64_head(payload: bytes) -> bytes:
    """A companion header whose CRC is right, whatever the 12 bytes before it say."""
    head = payload[:12].ljust(12, b"\0")
    return head + struct.pack(">I", crc32c.crc32c(head)) + payload[12:]


def framed(decoder: Decoder, version: int, payload: bytes) -> bytes:
    if decoder is BY_NAME["hash64 header"]:
        return hash64_head(decoder.magic + struct.pack(">HH", version, 0) + payload)
    return frame(decoder.magic, version, payload)


def one_input(data: bytes) -> None:
    draw = Draw(data)
    decoder = draw.choice(DECODERS)
    mode = draw.byte()
    if decoder.magic and mode & 1:
        version = draw.choice(decoder.versions) if mode & 2 else draw.integer(0, 0xFFFF)
        decoder.check(framed(decoder, version, draw.rest()))
    else:
        decoder.check(draw.rest())


def setup() -> Callable[[bytes], None]:
    return one_input


def seeds() -> list[bytes]:
    """A framed, valid payload for every framed decoder (index i selects DECODERS[i])."""
    ckpt = cl.Checkpoint(
        store_id=bytes(range(16)),
        flushed_offset=4096,
        queue_offsets={("T", 0): 3, ("T", 1): 9},
        producers=[
            cl.ProducerEntry("p1", 7, [cl.ProducerRequest(7, 2, 100, 300, ((1, 7),))]),
        ],
    )
    payloads = {
        "commitlog checkpoint": cl.encode_checkpoint(ckpt)[10:-4],
        "store meta": cl.encode_meta(cl.StoreMeta(bytes(16), 1, 1 << 30))[10:-4],
        "subscribers": cl.encode_subscribers(
            bytes(16), [cl.SubscriberOffset("cq-0", 100, 5), cl.SubscriberOffset("ix", 0, 0)]
        )[10:-4],
        "cq checkpoint": cq_checkpoint.encode(cq_checkpoint.CqCheckpoint(bytes(16), 5, 0, 1))[
            10:-4
        ],
        "offsets snapshot": group_offsets.encode_snapshot({("g", "T", 0): 4, ("h", "T", 1): 2})[
            10:-4
        ],
        "ack segment": ack_segment.encode_segment(
            0, SEGMENT_ENTRIES, {1: (1, 1, 5_000), 2: (2, 1, 0)}
        )[10:-4],
        "ack meta": ack_segment.encode_meta(42)[10:-4],
        "index checkpoint": index_checkpoint.encode_checkpoint(
            index_checkpoint.IndexCheckpoint(
                files=[index_checkpoint.FileRecord(1, 16, 64, 0, 100, index_count=3)]
            )
        )[10:-4],
        "hash64 header": struct.pack(">i", 64),
    }
    out = []
    for i, decoder in enumerate(DECODERS):
        if decoder.name in payloads:
            # selector i, mode 3 (framed, a known version: the last), then the payload
            last = len(decoder.versions) - 1
            out.append(bytes([i, 3, last]) + payloads[decoder.name])
    journal = ack_journal.encode_entries(
        [ack_journal.JournalEntry(ack_journal.Kind.DELIVER, 3, 1, 9_000)]
    )
    out.append(bytes([DECODERS.index(BY_NAME["ack journal"]), 0]) + journal)
    offsets_log = group_offsets.encode_record(("g", "T", 0), 5)
    out.append(bytes([DECODERS.index(BY_NAME["offsets log"]), 0]) + offsets_log)
    return out
