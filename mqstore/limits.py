"""Message limits shared by the codec, the commit log and every client.

Each number is RocketMQ's (reference/rocketmq-store.md §1.6) unless a comment says otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mqstore.errors import InvalidArgument

# RocketMQ's TopicValidator pattern. Topics become directory names in the consume-queue tree,
# so this is also what keeps "../" and friends out of paths.
TOPIC_PATTERN = re.compile(r"\A[%|a-zA-Z0-9_-]+\Z")


@dataclass(frozen=True)
class MessageLimits:
    # maxMessageSize: applies to the body only.
    body_bytes_max: int = 4 * 1024 * 1024
    # The broker's limit for ordinary topics; the record stores it in a 1-byte length (V1).
    topic_bytes_max: int = 127
    # Retry and dead-letter topics (%RETRY%..., %DLQ%...) may be longer; written with V2.
    system_topic_bytes_max: int = 255
    # Properties length is an int16 in the record.
    properties_bytes_max: int = 32_767
    # Queue ids are int32 in the record; 65,535 queues per topic is far past any sane topic and
    # keeps a typo (queue 2**31-1) from creating a directory nobody meant.
    queue_id_max: int = 65_535
    # Messages in one append batch: bounds the work done under the write lock.
    batch_messages_max: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.topic_bytes_max <= self.system_topic_bytes_max <= 32_767:
            raise InvalidArgument("topic limits must satisfy 0 < ordinary <= system <= 32767")
        if not 0 < self.properties_bytes_max <= 32_767:
            raise InvalidArgument("properties_bytes_max must fit the record's int16 length")


def is_system_topic(topic: str) -> bool:
    return topic.startswith(("%RETRY%", "%DLQ%"))


# RocketMQ's Validators.CHARACTER_MAX_LENGTH: the longest consumer-group name.
GROUP_CHARS_MAX = 255


def validate_group(group: str) -> str:
    """A consumer-group name as RocketMQ allows it (the topic pattern, 1..255 characters)."""
    if not group or len(group) > GROUP_CHARS_MAX or not TOPIC_PATTERN.match(group):
        raise InvalidArgument(
            f"group {group[:64]!r} must be 1 to {GROUP_CHARS_MAX} characters matching "
            f"{TOPIC_PATTERN.pattern}",
            field="group",
        )
    return group
