"""DispatchBatch (the columnar frame of Subscribe) to and from DispatchEntry lists.

commitlog_svc encodes what its scan found; cq_svc and index_svc decode: `decode_columns` into
DispatchColumns (numpy columns, no object per message: what the followers apply), or
`decode_dispatch` into a DispatchEntry list. Both check a frame by the same rules. Topics are
sent once per batch in a table and referenced by index, so a batch of one topic carries the
name once.

A frame whose columns disagree in length, whose keys columns are neither empty nor one per
entry, whose records (when sent) do not add up to its sizes, or whose topic index falls outside
its table is refused whole (MalformedFrame): a follower never applies a guess.

The handshake's and the Subscribe request's LogHistory (mqstore/history.py) convert here too:
`history_from_proto` refuses a malformed one (InvalidArgument, field "history").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from mqstore.dispatch import NO_STRINGS, DispatchColumns, DispatchEntry, Utf8Column
from mqstore.errors import InvalidArgument, MalformedFrame
from mqstore.formats import _core
from mqstore.history import EPOCHS_MAX, LogHistory
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb


def history_to_proto(history: LogHistory) -> pb.LogHistory:
    return pb.LogHistory(epochs=history.epochs, start_offsets=history.starts)


def history_from_proto(message: pb.LogHistory) -> LogHistory:
    epochs, starts = message.epochs, message.start_offsets
    if len(epochs) != len(starts):
        raise InvalidArgument(
            f"{len(epochs)} epochs but {len(starts)} start offsets", field="history"
        )
    if len(epochs) > EPOCHS_MAX:
        raise InvalidArgument(
            f"{len(epochs)} epochs; a history holds at most {EPOCHS_MAX}", field="history"
        )
    return LogHistory(zip(epochs, starts, strict=True))


def encode_dispatch(
    entries: Sequence[DispatchEntry],
    *,
    start_offset: int,
    next_offset: int,
    include_keys: bool,
    corrupt: Sequence[tuple[int, int]] = (),
) -> pb.DispatchBatch:
    topics: dict[str, int] = {}
    topic_indexes = []
    for e in entries:
        index = topics.get(e.topic)
        if index is None:
            index = topics[e.topic] = len(topics)
        topic_indexes.append(index)
    batch = pb.DispatchBatch(
        start_offset=start_offset,
        next_offset=next_offset,
        topics=list(topics),
        topic_indexes=topic_indexes,
        queue_ids=[e.queue_id for e in entries],
        queue_offsets=[e.queue_offset for e in entries],
        commit_log_offsets=[e.commit_log_offset for e in entries],
        sizes=[e.size for e in entries],
        tags_codes=[e.tags_code for e in entries],
        store_timestamps_ms=[e.store_timestamp_ms for e in entries],
        sys_flags=[e.sys_flag for e in entries],
        corrupt_starts=[start for start, _ in corrupt],
        corrupt_ends=[end for _, end in corrupt],
    )
    if include_keys:
        batch.keys.extend(e.keys for e in entries)
        batch.uniq_keys.extend(e.uniq_key for e in entries)
    return batch


_COLUMNS = (
    "topic_indexes",
    "queue_ids",
    "queue_offsets",
    "sizes",
    "tags_codes",
    "store_timestamps_ms",
    "sys_flags",
)


def _check_lengths(batch: pb.DispatchBatch) -> int:
    """The number of entries of a frame whose columns agree; MalformedFrame otherwise."""
    n = len(batch.commit_log_offsets)
    for name in _COLUMNS:
        if len(getattr(batch, name)) != n:
            raise MalformedFrame(
                f"malformed dispatch frame: {len(getattr(batch, name))} {name} for {n} entries"
            )
    for name in ("keys", "uniq_keys"):
        if len(getattr(batch, name)) not in (0, n):
            raise MalformedFrame(
                f"malformed dispatch frame: {len(getattr(batch, name))} {name} for {n} entries"
            )
    return n


def _check_records(records: bytes, sizes: np.ndarray) -> None:
    """A frame's records (when it has them) add up to its sizes, none negative."""
    if records:
        total = int(sizes.sum())
        if len(records) != total or int(sizes.min(initial=0)) < 0:
            raise MalformedFrame(
                f"malformed dispatch frame: {len(records)} bytes of records for entries of {total}"
            )


