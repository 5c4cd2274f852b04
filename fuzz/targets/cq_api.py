"""cq_svc's request validators: fuzzed requests to a live service following a live commit log.

Input: a method selector, then the request drawn field by field (or raw bytes). Rules, beyond
"an answer or a typed status" (api.py):

    Pull          as many records as queue offsets, at most the capped max_messages, over
                  max_bytes only when it is one record; each record is a whole record of the
                  asked topic and queue at its queue offset, offsets ascending from the asked
                  one, and of an asked tag when tags filter
    Follow        every answer names one of the asked pulls (pull_index) and holds, like a Pull,
                  whole records of that pull's topic and queue, offsets ascending across the
                  answers of each pull
    Receive       one handle and delivery count per record, each handle issued for that queue
                  and offset; at most the capped max_messages
    GetQueueInfo  0 <= min <= max; ListQueues names only the asked topic
    CommitOffset, Ack, ChangeInvisibleDuration
                  refused: no group's committed offset moved
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from cq_svc import receipts
from fuzz.draw import INT32_MAX, INT32_MIN, INT64_MAX, Draw
from fuzz.findings import check
from fuzz.services import QUEUES, RETRY_TOPIC, TAGS, TOPIC, Stack
from fuzz.targets.api import CALL_TIMEOUT_S, Failed, call, raw_unary, shared_stack
from mqstore.formats.properties import TAGS as TAGS_KEY
from mqstore.formats.record import Record, read_record
from mqstore.formats.record_columns import split_records
from mqstore.limits import GROUP_CHARS_MAX, MessageLimits
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as pb

DESCRIPTION = (
    "fuzzed requests to every ConsumeQueue method of a live service: a typed status or a "
    "sound answer; a refused commit or ack moves no offset"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore", "cq_svc")

SERVICE = "mqstore.consumequeue.v1.ConsumeQueue"
RAW_METHODS = ("Pull", "GetOffsetByTime", "GetQueueInfo", "CommitOffset", "Receive", "Ack")
LIMITS = MessageLimits()
GROUPS = ("g1", "g2")
HANDLES_KEPT = 16
NAME_RULE = re.compile(r"[%|a-zA-Z0-9_-]+")


class CqApi:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.stub = stack.queues
        self.channel = stack.raw_channel("cq")
        assert stack.cq is not None
        self.engine = stack.cq.engine
        self.settings = stack.cq.settings
        # Handles the service issued, for acks and changes that may well succeed.
        self.handles: list[tuple[str, str, int, str]] = []
        self.methods: tuple[Callable[[Draw], None], ...] = (
            self.pull,
            self.pull,
            self.follow,
            self.get_offset_by_time,
            self.get_queue_info,
            self.list_queues,
            self.list_topics,
            self.commit_offset,
            self.fetch_offset,
            self.receive,
            self.ack,
            self.change_invisible_duration,
            self.get_status,
            self.raw,
        )

    def one_input(self, data: bytes) -> None:
        draw = Draw(data)
        draw.choice(self.methods)(draw)

    # -- drawing --------------------------------------------------------------------------------

    def draw_topic(self, draw: Draw) -> str:
        k = draw.byte() % 5
        if k <= 1:
            return TOPIC
        if k == 2:
            return draw.choice((RETRY_TOPIC, "Unknown"))
        return draw.text(140, (LIMITS.topic_bytes_max, LIMITS.topic_bytes_max + 1, 0))

    def draw_queue(self, draw: Draw) -> int:
        edges = (-1, LIMITS.queue_id_max, LIMITS.queue_id_max + 1, INT32_MAX, INT32_MIN)
        return draw.integer(0, QUEUES, edges)

    def draw_group(self, draw: Draw) -> str:
        if draw.byte() % 4:
            return draw.choice(GROUPS)
        return draw.text(260, (GROUP_CHARS_MAX, GROUP_CHARS_MAX + 1, 0))

    def offsets_now(self) -> dict[tuple[str, str, int], int]:
        return dict(self.engine.offsets.items())

    # -- methods --------------------------------------------------------------------------------

    def pull(self, draw: Draw) -> None:
        s = self.settings
        tags: list[str] = []
        for _ in range(draw.integer(0, 3, (s.tags_max, s.tags_max + 1))):
            tags.append(
                draw.choice((*TAGS, "*", "", " a ", "zz")) if draw.boolean() else draw.text(5)
            )
        request = pb.PullRequest(
            topic=self.draw_topic(draw),
            queue_id=self.draw_queue(draw),
            offset=draw.integer(0, 12, (-1, INT64_MAX)),
            max_messages=draw.integer(
                0, 40, (-1, s.pull_messages_max, s.pull_messages_max + 1, INT32_MAX)
            ),
            max_bytes=draw.integer(0, 800, (-1, s.pull_bytes_max, s.pull_bytes_max + 1, INT32_MAX)),
            tags=tags,
            long_poll_ms=draw.integer(0, 0, (-1, 5, INT32_MAX)),
        )
        got = call("cq.Pull", lambda: self.stub.Pull(request, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed):
            return
        raws = _raws_of(got)
        n = len(raws)
        check(n == len(got.queue_offsets), "cq.Pull.answer-shape", f"{n} records")
        if n:
            check(got.status == pb.FOUND, "cq.Pull.records-without-found", str(got.status))
        cap = min(request.max_messages, s.pull_messages_max) or s.pull_messages_default
        check(n <= cap, "cq.Pull.over-max-messages", f"{n} records, cap {cap}")
        byte_cap = min(request.max_bytes, s.pull_bytes_max) or s.pull_bytes_default
        total = sum(len(r) for r in raws)
        check(
            n <= 1 or total <= max(byte_cap, 100),
            "cq.Pull.over-max-bytes",
            f"{n} records of {total} bytes, cap {byte_cap}",
        )
        names = {t.strip() for t in tags} - {""}
        filtered = bool(names) and "*" not in names
        records, _ = _records_of("cq.Pull", request, raws, got.queue_offsets, request.offset - 1)
        if filtered:
            for record in records:
                tag = record.properties_dict().get(TAGS_KEY, "")
                check(tag in names, "cq.Pull.tag-filter", f"tag {tag!r} not in {names}")

    def follow(self, draw: Draw) -> None:
        s = self.settings
        pulls = [
            pb.PullRequest(
                topic=self.draw_topic(draw),
                queue_id=self.draw_queue(draw),
                offset=draw.integer(0, 12, (-1, INT64_MAX)),
                max_messages=draw.integer(0, 40, (-1, s.pull_messages_max + 1, INT32_MAX)),
            )
            for _ in range(draw.integer(0, 4, (s.follow_queues_max + 1,)))
        ]
        request = pb.FollowRequest(
            pulls=pulls,
            long_poll_ms=draw.integer(0, 5, (-1, INT32_MAX)),
            max_batches=draw.integer(0, 8, (-1, INT32_MAX)),
        )
        got = call(
            "cq.Follow",
            lambda: [
                answer
                for message in self.stub.Follow(request, timeout=CALL_TIMEOUT_S)
                for answer in message.answers
            ],
        )
        if isinstance(got, Failed):
            return
        previous = {i: p.offset - 1 for i, p in enumerate(pulls)}
        for answer in got:
            i = answer.pull_index
            check(0 <= i < len(pulls), "cq.Follow.pull-index", f"{i} of {len(pulls)}")
            asked = pulls[i]
            raws = _raws_of(answer)
            check(len(raws) == len(answer.queue_offsets), "cq.Follow.answer-shape", str(i))
            _, previous[i] = _records_of(
                "cq.Follow", asked, raws, answer.queue_offsets, previous[i]
            )

    def get_offset_by_time(self, draw: Draw) -> None:
        request = pb.GetOffsetByTimeRequest(
            topic=self.draw_topic(draw),
            queue_id=self.draw_queue(draw),
            timestamp_ms=draw.integer(0, 1 << 42, (-1, INT64_MAX)),
            boundary=draw.integer(0, 1, (2, -1, INT32_MAX)),  # type: ignore[arg-type]
        )
        got = call(
            "cq.GetOffsetByTime",
            lambda: self.stub.GetOffsetByTime(request, timeout=CALL_TIMEOUT_S),
        )
        if not isinstance(got, Failed):
            check(got.offset >= 0, "cq.GetOffsetByTime.negative", str(got.offset))

    def get_queue_info(self, draw: Draw) -> None:
        request = pb.GetQueueInfoRequest(
            topic=self.draw_topic(draw), queue_id=self.draw_queue(draw)
        )
        got = call(
            "cq.GetQueueInfo", lambda: self.stub.GetQueueInfo(request, timeout=CALL_TIMEOUT_S)
        )
        if not isinstance(got, Failed):
            check(
                0 <= got.min_offset <= got.max_offset
                and (got.topic, got.queue_id) == (request.topic, request.queue_id),
                "cq.GetQueueInfo.answer",
                str(got),
            )

    def list_queues(self, draw: Draw) -> None:
        request = pb.ListQueuesRequest(topic=self.draw_topic(draw))
        got = call("cq.ListQueues", lambda: self.stub.ListQueues(request, timeout=CALL_TIMEOUT_S))
        if not isinstance(got, Failed):
            check(
                all(q.topic == request.topic for q in got.queues),
                "cq.ListQueues.other-topic",
                str(got),
            )

    def list_topics(self, draw: Draw) -> None:
        call(
            "cq.ListTopics",
            lambda: self.stub.ListTopics(pb.ListTopicsRequest(), timeout=CALL_TIMEOUT_S),
        )

    def commit_offset(self, draw: Draw) -> None:
        request = pb.CommitOffsetRequest(
            group=self.draw_group(draw),
            topic=self.draw_topic(draw),
            queue_id=self.draw_queue(draw),
            offset=draw.integer(0, 30, (-1, INT64_MAX)),
        )
        before = self.offsets_now()
        got = call(
            "cq.CommitOffset", lambda: self.stub.CommitOffset(request, timeout=CALL_TIMEOUT_S)
        )
        if isinstance(got, Failed):
            self.check_unchanged("cq.CommitOffset", before)
            return
        # RocketMQ's group rule (the topic pattern, matched whole), written independently.
        check(
            NAME_RULE.fullmatch(request.group) is not None
            and NAME_RULE.fullmatch(request.topic) is not None,
            "cq.CommitOffset.name-outside-pattern-accepted",
            f"group {request.group!r}, topic {request.topic!r}",
        )

    def check_unchanged(self, where: str, before: dict[tuple[str, str, int], int]) -> None:
        after = self.offsets_now()
        moved = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
        check(not moved, f"{where}.partial-write", f"refused, yet offsets moved: {moved}")

    def fetch_offset(self, draw: Draw) -> None:
        request = pb.FetchOffsetRequest(
            group=self.draw_group(draw), topic=self.draw_topic(draw), queue_id=self.draw_queue(draw)
        )
        got = call("cq.FetchOffset", lambda: self.stub.FetchOffset(request, timeout=CALL_TIMEOUT_S))
        if not isinstance(got, Failed):
            check(got.offset >= -1, "cq.FetchOffset.range", str(got.offset))

    def receive(self, draw: Draw) -> None:
        s = self.settings
        request = pb.ReceiveRequest(
            group=self.draw_group(draw),
            topic=self.draw_topic(draw),
            queue_id=self.draw_queue(draw),
            max_messages=draw.integer(
                0, 6, (-1, s.receive_messages_max, s.receive_messages_max + 1)
            ),
            invisible_duration_ms=draw.integer(
                0, 100, (-1, s.invisible_max_ms, s.invisible_max_ms + 1, INT32_MAX)
            ),
            long_poll_ms=draw.integer(0, 0, (-1, 5)),
        )
        before = self.offsets_now()
        got = call("cq.Receive", lambda: self.stub.Receive(request, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed):
            self.check_unchanged("cq.Receive", before)
            return
        raws = _raws_of(got)
        n = len(raws)
        shape = {len(got.queue_offsets), len(got.receipt_handles), len(got.delivery_counts)}
        check(shape <= {n}, "cq.Receive.answer-shape", f"{n} records, columns {shape}")
        cap = min(request.max_messages, s.receive_messages_max) or s.receive_messages_default
        check(n <= cap, "cq.Receive.over-max-messages", f"{n} records, cap {cap}")
        for raw, offset, handle, count in zip(
            raws, got.queue_offsets, got.receipt_handles, got.delivery_counts, strict=True
        ):
            record = read_record(raw, 0, len(raw))
            check(
                isinstance(record, Record)
                and record.topic == request.topic
                and record.queue_id == request.queue_id
                and record.queue_offset == offset,
                "cq.Receive.wrong-record",
                f"asked {request.topic}/{request.queue_id}@{offset}, got {record}",
            )
            decoded = receipts.decode(handle, request.group, request.topic, request.queue_id)
            check(decoded == (offset, count), "cq.Receive.handle", f"{decoded} != {offset, count}")
            self.handles.append((request.group, request.topic, request.queue_id, handle))
        del self.handles[:-HANDLES_KEPT]

    def draw_handle(self, draw: Draw) -> tuple[str, str, int, str]:
        if self.handles and draw.boolean():
            group, topic, queue_id, handle = draw.choice(self.handles)
            if draw.byte() % 4 == 0:
                chars = list(handle)
                chars[draw.integer(0, len(chars) - 1)] = draw.text(1) or "A"
                handle = "".join(chars)
            return group, topic, queue_id, handle
        group, topic = self.draw_group(draw), self.draw_topic(draw)
        queue_id = self.draw_queue(draw)
        if draw.boolean():
            offset = draw.integer(0, 12, (-1, INT64_MAX))
            return (
                group,
                topic,
                queue_id,
                receipts.encode(
                    group, topic, queue_id, offset, draw.integer(0, 3, (INT32_MAX, INT32_MIN))
                ),
            )
        return group, topic, queue_id, draw.text(30, (22, 23, 24))

    def ack(self, draw: Draw) -> None:
        group, topic, queue_id, handle = self.draw_handle(draw)
        handles = [handle]
        for _ in range(draw.integer(0, 2)):
            handles.append(self.draw_handle(draw)[3])
        request = pb.AckRequest(
            group=group, topic=topic, queue_id=queue_id, receipt_handles=handles
        )
        before = self.offsets_now()
        got = call("cq.Ack", lambda: self.stub.Ack(request, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed):
            self.check_unchanged("cq.Ack", before)

    def change_invisible_duration(self, draw: Draw) -> None:
        group, topic, queue_id, handle = self.draw_handle(draw)
        s = self.settings
        request = pb.ChangeInvisibleDurationRequest(
            group=group,
            topic=topic,
            queue_id=queue_id,
            receipt_handle=handle,
            invisible_duration_ms=draw.integer(0, 100, (-1, s.invisible_max_ms + 1, INT32_MAX)),
        )
        before = self.offsets_now()
        got = call(
            "cq.ChangeInvisibleDuration",
            lambda: self.stub.ChangeInvisibleDuration(request, timeout=CALL_TIMEOUT_S),
        )
        if isinstance(got, Failed):
            self.check_unchanged("cq.ChangeInvisibleDuration", before)

    def get_status(self, draw: Draw) -> None:
        call(
            "cq.GetStatus",
            lambda: self.stub.GetStatus(pb.GetStatusRequest(), timeout=CALL_TIMEOUT_S),
        )

    def raw(self, draw: Draw) -> None:
        method = draw.choice(RAW_METHODS)
        payload = draw.rest()
        send = raw_unary(self.channel, SERVICE, method)
        call(f"cq.raw.{method}", lambda: send(payload, timeout=CALL_TIMEOUT_S))


def setup() -> Callable[[bytes], None]:
    return CqApi(shared_stack()).one_input


def seeds() -> list[bytes]:
    return [bytes([0, 0, 0, 0, 0, 0, 0]), bytes([8, 0, 0, 0, 0, 3]), bytes([9, 1, 0, 0])]


def _raws_of(answer: pb.PullResponse | pb.ReceiveResponse) -> list[bytes]:
    """An answer's records, one bytes each: its blob cut by its sizes, which must add up."""
    total = sum(answer.record_sizes)
    check(
        total == len(answer.records_blob),
        "cq.answer-blob-shape",
        f"sizes adding up to {total} for a {len(answer.records_blob)}-byte blob",
    )
    return split_records(answer.records_blob[:total], answer.record_sizes)


def _records_of(
    where: str,
    asked: pb.PullRequest,
    raws: Sequence[bytes],
    queue_offsets: Sequence[int],
    after: int,
) -> tuple[list[Record], int]:
    """Each raw record whole, of the asked topic and queue at its queue offset, the offsets
    ascending past `after`: the records, and the last offset (`after` when there are none)."""
    records = []
    previous = after
    for raw, queue_offset in zip(raws, queue_offsets, strict=True):
        record = read_record(raw, 0, len(raw))
        check(
            isinstance(record, Record)
            and record.topic == asked.topic
            and record.queue_id == asked.queue_id
            and record.queue_offset == queue_offset,
            f"{where}.wrong-record",
            f"asked {asked.topic}/{asked.queue_id}@{queue_offset}, got {record}",
        )
        assert isinstance(record, Record)
        check(queue_offset > previous, f"{where}.offsets-order", f"{list(queue_offsets)}")
        previous = queue_offset
        records.append(record)
    return records, previous
