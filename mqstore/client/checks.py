"""The consumers' argument checks: each raises the SDK's InvalidArgument naming the field.

Queue ids and offsets given to a raw pull are left to the server (its INVALID_ARGUMENT names
the field), so that `Consumer.pull` reports exactly what the service says; everything else a
consumer is built or called with is checked here, before any call is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

from mqstore import errors as domain
from mqstore.client.errors import InvalidArgument
from mqstore.formats.record import validate_topic
from mqstore.limits import MessageLimits, validate_group

# A pull's size. A Pull has a fixed cost in a Python client and server whatever its size, so a
# consumer asks for as many messages as the server gives (1,024), and bounds the bytes instead,
# as Kafka's max.partition.fetch.bytes (1 MiB): the first message comes whatever its size. A
# queue holds at most two batches on the client (the one handed out and one pulled ahead), so
# a consumer buffers at most 2 MiB a queue, and one message more when it is larger.
PULL_MESSAGES_DEFAULT = 1_024
PULL_MESSAGES_MAX = 1_024
PULL_BYTES_DEFAULT = 1 << 20

OnBadRecord = Literal["raise", "skip"]

_LIMITS = MessageLimits()

N = TypeVar("N", int, float)


def check_topic(topic: str) -> str:
    try:
        validate_topic(topic, _LIMITS)
    except domain.InvalidArgument as err:
        raise InvalidArgument(str(err), field="topic") from None
    return topic


def check_group(group: str | None) -> str | None:
    if group is None:
        return None
    try:
        return validate_group(group)
    except domain.InvalidArgument as err:
        raise InvalidArgument(str(err), field="group") from None


def check_queue_id(queue_id: int) -> int:
    if not 0 <= queue_id <= _LIMITS.queue_id_max:
        raise InvalidArgument(
            f"queue id {queue_id} is outside [0, {_LIMITS.queue_id_max}]", field="queue_id"
        )
    return queue_id


def check_tags(tags: Sequence[str] | str) -> tuple[str, ...]:
    """A tag list, or RocketMQ's subscription expression "a || b" ("*" or empty: all)."""
    if isinstance(tags, str):
        tags = tags.split("||")
    names = tuple(t.strip() for t in tags if t.strip())
    return () if "*" in names else names


def check_max_messages(n: int) -> int:
    if not 0 < n <= PULL_MESSAGES_MAX:
        raise InvalidArgument(
            f"max_messages {n} is outside [1, {PULL_MESSAGES_MAX}]", field="max_messages"
        )
    return n


def check_on_bad_record(on_bad_record: str) -> OnBadRecord:
    if on_bad_record == "raise":
        return "raise"
    if on_bad_record == "skip":
        return "skip"
    raise InvalidArgument(
        f"on_bad_record {on_bad_record!r} is not 'raise' or 'skip'", field="on_bad_record"
    )


def check_positive(value: N, name: str) -> N:
    if value <= 0:
        raise InvalidArgument(f"{name} must be positive", field=name)
    return value


def check_not_negative(value: N, name: str) -> N:
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative", field=name)
    return value