def _check_topic_indexes(lowest: int, highest: int, topics: int) -> None:
    if lowest < 0 or highest >= topics:
        raise MalformedFrame(
            f"malformed dispatch frame: a topic index outside its table of {topics}"
        )


def decode_response(raw: bytes) -> pb.SubscribeResponse | DispatchColumns:
    """A Subscribe stream message's wire bytes: its batch as columns (decoded in compiled code,
    formats/_core_frames.pxi, and checked as decode_dispatch checks a frame), or the message
    when it holds no batch (a handshake). Bytes that are no SubscribeResponse: MalformedFrame."""
    try:
        got = _core.decode_response(raw)
        if got is None:
            return pb.SubscribeResponse.FromString(raw)
    except (_core.WireError, DecodeError) as err:
        raise MalformedFrame(f"malformed dispatch frame: {err}") from err
    start, next_offset, topics, columns, keys, uniq_keys, records = got
    (topic_indexes, queue_ids, queue_offsets, offsets, sizes, tags, stamps, flags) = (
        np.frombuffer(c, dtype=np.int64) for c in columns[:8]
    )
    n = len(offsets)
    lengths = zip(
        _COLUMNS, (topic_indexes, queue_ids, queue_offsets, sizes, tags, stamps, flags), strict=True
    )
    for name, column in lengths:
        if len(column) != n:
            raise MalformedFrame(f"malformed dispatch frame: {len(column)} {name} for {n} entries")
    strings_columns = [
        _strings(name, column, n) for name, column in (("keys", keys), ("uniq_keys", uniq_keys))
    ]
    _check_records(records, sizes)
    if n:
        _check_topic_indexes(int(topic_indexes.min()), int(topic_indexes.max()), len(topics))
    return DispatchColumns(
        topics=topics,
        topic_indexes=topic_indexes,
        queue_ids=queue_ids,
        queue_offsets=queue_offsets,
        commit_log_offsets=offsets,
        sizes=sizes,
        tags_codes=tags,
        store_timestamps_ms=stamps,
        sys_flags=flags,
        keys=strings_columns[0],
        uniq_keys=strings_columns[1],
        start_offset=start,
        next_offset=next_offset,
        records=records,
    )


def _strings(name: str, column: tuple[bytes, bytes], n: int) -> Utf8Column:
    """A string column of _core.decode_response as a Utf8Column of none or n strings;
    MalformedFrame for any other count."""
    data, offsets = column
    if not offsets:
        return NO_STRINGS
    count = len(offsets) // 8 - 1
    if count != n:
        raise MalformedFrame(f"malformed dispatch frame: {count} {name} for {n} entries")
    return Utf8Column(data, np.frombuffer(offsets, dtype=np.int64))


def decode_columns(batch: pb.DispatchBatch) -> DispatchColumns:
    """A frame as columns, by decode_response (what the subscribers run) of its wire bytes."""
    got = decode_response(pb.SubscribeResponse(batch=batch).SerializeToString())
    assert isinstance(got, DispatchColumns)
    return got


def decode_dispatch(batch: pb.DispatchBatch) -> list[DispatchEntry]:
    topics = list(batch.topics)
    n = _check_lengths(batch)
    records = batch.records
    if records:
        _check_records(records, np.array(batch.sizes, dtype=np.int64))
    if n:
        _check_topic_indexes(min(batch.topic_indexes), max(batch.topic_indexes), len(topics))
    keys = list(batch.keys) if batch.keys else [""] * n
    uniq = list(batch.uniq_keys) if batch.uniq_keys else [""] * n
    return [
        DispatchEntry(
            topic=topics[t],
            queue_id=q,
            queue_offset=qo,
            commit_log_offset=o,
            size=sz,
            tags_code=tc,
            store_timestamp_ms=ts,
            sys_flag=sf,
            keys=k,
            uniq_key=u,
        )
        for t, q, qo, o, sz, tc, ts, sf, k, u in zip(
            batch.topic_indexes,
            batch.queue_ids,
            batch.queue_offsets,
            batch.commit_log_offsets,
            batch.sizes,
            batch.tags_codes,
            batch.store_timestamps_ms,
            batch.sys_flags,
            keys,
            uniq,
            strict=True,
        )
    ]
