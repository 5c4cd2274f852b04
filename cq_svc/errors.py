"""cq_svc's own errors, under mqstore's hierarchy (mqstore/errors.py draws the whole tree):

NotFound
└── ReceiptExpired        an ack or change-invisible-duration names a delivery that is no
                          longer current (redelivered since, or never handed out)
"""

from __future__ import annotations

from mqstore.errors import NotFound


class ReceiptExpired(NotFound):
    def __init__(self, group: str, topic: str, queue_id: int, offset: int, reason: str) -> None:
        super().__init__(f"receipt {group}/{topic}/{queue_id}@{offset} expired: {reason}")
        self.queue_offset = offset
        self.reason = reason
