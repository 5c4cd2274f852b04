"""Decoded messages for the wire (common.v1.Message), from a commit-log record."""

from __future__ import annotations

import functools

from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import KEYS, TAGS, UNIQ_KEY
from mqstore.formats.record import Record, unpack_host
from mqstore.rpc.gen.common.v1 import common_pb2

HOST_TEXTS_CACHED = 1_024


@functools.lru_cache(maxsize=HOST_TEXTS_CACHED)
def host_text(packed: bytes) -> str:
    """The text "ip:port" of a packed host. Cached: a record's hosts repeat (one store host, a few
    producers), and the consume path decodes two per message."""
    ip, port = unpack_host(packed)
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def record_to_message(record: Record) -> common_pb2.Message:
    props = record.properties_dict()
    return common_pb2.Message(
        topic=record.topic,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
        commit_log_offset=record.physical_offset,
        size=record.total_size,
        body=record.body,
        properties=props,
        flag=record.flag,
        sys_flag=record.sys_flag,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=host_text(record.born_host),
        store_timestamp_ms=record.store_timestamp_ms,
        store_host=host_text(record.store_host),
        reconsume_times=record.reconsume_times,
        prepared_tx_offset=record.prepared_tx_offset,
        body_crc=record.body_crc,
        msg_id=offset_msg_id(record.store_host, record.physical_offset),
        tags=props.get(TAGS, ""),
        keys=props.get(KEYS, ""),
        uniq_key=props.get(UNIQ_KEY, ""),
    )
