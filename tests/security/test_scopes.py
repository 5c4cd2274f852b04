"""Bearer tokens against the real services: a missing, wrong or malformed token is
UNAUTHENTICATED; a valid token outside its scopes is PERMISSION_DENIED, for every class of
method; a request naming a forbidden topic is refused whole, and nothing of it is stored."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mqstore.rpc.channel import make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2 as ix
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from mqstore.testing.cluster import Cluster

from .conftest import Material

pytestmark = pytest.mark.timeout(60)
OK = grpc.StatusCode.OK
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
CALL_TIMEOUT_S = 10.0
WAIT_S = 20.0
T = CALL_TIMEOUT_S


class Stubs:
    """Stubs of the three services over mutual TLS, with one token (or none) on every call."""

    def __init__(self, cluster: Cluster, material: Material, token: str | None) -> None:
        security = material.security(token=token)
        self._channels = [
            make_channel(cluster.commitlog.target, security),
            make_channel(cluster.followers["cq"].target, security),
            make_channel(cluster.followers["index"].target, security),
        ]
        self.commitlog = commitlog_pb2_grpc.CommitLogStub(self._channels[0])
        self.cq = consumequeue_pb2_grpc.ConsumeQueueStub(self._channels[1])
        self.index = index_pb2_grpc.IndexStub(self._channels[2])
        self.reflection = reflection_pb2_grpc.ServerReflectionStub(self._channels[0])

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


@pytest.fixture(scope="module")
def stubs(secure_cluster: Cluster, material: Material) -> Iterator[Callable[[str | None], Stubs]]:
    made: dict[str | None, Stubs] = {}

    def get(name: str | None) -> Stubs:
        if name not in made:
            token = material.tokens.get(name, name) if name else None
            made[name] = Stubs(secure_cluster, material, token)
        return made[name]

    yield get
    for s in made.values():
        s.close()


def code_of(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        result = call()
        if isinstance(result, Iterator):
            for _ in result:
                pass
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return OK


def append_request(*topics: str) -> cl.AppendRequest:
    return cl.AppendRequest(
        batches=[cl.MessageBatch(topic=t, queue_ids=[0], bodies=[b"body"]) for t in topics]
    )


def max_offset(stubs: Stubs) -> int:
    return stubs.commitlog.GetStatus(cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S).max_offset


# -- who you are ----------------------------------------------------------------------------------


@pytest.mark.parametrize("service", ["commitlog", "cq", "index"])
def test_no_token_is_unauthenticated_on_every_service(
    stubs: Callable[[str | None], Stubs], service: str
) -> None:
    stub = getattr(stubs(None), service)
    request = {"commitlog": cl, "cq": cq, "index": ix}[service].GetStatusRequest()
    assert code_of(lambda: stub.GetStatus(request, timeout=CALL_TIMEOUT_S)) == UNAUTHENTICATED
    assert (
        code_of(
            lambda: getattr(stubs("no-scopes"), service).GetStatus(request, timeout=CALL_TIMEOUT_S)
        )
        == OK
    )


def test_a_wrong_token_is_unauthenticated(
    stubs: Callable[[str | None], Stubs], material: Material
) -> None:
    near_miss = material.tokens["admin"][:-1] + (
        "A" if material.tokens["admin"][-1] != "A" else "B"
    )
    for token in (near_miss, "x", "y" * 2000):
        s = stubs(token)
        assert code_of(lambda s=s: max_offset(s)) == UNAUTHENTICATED
        assert code_of(
            lambda s=s: s.commitlog.Append(append_request("orders"), timeout=CALL_TIMEOUT_S)
        ) == (UNAUTHENTICATED)


def test_an_expired_token_is_unauthenticated(stubs: Callable[[str | None], Stubs]) -> None:
    s = stubs("expired-admin")
    with pytest.raises(grpc.RpcError) as caught:
        max_offset(s)
    assert caught.value.code() == UNAUTHENTICATED
    assert "expired" in (caught.value.details() or "")


@pytest.mark.parametrize(
    "header",
    [
        "Basic {token}",
        "{token}",
        "Bearer",
        "Bearer {token} extra",
        "Bearer  {token}",
        "Token {token}",
    ],
)
def test_a_malformed_authorization_header_is_unauthenticated(
    stubs: Callable[[str | None], Stubs], material: Material, header: str
) -> None:
    value = header.format(token=material.tokens["admin"])
    stub = stubs(None).commitlog
    code = code_of(
        lambda: stub.GetStatus(
            cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S, metadata=[("authorization", value)]
        )
    )
    assert code == UNAUTHENTICATED


def test_two_authorization_headers_are_unauthenticated(
    stubs: Callable[[str | None], Stubs], material: Material
) -> None:
    good = "Bearer " + material.tokens["admin"]
    stub = stubs(None).commitlog
    code = code_of(
        lambda: stub.GetStatus(
            cl.GetStatusRequest(),
            timeout=CALL_TIMEOUT_S,
            metadata=[("authorization", good), ("authorization", good)],
        )
    )
    assert code == UNAUTHENTICATED


def test_the_scheme_is_case_insensitive(
    stubs: Callable[[str | None], Stubs], material: Material
) -> None:
    value = "bearer " + material.tokens["no-scopes"]
    stub = stubs(None).commitlog
    assert (
        code_of(
            lambda: stub.GetStatus(
                cl.GetStatusRequest(), timeout=CALL_TIMEOUT_S, metadata=[("authorization", value)]
            )
        )
        == OK
    )


# -- what you may do ------------------------------------------------------------------------------

# (token, call) -> expected code. Each refused call has a granted twin with the other token or
# topic, so a refusal cannot come from something other than the scope.
CASES: list[tuple[str, str, Callable[[Stubs], Any], grpc.StatusCode]] = [
    ("produce another topic", "orders-producer",
     lambda s: s.commitlog.Append(append_request("payments"), timeout=T), DENIED),
    ("produce own topic", "orders-producer",
     lambda s: s.commitlog.Append(append_request("orders-scopes"), timeout=T), OK),
    ("consume cannot produce", "orders-consumer",
     lambda s: s.commitlog.Append(append_request("orders-scopes"), timeout=T), DENIED),
    ("consume another topic", "orders-consumer",
     lambda s: s.cq.Pull(cq.PullRequest(topic="payments", queue_id=0), timeout=T), DENIED),
    ("consume own topic", "orders-consumer",
     lambda s: s.cq.Pull(cq.PullRequest(topic="orders-scopes", queue_id=0), timeout=T), OK),
    ("produce cannot consume", "orders-producer",
     lambda s: s.cq.Pull(cq.PullRequest(topic="orders-scopes", queue_id=0), timeout=T), DENIED),
    ("stream another topic", "orders-consumer",
     lambda s: list(s.cq.PullStream(
         cq.PullStreamRequest(pull=cq.PullRequest(topic="payments", queue_id=0)), timeout=T
     )), DENIED),
    ("stream own topic", "orders-consumer",
     lambda s: list(s.cq.PullStream(
         cq.PullStreamRequest(pull=cq.PullRequest(topic="orders-scopes", queue_id=0)), timeout=T
     )), OK),
    ("follow another topic among own", "orders-consumer",
     lambda s: list(s.cq.Follow(cq.FollowRequest(pulls=[
         cq.PullRequest(topic="orders-scopes", queue_id=0),
         cq.PullRequest(topic="payments", queue_id=0),
     ]), timeout=T)), DENIED),
    ("follow own topics", "orders-consumer",
     lambda s: list(s.cq.Follow(cq.FollowRequest(pulls=[
         cq.PullRequest(topic="orders-scopes", queue_id=0),
         cq.PullRequest(topic="orders-scopes", queue_id=1),
     ]), timeout=T)), OK),
    ("commit offsets of another topic", "orders-consumer",
     lambda s: s.cq.CommitOffset(
         cq.CommitOffsetRequest(group="g", topic="payments", queue_id=0, offset=0), timeout=T
     ), DENIED),
    ("list queues of another topic", "orders-consumer",
     lambda s: s.cq.ListQueues(cq.ListQueuesRequest(topic="payments"), timeout=T), DENIED),
    ("query keys of another topic", "orders-consumer",
     lambda s: s.index.QueryByKey(ix.QueryByKeyRequest(topic="payments", key="k"), timeout=T),
     DENIED),
    ("query keys of own topic", "orders-consumer",
     lambda s: s.index.QueryByKey(ix.QueryByKeyRequest(topic="orders-x", key="k"), timeout=T),
     OK),
    ("read by offset needs consume:*", "orders-consumer",
     lambda s: s.commitlog.Read(cl.ReadRequest(), timeout=T), DENIED),
    ("read by offset with consume:*", "reader-all",
     lambda s: s.commitlog.Read(cl.ReadRequest(), timeout=T), OK),
    ("subscribe without the scope", "reader-all",
     lambda s: s.commitlog.Subscribe(cl.SubscribeRequest(subscriber_id="intruder"), timeout=T),
     DENIED),
    ("confirm without the scope", "reader-all",
     lambda s: s.commitlog.Confirm(cl.ConfirmRequest(subscriber_id="cq"), timeout=T), DENIED),
    ("list topics without admin", "orders-consumer",
     lambda s: s.cq.ListTopics(cq.ListTopicsRequest(), timeout=T), DENIED),
    ("list topics without any scope", "no-scopes",
     lambda s: s.cq.ListTopics(cq.ListTopicsRequest(), timeout=T), DENIED),
    ("list topics as admin", "admin",
     lambda s: s.cq.ListTopics(cq.ListTopicsRequest(), timeout=T), OK),
    ("status with any valid token", "no-scopes",
     lambda s: s.index.GetStatus(ix.GetStatusRequest(), timeout=T), OK),
]  # fmt: skip


@pytest.mark.parametrize(
    ("token", "call", "expected"),
    [(token, call, code) for _, token, call, code in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_token_does_what_its_scopes_say(
    stubs: Callable[[str | None], Stubs],
    token: str,
    call: Callable[[Stubs], Any],
    expected: grpc.StatusCode,
) -> None:
    assert code_of(lambda: call(stubs(token))) == expected


def test_reflection_needs_a_valid_token_and_no_scope(stubs: Callable[[str | None], Stubs]) -> None:
    def list_services(s: Stubs) -> list[str]:
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = s.reflection.ServerReflectionInfo(iter([request]), timeout=CALL_TIMEOUT_S)
        return [svc.name for r in responses for svc in r.list_services_response.service]

    assert "mqstore.commitlog.v1.CommitLog" in list_services(stubs("no-scopes"))
    assert code_of(lambda: list_services(stubs(None))) == UNAUTHENTICATED


# -- requests refused whole -----------------------------------------------------------------------


def test_a_batch_mixing_an_allowed_and_a_forbidden_topic_is_refused_whole(
    stubs: Callable[[str | None], Stubs],
) -> None:
    admin = stubs("admin")
    before = max_offset(admin)
    mixed = append_request("orders-mixed", "payments")
    assert (
        code_of(lambda: stubs("orders-producer").commitlog.Append(mixed, timeout=CALL_TIMEOUT_S))
        == DENIED
    )
    assert max_offset(admin) == before
    queues = admin.cq.ListQueues(cq.ListQueuesRequest(topic="orders-mixed"), timeout=CALL_TIMEOUT_S)
    assert list(queues.queues) == []
    assert code_of(lambda: admin.commitlog.Append(mixed, timeout=CALL_TIMEOUT_S)) == OK  # the twin
    assert max_offset(admin) > before


def test_an_append_stream_answers_up_to_the_first_forbidden_request_and_ends_there(
    stubs: Callable[[str | None], Stubs],
) -> None:
    admin = stubs("admin")
    before = max_offset(admin)
    requests = [
        append_request("orders-stream"),
        append_request("orders-stream", "payments"),  # refused whole
        append_request("orders-stream"),  # never read
    ]
    for sequence, request in enumerate(requests, 1):
        request.producer_id, request.sequence = "stream-scopes", sequence
    answers: list[cl.AppendResponse] = []
    call = stubs("orders-producer").commitlog.AppendStream(iter(requests), timeout=CALL_TIMEOUT_S)
    with pytest.raises(grpc.RpcError) as caught:
        for answer in call:
            answers.append(answer)
    assert caught.value.code() == DENIED
    assert "payments" in (caught.value.details() or "")
    assert [list(a.statuses) for a in answers] == [[cl.PUT_OK]]
    assert max_offset(admin) - before == answers[0].sizes[0]  # its record, nothing else

    def dispatched() -> int:
        stored = admin.cq.ListQueues(
            cq.ListQueuesRequest(topic="orders-stream"), timeout=CALL_TIMEOUT_S
        )
        return sum(q.max_offset for q in stored.queues)

    deadline = time.monotonic() + WAIT_S
    while dispatched() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dispatched() == 1
