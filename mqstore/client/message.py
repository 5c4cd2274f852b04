"""Messages as the SDK hands them out: decoded, checked, decompressed.

Bulk paths (Pull, Receive) carry raw commit-log records (format in protos/common.proto); a
record is decoded here with the store's own codec, its body CRC checked (corrupt bytes are
never handed to the caller: DataLoss), and its body decompressed when SYSFLAG says so.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from mqstore.client.compression import decompress
from mqstore.client.errors import DataLoss
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY, split_keys
from mqstore.formats.record import Record, read_record
from mqstore.rpc.gen.common.v1 import common_pb2
from mqstore.rpc.messages import host_text


# Not frozen: a frozen dataclass sets each field through object.__setattr__ (about 1 us more
# per object with this many fields, measured), and one is made per message on hot paths. Treat
# it as a value: nothing assigns to its fields; unsafe_hash keeps it hashable as before.
@dataclass(slots=True, unsafe_hash=True)
class Message:
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    body: bytes  # decompressed
    properties: dict[str, str] = field(default_factory=dict)
    store_timestamp_ms: int = 0
    born_timestamp_ms: int = 0
    store_host: str = ""
    born_host: str = ""
    sys_flag: int = 0
    flag: int = 0
    reconsume_times: int = 0
    size: int = 0  # the record's TOTALSIZE in the commit log
    msg_id: str = ""  # the offset message id (store host + commit-log offset)

    @property
    def tags(self) -> str:
        return self.properties.get(TAGS, "")

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(KEYS))

    @property
    def uniq_key(self) -> str:
        """The producer-side unique id (RocketMQ's UNIQ_KEY, its client's "msgId")."""
        return self.properties.get(UNIQ_KEY, "")

    @classmethod
    def from_record(cls, raw: bytes) -> Message:
        decoded = read_record(raw, 0, len(raw))
        if not isinstance(decoded, Record):
            reason = getattr(decoded, "reason", "not a record")
            raise DataLoss(f"a record from the store fails its checks: {reason}")
        return cls._of(decoded)

    @classmethod
    def _of(cls, r: Record) -> Message:
        return cls(
            topic=r.topic,
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            commit_log_offset=r.physical_offset,
            body=decompress(r.body, r.sys_flag),
            properties=r.properties_dict(),
            store_timestamp_ms=r.store_timestamp_ms,
            born_timestamp_ms=r.born_timestamp_ms,
            store_host=host_text(r.store_host),
            born_host=host_text(r.born_host),
            sys_flag=r.sys_flag,
            flag=r.flag,
            reconsume_times=r.reconsume_times,
            size=r.total_size,
            msg_id=offset_msg_id(r.store_host, r.physical_offset),
        )

    @classmethod
    def from_proto(cls, m: common_pb2.Message) -> Message:
        return cls(
            topic=m.topic,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            commit_log_offset=m.commit_log_offset,
            body=decompress(m.body, m.sys_flag),
            properties=dict(m.properties),
            store_timestamp_ms=m.store_timestamp_ms,
            born_timestamp_ms=m.born_timestamp_ms,
            store_host=m.store_host,
            born_host=m.born_host,
            sys_flag=m.sys_flag,
            flag=m.flag,
            reconsume_times=m.reconsume_times,
            size=m.size,
            msg_id=m.msg_id,
        )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (body as UTF-8 text when it is, else base64 under body_base64)."""
        out: dict[str, object] = {
            "topic": self.topic,
            "queue_id": self.queue_id,
            "queue_offset": self.queue_offset,
            "commit_log_offset": self.commit_log_offset,
            "msg_id": self.msg_id,
            "uniq_key": self.uniq_key,
            "tags": self.tags,
            "keys": self.keys,
            "store_timestamp_ms": self.store_timestamp_ms,
            "born_timestamp_ms": self.born_timestamp_ms,
            "born_host": self.born_host,
            "store_host": self.store_host,
            "size": self.size,
            "properties": self.properties,
        }
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body_base64"] = base64.b64encode(self.body).decode("ascii")
        return out


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message delivered in receive/ack mode: ack it with its receipt before it turns
    visible again."""

    message: Message
    receipt_handle: str
    delivery_count: int
