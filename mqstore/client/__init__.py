"""The Python SDK of mqstore: produce, consume and administer without the protos.

    from mqstore.client import ClientSettings, Connection, Producer, Consumer, Admin
    from mqstore.client import SimpleConsumer  # receive / ack only

See docs/client.md for a tour. Everything raises the typed exceptions of
`mqstore.client.errors`.
"""

from __future__ import annotations

from mqstore.client.admin import (
    Admin,
    ClusterStatus,
    CommitLogStatus,
    CqReplicaStatus,
    IndexReplicaStatus,
    KeyPageOverflow,
    QueueInfo,
    SubscriberLag,
)
from mqstore.client.batch import BatchFuture, BatchNotStored, BatchResult
from mqstore.client.compression import Compression
from mqstore.client.connection import Connection
from mqstore.client.consumer import (
    AckResult,
    Consumer,
    ConsumerStats,
    Offset,
    PullResult,
    Start,
    Timestamp,
)
from mqstore.client.errors import BadRecord, ClientError, MessageRefused, StoreUnreachable
from mqstore.client.message import Message, PolledBatch, ReceivedMessage
from mqstore.client.producer import (
    AsyncProducer,
    Producer,
    ProducerStats,
    SendFuture,
    SendResult,
)
from mqstore.client.settings import ClientSettings, TlsSettings
from mqstore.client.simple_consumer import SimpleConsumer

__all__ = [
    "Admin",
    "ClusterStatus",
    "CommitLogStatus",
    "CqReplicaStatus",
    "IndexReplicaStatus",
    "KeyPageOverflow",
    "QueueInfo",
    "SubscriberLag",
    "AckResult",
    "BatchFuture",
    "BatchNotStored",
    "BatchResult",
    "Consumer",
    "ConsumerStats",
    "Offset",
    "PolledBatch",
    "PullResult",
    "SimpleConsumer",
    "Start",
    "Timestamp",
    "AsyncProducer",
    "BadRecord",
    "ClientError",
    "ClientSettings",
    "Compression",
    "Connection",
    "Message",
    "MessageRefused",
    "Producer",
    "ProducerStats",
    "ReceivedMessage",
    "SendFuture",
    "SendResult",
    "StoreUnreachable",
    "TlsSettings",
]
