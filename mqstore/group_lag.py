"""How far a consumer group is behind on one queue: the one rule that `mqstore groups`, `mqstore
offsets show`, Admin.group_lag() and cq_svc's mqstore_cq_group_lag_messages all show."""

from __future__ import annotations


def queue_lag(committed: int | None, min_offset: int, max_offset: int) -> int:
    """Messages the group has still to read: max offset - committed. A group that never
    committed on the queue (None) starts at its earliest kept offset (a group consumer's
    default fallback), so all of the queue is still to read; an offset below the queue's
    min counts from the min (what was deleted can no longer be read)."""
    return max(0, max_offset - max(committed or 0, min_offset))
