"""What an append refuses at the door: messages that could be stored but never read back.

The engine refuses what breaks a limit or the record layout (record_batch.py: sizes, queue
ids, topic, properties ending in 0x02). A message can pass all of that and still be poison: a
consumer that reaches it cannot decode it, and before this check the consumer's whole batch
failed with it (issue 23). So the servicer checks first, in the handler thread and outside the
engine's write lock:

    a body marked compressed (SYSFLAG 0x1) whose type bits (0x700)     MESSAGE_ILLEGAL
      name no codec                                                       field "sys_flag"
    a body marked compressed that does not decompress whole with its    MESSAGE_ILLEGAL
      codec within the body limit (formats/compression.decompress, the    field "body"
      consumer's own reading)
    properties that are not key 0x01 value 0x02 pairs                   MESSAGE_ILLEGAL
      (formats/property_shape.py)                                         field "properties"

A refused message stays out of what the engine is given (`without`); the others are stored
exactly as if it had not been sent (offsets, queue offsets, an idempotent producer's record of
the request), and the answer puts each refusal back at its index (`with_refusals`). The checks
are a function of the request alone, so a retry of the same request is refused the same way.

Cost: a batch without the COMPRESSED bit costs a bit test (a scalar sys_flag) or one C-level
map over its sys_flags column; the properties check is a few C-speed passes over the joined
blobs (_core.malformed_properties). A compressed body costs its decompression, bounded by the
body limit, and an append's compressed bodies together by APPEND_INFLATE_BYTES_MAX.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import TypeVar

from commitlog_svc.messages import AppendResult, PutStatus
from mqstore.errors import MessageIllegal
from mqstore.formats import sysflag
from mqstore.formats._core import malformed_properties
from mqstore.formats.compression import UndecodableBody, decompress
from mqstore.formats.property_shape import malformed_reason
from mqstore.formats.record_batch import MessageBatch

# Every compressed body of one append inflates at most this much in all while it is checked:
# a body alone is bounded by the body limit (4 MiB: milliseconds of zlib for a 4 KiB bomb),
# but 10,000 of them in one request would buy minutes of CPU. 256 MiB is a
# producer's default 1 MiB batch of bodies that compress 256x, or its largest (32 MiB) at 8x.
APPEND_INFLATE_BYTES_MAX = 256 << 20

T = TypeVar("T")


def refuse_unreadable(
    batches: Sequence[MessageBatch],
    body_bytes_max: int,
    inflate_bytes_max: int = APPEND_INFLATE_BYTES_MAX,
) -> dict[int, MessageIllegal]:
    """The messages (numbered across the batches) that could never be read back, and why."""
    refused: dict[int, MessageIllegal] = {}
    budget = inflate_bytes_max
    base = 0
    for batch in batches:
        if batch.properties:
            for k in malformed_properties(batch.properties):
                refused[base + k] = MessageIllegal(
                    f"properties: {malformed_reason(batch.properties[k])}", field="properties"
                )
        for k in _compressed(batch):
            body = batch.bodies[k]
            if base + k in refused or len(body) > body_bytes_max:
                continue  # refused already (the engine refuses an oversized body itself)
            flag = batch.sys_flags[k] if batch.sys_flags is not None else batch.sys_flag
            limit = min(body_bytes_max, budget)
            try:
                budget -= len(decompress(body, flag, limit))
            except UndecodableBody as exc:
                budget -= exc.output_bytes
                if limit < body_bytes_max and exc.field == "body":
                    reason = (
                        f"not checked: the compressed bodies of this append decompress past "
                        f"{inflate_bytes_max} bytes in all; send them in smaller appends"
                    )
                else:
                    reason = str(exc)
                refused[base + k] = MessageIllegal(reason, field=exc.field)
        base += len(batch)
    return refused


def _compressed(batch: MessageBatch) -> Sequence[int]:
    """Indices of the batch's messages marked COMPRESSED (in their sys_flags or the batch's)."""
    flags = batch.sys_flags
    if flags is None:
        return range(len(batch)) if batch.sys_flag & sysflag.COMPRESSED else ()
    marks = map(operator.and_, flags, itertools.repeat(sysflag.COMPRESSED))
    return list(itertools.compress(range(len(flags)), marks))


def without(batches: Sequence[MessageBatch], refused: Mapping[int, object]) -> list[MessageBatch]:
    """The batches less the refused messages (numbered across them); a batch left empty is
    dropped. Only batches that lose a message are copied."""
    out = []
    base = 0
    for batch in batches:
        n = len(batch)
        gone = [k for k in range(n) if base + k in refused] if refused else []
        base += n
        if not gone:
            out.append(batch)
            continue
        if len(gone) == n:
            continue
        keep = sorted(set(range(n)) - set(gone))
        out.append(
            dataclasses.replace(
                batch,
                queue_ids=[batch.queue_ids[k] for k in keep],
                bodies=[batch.bodies[k] for k in keep],
                properties=_pick(batch.properties, keep),
                sys_flags=_pick(batch.sys_flags, keep),
            )
        )
    return out


def _pick(column: list[T] | None, keep: list[int]) -> list[T] | None:
    return None if column is None else [column[k] for k in keep]


def with_refusals(
    stored: AppendResult, refused: Mapping[int, MessageIllegal], count: int
) -> AppendResult:
    """The result of the whole request of `count` messages: `stored` (the engine's result for
    the messages not refused, in order) with each refusal put back at its index."""
    out = AppendResult(
        statuses=[],
        store_timestamp_ms=stored.store_timestamp_ms,
        store_host=stored.store_host,
        duplicate=stored.duplicate,
    )
    j = 0
    for i in range(count):
        error = refused.get(i)
        if error is not None:
            out.statuses.append(PutStatus.MESSAGE_ILLEGAL)
            out.offsets.append(-1)
            out.sizes.append(0)
            out.queue_offsets.append(-1)
            out.reasons.append(str(error))
            out.fields.append(error.field)
            continue
        out.statuses.append(stored.statuses[j])
        out.offsets.append(stored.offsets[j])
        out.sizes.append(stored.sizes[j])
        out.queue_offsets.append(stored.queue_offsets[j])
        out.reasons.append(stored.reasons[j] if j < len(stored.reasons) else "")
        out.fields.append(stored.field_of(j))
        j += 1
    return out
