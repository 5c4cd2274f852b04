"""One message as an object, for tests that build appends a message at a time; `batches`
groups consecutive ones into the columnar `MessageBatch`es the commit log takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mqstore.formats.record_batch import LOCALHOST_V4, MessageBatch


@dataclass(slots=True)
class MessageIn:
    topic: str
    queue_id: int
    body: bytes
    properties: bytes = b""  # encoded with mqstore.formats.properties.encode_properties
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: bytes = LOCALHOST_V4
    reconsume_times: int = 0
    prepared_tx_offset: int = 0


def as_batches(messages: Sequence[MessageIn]) -> list[MessageBatch]:
    """Consecutive messages that share a topic and the batch-wide fields, as one batch."""
    out: list[MessageBatch] = []
    current: MessageBatch | None = None
    for m in messages:
        if (
            current is None
            or m.topic != current.topic
            or m.flag != current.flag
            or m.born_timestamp_ms != current.born_timestamp_ms
            or m.born_host != current.born_host
            or m.reconsume_times != current.reconsume_times
            or m.prepared_tx_offset != current.prepared_tx_offset
        ):
            current = MessageBatch(
                topic=m.topic,
                queue_ids=[],
                bodies=[],
                properties=[],
                sys_flags=[],
                flag=m.flag,
                born_timestamp_ms=m.born_timestamp_ms,
                born_host=m.born_host,
                reconsume_times=m.reconsume_times,
                prepared_tx_offset=m.prepared_tx_offset,
            )
            out.append(current)
        current.queue_ids.append(m.queue_id)
        current.bodies.append(m.body)
        assert current.properties is not None and current.sys_flags is not None
        current.properties.append(m.properties)
        current.sys_flags.append(m.sys_flag)
    return out
