"""commitlog_svc's request validators: fuzzed requests to a live service in this process.

Input: a method selector, then the request drawn field by field (or, in raw mode, the request
bytes as they are). Rules, beyond "an answer or a typed status" (api.py):

    Append / AppendStream  one status, offset, size and queue offset per message, or (a stream's
                           malformed request) an INVALID_ARGUMENT error alone; a refused
                           request, or a request whose messages were all refused, leaves the
                           log's end where it was; otherwise the log ends where the last stored
                           record ends, and each stored record holds what was sent
    Read                   one record and one status per range; a READ_OK record is the whole
                           record that starts at the asked offset
    GetMessage             the message found is the one the msg id names
    Subscribe              the first frame is a handshake whose start lies in [min, max]; the
                           first batch names no corrupt range (the stack's log has none)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import grpc

from fuzz.draw import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT64_MAX, Draw
from fuzz.findings import Finding, check
from fuzz.services import RETRY_TOPIC, TOPIC, Stack
from fuzz.targets.api import (
    CALL_TIMEOUT_S,
    Failed,
    call,
    raw_unary,
    replace_shared_stack,
    shared_stack,
)
from mqstore.formats.msgid import offset_msg_id
from mqstore.formats.properties import encode_properties
from mqstore.formats.record import Record, read_record
from mqstore.formats.record_columns import split_records
from mqstore.limits import MessageLimits
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb

DESCRIPTION = (
    "fuzzed requests to every CommitLog method of a live service: a typed status or a sound "
    "answer; a refused append leaves the log unchanged"
)
# Packages atheris instruments for coverage (fuzz/engine.py).
INSTRUMENT = ("mqstore", "commitlog_svc")

SERVICE = "mqstore.commitlog.v1.CommitLog"
RAW_METHODS = ("Append", "Read", "GetMessage", "Confirm", "GetStatus")
LIMITS = MessageLimits()
# A fresh stream of a fuzzed subscriber: how long to wait for its first frame.
SUBSCRIBE_WAIT_S = 5.0
SUBSCRIBERS = ("fz-a", "fz-b")
# The rule a topic name follows, written independently of mqstore.limits.TOPIC_PATTERN.
TOPIC_RULE = re.compile(r"[%|a-zA-Z0-9_-]+")

# A malformed request's code in an AppendStream answer (AppendResponse.error).
INVALID_ARGUMENT_CODE = grpc.StatusCode.INVALID_ARGUMENT.value[0]


class CommitLogApi:
    """`renew` replaces a stack an input broke (a finding) with a fresh, seeded one."""

    def __init__(self, stack: Stack, renew: Callable[[], Stack]) -> None:
        self.renew = renew
        self.use(stack)
        self.methods: tuple[Callable[[Draw], None], ...] = (
            self.append,
            self.append,
            self.append_stream,
            self.read,
            self.get_message,
            self.subscribe,
            self.confirm,
            self.get_status,
            self.raw,
        )

    def use(self, stack: Stack) -> None:
        self.stack = stack
        self.stub = stack.log
        self.channel = stack.raw_channel("commitlog")

    def one_input(self, data: bytes) -> None:
        draw = Draw(data)
        draw.choice(self.methods)(draw)
        self.check_alive()

    def check_alive(self) -> None:
        """No input may stop the store. A checkpoint runs every 200 ms on the flush thread, so
        the input that broke it may be a few before the one that sees it; the store is rebuilt
        so that the run goes on."""
        if self.stack.engine.flush_alive:
            return
        self.use(self.renew())
        raise Finding("commitlog.store-stopped", "the flush thread failed (its error is logged)")

    # -- drawing requests -----------------------------------------------------------------------

    def draw_topic(self, draw: Draw) -> str:
        k = draw.byte() % 6
        if k == 0:
            return TOPIC
        if k == 1:
            return RETRY_TOPIC
        if k == 2:
            return "Fz"
        edges = (LIMITS.topic_bytes_max, LIMITS.topic_bytes_max + 1, 0)
        if k == 3:
            return "%RETRY%" + draw.text(260, (248, 249))
        return draw.text(140, edges)

    def draw_properties(self, draw: Draw) -> bytes:
        k = draw.byte() % 8
        if k <= 3:
            pairs = {draw.text(6) or "K": draw.text(12) for _ in range(draw.integer(0, 3))}
            try:
                return encode_properties(pairs)
            except ValueError:
                return b""
        if k == 4:
            return b"MQS_PSEQ\x01p:1:1:0\x02"
        if k == 5:
            n = draw.choice((LIMITS.properties_bytes_max, LIMITS.properties_bytes_max + 1))
            return b"K\x01" + b"v" * (n - 3) + b"\x02"
        return draw.blob(40)

    def draw_batch(self, draw: Draw) -> pb.MessageBatch:
        n = draw.integer(1, 4, (0, 5))
        batch = pb.MessageBatch(topic=self.draw_topic(draw))
        lengths = [max(0, n + draw.choice((0, 0, 0, 0, 0, 0, 1, -1))) for _ in range(3)]
        for _ in range(lengths[0]):
            queue_edges = (-1, LIMITS.queue_id_max, LIMITS.queue_id_max + 1, INT32_MAX, INT32_MIN)
            batch.queue_ids.append(draw.integer(0, 3, queue_edges))
        # Bodies stay small: a 4 MiB body per input would slow the run a hundredfold, and its
        # edge is tests/fuzz/test_boundaries.py's.
        batch.bodies.extend(draw.blob(64) for _ in range(n))
        if draw.boolean():
            batch.properties.extend(self.draw_properties(draw) for _ in range(lengths[1]))
        if draw.byte() % 4 == 0:
            batch.sys_flags.extend(
                draw.integer(0, 0x7FF, (-1, INT32_MIN, 0x4, 0xC)) for _ in range(lengths[2])
            )
        batch.sys_flag = draw.integer(0, 0xF, (0x4, 0x8, 0xC, 0x30, -1))
        batch.flag = draw.integer(0, 3, (INT32_MAX, INT32_MIN))
        batch.born_timestamp_ms = draw.integer(0, 1 << 42, (-1, INT64_MAX, INT64_MIN))
        k = draw.byte() % 8
        if k == 5:
            batch.born_host = draw.choice(("10.1.2.3:7", "[::1]:65535", "1.2.3.4:65536"))
        elif k == 6:
            batch.born_host = draw.text(24)
        batch.reconsume_times = draw.integer(0, 3, (-1, INT32_MAX))
        batch.prepared_tx_offset = draw.integer(0, 9, (-1, INT64_MAX))
        return batch

    def draw_append(self, draw: Draw) -> pb.AppendRequest:
        request = pb.AppendRequest(
            batches=[self.draw_batch(draw) for _ in range(draw.integer(0, 3))]
        )
        if draw.byte() % 4 == 0:
            request.producer_id = (
                draw.choice(("p1", "p2")) if draw.boolean() else draw.text(260, (256, 257))
            )
            request.sequence = draw.integer(0, 20, (UINT64_MAX, 0))
        return request

    def draw_offset(self, draw: Draw) -> int:
        stored = self.stack.stored
        if draw.boolean():
            return draw.choice(stored).commit_log_offset + draw.choice((0, 0, 0, 1, -1))
        return draw.integer(0, 1 << 16, (-1, INT64_MAX, INT64_MIN, self.stack.engine.max_offset))

    # -- methods --------------------------------------------------------------------------------

    def append(self, draw: Draw) -> None:
        request = self.draw_append(draw)
        before = self.stack.engine.max_offset
        got = call("commitlog.Append", lambda: self.stub.Append(request, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed):
            self.check_unchanged("commitlog.Append", before)
            return
        self.check_answer("commitlog.Append", request, got, before)

    def append_stream(self, draw: Draw) -> None:
        requests = [self.draw_append(draw) for _ in range(draw.integer(1, 3))]
        before = self.stack.engine.max_offset
        answers: list[pb.AppendResponse] = []

        def run() -> None:
            answers.extend(self.stub.AppendStream(iter(requests), timeout=CALL_TIMEOUT_S))

        got = call("commitlog.AppendStream", run)
        end = before
        check(
            len(answers) <= len(requests),
            "commitlog.AppendStream.answer-count",
            f"{len(answers)} answers to {len(requests)} requests",
        )
        for request, answer in zip(requests, answers, strict=False):
            end = self.check_answer("commitlog.AppendStream", request, answer, end)
        self.check_unchanged("commitlog.AppendStream", end)
        if not isinstance(got, Failed):
            check(
                len(answers) == len(requests),
                "commitlog.AppendStream.answer-count",
                f"{len(answers)} answers to {len(requests)} requests",
            )

    def check_unchanged(self, where: str, end: int) -> None:
        now = self.stack.engine.max_offset
        check(now == end, f"{where}.partial-write", f"refused, yet the log went {end} -> {now}")

    def check_answer(
        self, where: str, request: pb.AppendRequest, answer: pb.AppendResponse, before: int
    ) -> int:
        """The rules for one answered append; returns where the log ends after it."""
        if answer.duplicate:
            # The first answer to this (producer id, sequence), whatever this request held:
            # nothing is stored again.
            return before
        if answer.HasField("error"):
            # A malformed request answered in its turn on a stream: nothing of it is stored.
            check(
                answer.error.code == INVALID_ARGUMENT_CODE and not answer.statuses,
                f"{where}.request-error",
                f"a request refused with code {answer.error.code} and "
                f"{len(answer.statuses)} statuses",
            )
            return before
        messages = [(b, i) for b in request.batches for i in range(len(b.bodies))]
        n = len(messages)
        shape = {
            len(answer.statuses),
            len(answer.commit_log_offsets),
            len(answer.sizes),
            len(answer.queue_offsets),
        }
        check(shape == {n}, f"{where}.answer-shape", f"columns {shape} for {n} messages")
        stored = [i for i, s in enumerate(answer.statuses) if s == pb.PUT_OK]
        for refusal in answer.refusals:
            if refusal.status in (pb.MESSAGE_ILLEGAL, pb.PROPERTIES_SIZE_EXCEEDED):
                check(bool(refusal.field), f"{where}.refusal-without-field", str(refusal))
        for i, status in enumerate(answer.statuses):
            if status != pb.PUT_OK:
                check(
                    answer.commit_log_offsets[i] == -1,
                    f"{where}.refused-with-offset",
                    f"message {i}: {status} at {answer.commit_log_offsets[i]}",
                )
        if not stored:
            if where.endswith(".Append"):
                self.check_unchanged(where, before)
            return before
        last = stored[-1]
        end = answer.commit_log_offsets[last] + answer.sizes[last]
        if where.endswith(".Append"):
            self.check_unchanged(where, end)
        for i in stored:
            batch, k = messages[i]
            # RocketMQ's TopicValidator matches the whole name (Java's matches()).
            check(
                TOPIC_RULE.fullmatch(batch.topic) is not None,
                f"{where}.topic-outside-pattern-stored",
                f"message {i}: topic {batch.topic!r} was stored",
            )
            record = self.stack.engine.read_record(answer.commit_log_offsets[i])
            check(
                record.topic == batch.topic
                and record.body == batch.bodies[k]
                and record.queue_id == batch.queue_ids[k]
                and record.total_size == answer.sizes[i],
                f"{where}.stored-differs",
                f"message {i}: sent {batch.topic}/{batch.queue_ids[k]}, stored {record}",
            )
        return end

    def read(self, draw: Draw) -> None:
        n = draw.integer(0, 4)
        offsets = [self.draw_offset(draw) for _ in range(n)]
        sizes = []
        for _ in range(max(0, n + draw.choice((0, 0, 0, 0, 1, -1)))):
            k = draw.byte() % 4
            if k == 0:
                sizes.append(0)
            elif k == 1:
                sizes.append(draw.choice(self.stack.stored).size)
            else:
                sizes.append(draw.integer(0, 300, (-1, INT32_MAX, INT32_MIN, 1 << 26)))
        request = pb.ReadRequest(offsets=offsets, sizes=sizes)
        got = call("commitlog.Read", lambda: self.stub.Read(request, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed):
            return
        check(
            len(got.record_sizes) == len(got.statuses) == n
            and sum(got.record_sizes) == len(got.records_blob),
            "commitlog.Read.answer-shape",
            f"{len(got.record_sizes)} sizes of a {len(got.records_blob)}-byte blob, "
            f"{len(got.statuses)} statuses for {n} ranges",
        )
        raws = split_records(got.records_blob, got.record_sizes)
        for offset, size, raw, status in zip(offsets, sizes, raws, got.statuses, strict=True):
            if status != pb.READ_OK:
                check(raw == b"", "commitlog.Read.bytes-without-ok", f"{status} at {offset}")
                continue
            record = read_record(raw, 0, len(raw), expected_offset=offset)
            check(
                isinstance(record, Record) and record.total_size == len(raw),
                "commitlog.Read.not-a-whole-record",
                f"READ_OK at {offset} (size {size}): {record}",
            )
            check(size in (0, len(raw)), "commitlog.Read.wrong-size", f"{len(raw)} != {size}")

    def get_message(self, draw: Draw) -> None:
        host = self.stack.engine.store_host
        k = draw.byte() % 4
        if k == 0:
            msg_id = offset_msg_id(host, draw.choice(self.stack.stored).commit_log_offset)
        elif k == 1:
            msg_id = offset_msg_id(host, self.draw_offset(draw) & INT64_MAX)
        elif k == 2:
            chars = list(offset_msg_id(host, draw.choice(self.stack.stored).commit_log_offset))
            chars[draw.integer(0, len(chars) - 1)] = draw.text(1) or "G"
            msg_id = "".join(chars)
        else:
            msg_id = draw.text(60, (32, 56))
        request = pb.GetMessageRequest(msg_id=msg_id)
        got = call(
            "commitlog.GetMessage", lambda: self.stub.GetMessage(request, timeout=CALL_TIMEOUT_S)
        )
        if not isinstance(got, Failed):
            check(
                got.msg_id.upper() == msg_id.upper(),
                "commitlog.GetMessage.other-message",
                f"asked {msg_id}, got {got.msg_id}",
            )

    def subscribe(self, draw: Draw) -> None:
        engine = self.stack.engine
        request = pb.SubscribeRequest(
            subscriber_id=draw.choice(SUBSCRIBERS)
            if draw.boolean()
            else draw.text(260, (256, 257)),
            store_id=engine.store_id if draw.boolean() else draw.blob(17, (16,)),
            confirmed_offset=draw.integer(0, engine.max_offset + 1, (-1, INT64_MAX)),
            max_batch_entries=draw.integer(0, 10, (-1, INT32_MAX, INT32_MIN)),
            max_batch_bytes=draw.integer(0, 5_000, (-1, INT32_MAX, INT32_MIN)),
            include_keys=draw.boolean(),
        )
        frames: list[pb.SubscribeResponse] = []

        def first() -> None:
            stream: Iterator[pb.SubscribeResponse] = self.stub.Subscribe(
                request, timeout=SUBSCRIBE_WAIT_S
            )
            try:
                frames.append(next(stream))
                hs = frames[0].handshake
                if frames[0].HasField("handshake") and hs.start_offset < hs.max_offset:
                    frames.append(next(stream))  # the first batch: it is there already
            finally:
                stream.cancel()  # type: ignore[attr-defined]

        got = call("commitlog.Subscribe", first)
        if isinstance(got, Failed) or not frames:
            return
        frame = frames[0]
        check(
            frame.WhichOneof("frame") == "handshake",
            "commitlog.Subscribe.no-handshake",
            str(frame),
        )
        hs = frame.handshake
        check(
            hs.min_offset <= hs.start_offset <= hs.max_offset,
            "commitlog.Subscribe.start-outside-log",
            str(hs),
        )
        for frame in frames[1:]:
            # The stack's log is intact: a corrupt range in a dispatch batch is a false alarm
            # (and a CRC-mismatch metric and an error line at the commit log).
            check(
                not frame.batch.corrupt_starts,
                "commitlog.Subscribe.false-corruption",
                f"confirmed offset {request.confirmed_offset} ({hs}): corrupt ranges "
                f"{list(zip(frame.batch.corrupt_starts, frame.batch.corrupt_ends, strict=False))}",
            )

    def confirm(self, draw: Draw) -> None:
        engine = self.stack.engine
        request = pb.ConfirmRequest(
            subscriber_id=draw.choice(SUBSCRIBERS)
            if draw.boolean()
            else draw.text(260, (256, 257)),
            store_id=engine.store_id if draw.boolean() else draw.blob(17, (16,)),
            confirmed_offset=draw.integer(0, engine.max_offset + 1, (-1, INT64_MAX)),
        )
        call("commitlog.Confirm", lambda: self.stub.Confirm(request, timeout=CALL_TIMEOUT_S))

    def get_status(self, draw: Draw) -> None:
        got = call(
            "commitlog.GetStatus",
            lambda: self.stub.GetStatus(pb.GetStatusRequest(), timeout=CALL_TIMEOUT_S),
        )
        if not isinstance(got, Failed):
            check(
                0 <= got.min_offset <= got.max_offset,
                "commitlog.GetStatus.bounds",
                str(got),
            )

    def raw(self, draw: Draw) -> None:
        method = draw.choice(RAW_METHODS)
        payload = draw.rest()
        before = self.stack.engine.max_offset
        send = raw_unary(self.channel, SERVICE, method)
        got = call(f"commitlog.raw.{method}", lambda: send(payload, timeout=CALL_TIMEOUT_S))
        if isinstance(got, Failed) and method == "Append":
            self.check_unchanged("commitlog.raw.Append", before)


def _renew_shared() -> Stack:
    replace_shared_stack()
    return shared_stack()


def setup() -> Callable[[bytes], None]:
    return CommitLogApi(shared_stack(), _renew_shared).one_input


def seeds() -> list[bytes]:
    return [bytes([0]) + bytes(range(40)), bytes([3, 1, 0]), bytes([8, 0]) + b"\x0a\x03\x0a\x01T"]
