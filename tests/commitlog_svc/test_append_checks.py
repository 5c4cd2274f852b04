"""append_checks.refuse_unreadable on its own: the inflate work of one append is bounded in all,
not only body by body (the service's path is tests/commitlog_svc/test_svc_append_checks.py)."""

from __future__ import annotations

import zlib

from commitlog_svc.append_checks import refuse_unreadable
from mqstore.formats import sysflag
from mqstore.formats.record_batch import MessageBatch

ZLIB = sysflag.COMPRESSED | sysflag.COMPRESSION_ZLIB


def test_the_compressed_bodies_of_one_append_inflate_at_most_the_budget_in_all() -> None:
    """Each body alone is within the body limit; past the append's budget the rest are refused
    unchecked, saying why and what to do, and a plain body still goes in."""
    each = zlib.compress(bytes(1000))  # 1000 bytes once decompressed
    batch = MessageBatch(
        topic="T",
        queue_ids=[0] * 5,
        bodies=[each, each, each, b"plain", each],
        sys_flags=[ZLIB, ZLIB, ZLIB, 0, ZLIB],
    )
    refused = refuse_unreadable([batch], body_bytes_max=4096, inflate_bytes_max=2500)
    assert sorted(refused) == [2, 4]
    assert all(e.field == "body" and "smaller appends" in str(e) for e in refused.values())
    assert refuse_unreadable([batch], body_bytes_max=4096, inflate_bytes_max=4000) == {}


def test_a_failed_body_spends_the_budget_it_used() -> None:
    """A bomb stopped at the body limit has made that much output: it counts."""
    bomb = zlib.compress(bytes(10_000))
    good = zlib.compress(b"x" * 200)
    batch = MessageBatch(topic="T", queue_ids=[0, 0], bodies=[bomb, good], sys_flag=ZLIB)
    refused = refuse_unreadable([batch], body_bytes_max=4096, inflate_bytes_max=4200)
    assert "past the 4096-byte limit" in str(refused[0])
    assert "smaller appends" in str(refused[1])  # 4097 spent: 103 left, 200 needed
