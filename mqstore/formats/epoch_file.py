"""The epoch file: a log's history (mqstore/history.py) on disk, beside the data it describes.

    {commitlog data_dir}/epochs    the commit log's own history (every start adds an epoch)
    {cq_svc data_dir}/epochs       the history of what a follower holds (its last handshake's)
    {index_svc data_dir}/epochs

epochs (frame magic b"MQEP", version 1; framing.py: CRC32C over the whole), replaced
atomically (write_atomic) and durable before anything it describes is written or served:

    0    16   store_id              the commit log this history belongs to
    16   4    count                 at most history.EPOCHS_MAX
    20   ..   count times:          i64 epoch | i64 start_offset      (16 bytes each)
                                    epochs increasing, starts not decreasing

An epoch file that fails its frame or does not parse is CorruptFile, never half-read.
"""

from __future__ import annotations

import struct

from mqstore.errors import CorruptFile, InvalidArgument
from mqstore.formats.framing import frame, unframe
from mqstore.history import EPOCHS_MAX, LogHistory

EPOCHS_MAGIC = b"MQEP"
EPOCHS_VERSION = 1
STORE_ID_BYTES = 16

_HEAD = struct.Struct(">16sI")
_ENTRY = struct.Struct(">qq")
assert _HEAD.size == 20 and _ENTRY.size == 16


def encode_epochs(store_id: bytes, history: LogHistory) -> bytes:
    if len(store_id) != STORE_ID_BYTES:
        raise ValueError(f"store ids are {STORE_ID_BYTES} bytes, not {len(store_id)}")
    parts = [_HEAD.pack(store_id, len(history))]
    parts.extend(_ENTRY.pack(e.epoch, e.start_offset) for e in history)
    return frame(EPOCHS_MAGIC, EPOCHS_VERSION, b"".join(parts))


def decode_epochs(data: bytes, *, path: str = "epochs") -> tuple[bytes, LogHistory]:
    """(store id, history) of an epoch file; CorruptFile if it is not whole and well-formed."""
    version, payload = unframe(EPOCHS_MAGIC, data, path=path)
    if version != EPOCHS_VERSION:
        raise CorruptFile(path, f"unknown epoch file version {version}")
    if len(payload) < _HEAD.size:
        raise CorruptFile(path, f"{len(payload)} payload bytes is shorter than the header")
    store_id, count = _HEAD.unpack_from(payload, 0)
    if count > EPOCHS_MAX or len(payload) != _HEAD.size + count * _ENTRY.size:
        raise CorruptFile(path, f"{count} epochs do not fit {len(payload)} payload bytes")
    entries = [_ENTRY.unpack_from(payload, _HEAD.size + i * _ENTRY.size) for i in range(count)]
    try:
        history = LogHistory(entries)
    except InvalidArgument as exc:
        raise CorruptFile(path, str(exc)) from exc
    if len(history) != count:  # an empty epoch was stored: the writer never does that
        raise CorruptFile(path, "two epochs start at the same offset")
    return store_id, history
