"""index_svc's request validators: fuzzed key queries to a live replica of a live commit log.

Input: a method selector, then the request drawn field by field (or raw bytes). Rules, beyond
"an answer or a typed status" (api.py):

    QueryByKey      at most max_messages (0: the default), never over the server's cap; every
                    message is of the asked topic and carries the key among its KEYS tokens;
                    newest first (commit-log offsets descending)
    QueryByUniqKey  every message is of the asked topic with that UNIQ_KEY
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.draw import INT32_MAX, INT32_MIN, INT64_MAX, Draw
from fuzz.findings import check
from fuzz.services import (
    INDEX_DEFAULT_RESULTS,
    INDEX_MAX_RESULTS,
    RETRY_TOPIC,
    TOPIC,
    Stack,
)
from fuzz.targets.api import CALL_TIMEOUT_S, Failed, call, raw_unary, shared_stack
from index_svc.servicer import KEY_BYTES_MAX
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.index.v1 import index_pb2 as pb

DESCRIPTION = (
    "fuzzed key and unique-id queries to a live index replica: a typed status or only "
    "matching messages, newest first, within the cap"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore", "index_svc")

SERVICE = "mqstore.index.v1.Index"
RAW_METHODS = ("QueryByKey", "QueryByUniqKey", "GetStatus")
LIMITS = MessageLimits()


class IndexApi:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stub = stack.keys
        self.channel = stack.raw_channel("index")
        self.methods: tuple[Callable[[Draw], None], ...] = (
            self.query_by_key,
            self.query_by_key,
            self.query_by_uniq_key,
            self.get_status,
            self.raw,
        )

    def one_input(self, data: bytes) -> None:
        draw = Draw(data)
        draw.choice(self.methods)(draw)

    def draw_topic(self, draw: Draw) -> str:
        k = draw.byte() % 5
        if k <= 1:
            return TOPIC
        if k == 2:
            return draw.choice((RETRY_TOPIC, "Unknown"))
        return draw.text(140, (LIMITS.topic_bytes_max, LIMITS.topic_bytes_max + 1, 0))

    def draw_key(self, draw: Draw, *, uniq: bool) -> str:
        k = draw.byte() % 4
        if k <= 1:
            stored = draw.choice(self.stack.stored)
            if uniq:
                return stored.uniq_key
            return draw.choice(stored.keys.split(" ") if stored.keys else ["dup"])
        return draw.text(40, (KEY_BYTES_MAX, KEY_BYTES_MAX + 1, 0))

    def query_by_key(self, draw: Draw) -> None:
        now_ms = self.stack.engine.newest_store_timestamp_ms()
        request = pb.QueryByKeyRequest(
            topic=self.draw_topic(draw),
            key=self.draw_key(draw, uniq=False),
            begin_timestamp_ms=draw.integer(0, 3, (-1, now_ms, now_ms + 1, INT64_MAX)),
            end_timestamp_ms=draw.integer(0, 0, (-1, 1, now_ms, INT64_MAX)),
            max_messages=draw.integer(
                0, 20, (-1, INDEX_MAX_RESULTS, INDEX_MAX_RESULTS + 1, INT32_MAX, INT32_MIN)
            ),
        )
        got = call(
            "index.QueryByKey", lambda: self.stub.QueryByKey(request, timeout=CALL_TIMEOUT_S)
        )
        if isinstance(got, Failed):
            return
        cap = min(request.max_messages or INDEX_DEFAULT_RESULTS, INDEX_MAX_RESULTS)
        n = len(got.messages)
        check(n <= cap, "index.QueryByKey.over-cap", f"{n} messages, cap {cap}")
        offsets = [m.commit_log_offset for m in got.messages]
        check(
            offsets == sorted(offsets, reverse=True) and len(set(offsets)) == n,
            "index.QueryByKey.order",
            f"{offsets}",
        )
        for m in got.messages:
            check(
                m.topic == request.topic and request.key in m.keys.split(" "),
                "index.QueryByKey.wrong-message",
                f"asked {request.topic}/{request.key!r}, got {m.topic}/{m.keys!r}",
            )

    def query_by_uniq_key(self, draw: Draw) -> None:
        request = pb.QueryByUniqKeyRequest(
            topic=self.draw_topic(draw), uniq_key=self.draw_key(draw, uniq=True)
        )
        got = call(
            "index.QueryByUniqKey",
            lambda: self.stub.QueryByUniqKey(request, timeout=CALL_TIMEOUT_S),
        )
        if isinstance(got, Failed):
            return
        for m in got.messages:
            check(
                m.topic == request.topic and m.uniq_key == request.uniq_key,
                "index.QueryByUniqKey.wrong-message",
                f"asked {request.topic}/{request.uniq_key!r}, got {m.topic}/{m.uniq_key!r}",
            )

    def get_status(self, draw: Draw) -> None:
        call(
            "index.GetStatus",
            lambda: self.stub.GetStatus(pb.GetStatusRequest(), timeout=CALL_TIMEOUT_S),
        )

    def raw(self, draw: Draw) -> None:
        method = draw.choice(RAW_METHODS)
        payload = draw.rest()
        send = raw_unary(self.channel, SERVICE, method)
        call(f"index.raw.{method}", lambda: send(payload, timeout=CALL_TIMEOUT_S))


def setup() -> Callable[[bytes], None]:
    return IndexApi(shared_stack()).one_input


def seeds() -> list[bytes]:
    return [bytes([0, 0, 0, 0]), bytes([2, 0, 0, 5])]
