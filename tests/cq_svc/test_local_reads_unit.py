"""LocalReads (cq_svc/local_reads.py) on its own, over hand-made files: when it trusts a
directory, and when it stops telling the commit log it needs no records."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cq_svc.local_reads import LocalReads
from mqstore.formats.commitlog_checkpoint import StoreMeta, encode_meta
from mqstore.formats.record import encode_record
from mqstore.formats.record_columns import CheckedRecords
from mqstore.storage.logreader import COMMITLOG_SUBDIR, STORE_META_FILE
from mqstore.storage.mapped_file import offset_to_file_name

STORE = b"L" * 16
SEGMENT_BYTES = 4096


def _arr(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _read(
    local: LocalReads, offsets: np.ndarray, sizes: np.ndarray
) -> tuple[bytes, CheckedRecords] | None:
    """As the servicer reads (record_sources.SegmentFiles): the copy, then its check."""
    return local.check(offsets, sizes, local.copy(offsets, sizes))


def _store(root: Path, *, segments: bool) -> bytes:
    """store.meta, and (when asked) one segment holding a record at offset 0."""
    (root / STORE_META_FILE).write_bytes(encode_meta(StoreMeta(STORE, 1, SEGMENT_BYTES)))
    record = encode_record(topic="T", queue_id=0, body=b"local", physical_offset=0)
    if segments:
        (root / COMMITLOG_SUBDIR).mkdir()
        segment = record + bytes(SEGMENT_BYTES - len(record))
        (root / COMMITLOG_SUBDIR / offset_to_file_name(0)).write_bytes(segment)
    return record


def test_a_matching_store_with_readable_segments_serves(tmp_path: Path) -> None:
    record = _store(tmp_path, segments=True)
    local = LocalReads(str(tmp_path))
    assert _read(local, _arr([0]), _arr([len(record)])) is None  # not before a handshake
    local.on_handshake(STORE, 0)
    assert local.active and local.serving
    got = _read(local, _arr([0]), _arr([len(record)]))
    assert got is not None
    blob, checked = got
    assert blob == record
    # The record's fields as its check read them (the servicer's unit checks reuse them).
    assert checked.ok and checked.ends.tolist() == [len(record)]
    assert checked.physical_offsets.tolist() == [0]
    assert local.serving
    local.on_handshake(b"X" * 16, 0)  # another log now: nothing from these files
    assert not local.active and not local.serving
    assert _read(local, _arr([0]), _arr([len(record)])) is None


def test_store_meta_without_readable_segments_gives_the_tail_back(tmp_path: Path) -> None:
    record = _store(tmp_path, segments=False)
    local = LocalReads(str(tmp_path))
    local.on_handshake(STORE, 0)
    assert local.active and local.serving  # nothing read yet
    assert _read(local, _arr([0]), _arr([len(record)])) is None
    assert local.active and not local.serving  # the frames should bring records again
    local.on_handshake(STORE, 0)
    assert local.serving


def test_a_damaged_record_is_refused_and_a_record_elsewhere_is_not_served(tmp_path: Path) -> None:
    record = _store(tmp_path, segments=True)
    local = LocalReads(str(tmp_path))
    local.on_handshake(STORE, 0)
    path = tmp_path / COMMITLOG_SUBDIR / offset_to_file_name(0)
    data = bytearray(path.read_bytes())
    data[len(record) - 10] ^= 0x01  # inside the record
    path.write_bytes(bytes(data))
    assert _read(local, _arr([0]), _arr([len(record)])) is None


def test_copies_then_checks_note_the_last_checks_outcome(tmp_path: Path) -> None:
    """The servicer copies every group of a pull first and checks them after (the copies
    outside its CPU section): a group that missed, checked last, leaves the reads not serving,
    whatever an earlier group did (found by a review: the earlier copy's miss was cleared by a
    later check's hit, and the frames stopped bringing the records the miss needed)."""
    record = _store(tmp_path, segments=True)
    local = LocalReads(str(tmp_path))
    local.on_handshake(STORE, 0)
    size = _arr([len(record)])
    here, nowhere = _arr([0]), _arr([1 << 20])  # no segment holds the second
    copies = [local.copy(here, size), local.copy(nowhere, size)]
    assert copies[1] is None and local.serving  # a copy notes nothing yet
    assert local.check(here, size, copies[0]) is not None
    assert local.check(nowhere, size, copies[1]) is None
    assert not local.serving
    assert _read(local, here, size) is not None and local.serving  # a hit serves again
