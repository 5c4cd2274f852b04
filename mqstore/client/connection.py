"""Channels and stubs for the SDK: TLS or plaintext, the bearer token on every call, keepalive
suited to long polls, and errors turned into typed exceptions.

Everything that talks to a service goes through a Connection, so the security settings and
the error mapping live here once. The TLS credentials, options and the token's metadata come
from mqstore/rpc/channel.py's ChannelSecurity, which the services' own channels to the commit
log use too. The token is passed as call metadata on each call. (AsyncProducer runs on the
same threads and channels, so there is no asyncio connection.)

A call that reaches no server fails as StoreUnreachable, naming the address and the likely
cause (`explain`). A Connection remembers whether any server of the store ever answered it
(`reached`): until one has, the Producer and the Consumer give up on a store they cannot reach
after `connect_timeout_s` (a wrong address or TLS setting does not get better); after, they
retry an outage for their longer deadlines (a restart, a leader failover).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from mqstore.client.errors import (
    Cancelled,
    ClientError,
    FailedPrecondition,
    StoreUnreachable,
    connect_failure,
    explain_unauthenticated,
    from_rpc_error,
    not_connected,
)
from mqstore.client.settings import DNS_ALL_PREFIX, ClientSettings, resolve_addresses
from mqstore.rpc.allocator import keep_large_blocks
from mqstore.rpc.channel import ChannelSecurity
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2, commitlog_pb2_grpc
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2_grpc
from mqstore.rpc.gen.index.v1 import index_pb2_grpc
from mqstore.rpc.leader_channel import ROLE_PROBE_TIMEOUT_S, find_leading

T = TypeVar("T")
S = TypeVar("S")

# Codes after which another replica (or a later attempt) may answer.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
# Codes the client's own transport gives (a connection lost, a deadline, a cancel): a call that
# failed with one of them is no sign that a server answered.
_TRANSPORT_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def security_of(settings: ClientSettings) -> ChannelSecurity:
    """The settings' TLS files and token as a ChannelSecurity (reads the token file)."""
    tls = settings.tls
    return ChannelSecurity(
        tls=tls is not None,
        ca_file=tls.ca_file if tls else None,
        cert_file=tls.cert_file if tls else None,
        key_file=tls.key_file if tls else None,
        server_name=tls.server_name if tls else None,
        token=settings.bearer_token(),
    )


def _commitlog_addresses(given: tuple[str, ...]) -> tuple[str, ...]:
    """The commit-log addresses to try: `dns-all:` entries resolved; when nothing resolves yet
    (no replica ready), HOST:PORT itself, so that a call fails naming it."""
    resolved = resolve_addresses(given)
    if resolved:
        return resolved
    return tuple(a.removeprefix(DNS_ALL_PREFIX) for a in given)


class Connection:
    """Blocking channels, one per address, shared by every Producer/Consumer/Admin built on it."""

    def __init__(self, settings: ClientSettings | None = None) -> None:
        self.settings = settings or ClientSettings()
        if self.settings.keep_large_blocks:
            keep_large_blocks()
        self._security = security_of(self.settings)
        self.metadata = self._security.metadata()
        self._credentials = self._security.credentials()
        self._channels: dict[str, grpc.Channel] = {}
        # Stubs per (kind, target): building one makes a callable per method, so it is done once.
        self._stubs: dict[tuple[object, str], Any] = {}
        # The address of each stub method (by id; stubs live as long as the connection), so
        # that a failed call names where it went.
        self._method_targets: dict[int, str] = {}
        # Whether any server of the store answered a call of this connection yet.
        self._reached = False
        self._lock = threading.Lock()
        self._closed = False
        self._cq_preferred = 0  # the consume-queue replica that answered last
        # The commit-log replica taken for the leader (one address: that one); `dns-all:`
        # entries resolved now and again whenever the leader is looked for.
        self._commitlog_targets = _commitlog_addresses(self.settings.commitlog_targets)
        self._commitlog_at = 0

    def channel(self, target: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise Cancelled("the connection is closed")
            channel = self._channels.get(target)
            if channel is None:
                options = self._security.options()
                if self._credentials is None:
                    channel = grpc.insecure_channel(target, options=options)
                else:
                    channel = grpc.secure_channel(target, self._credentials, options=options)
                self._channels[target] = channel
            return channel

    def _stub(self, kind: Callable[[grpc.Channel], S], target: str) -> S:
        stub: S | None = self._stubs.get((kind, target))
        if stub is None:
            stub = kind(self.channel(target))
            with self._lock:
                self._stubs[(kind, target)] = stub
                for method in vars(stub).values():
                    self._method_targets[id(method)] = target
        return stub

    @property
    def reached(self) -> bool:
        """True once a server of the store answered a call of this connection (any answer:
        a result, or a status of its own such as NOT_FOUND)."""
        return self._reached

    def mark_reached(self) -> None:
        self._reached = True

    def explain(self, error: ClientError, target: str = "") -> ClientError:
        """`error` with what this connection knows: a call that reached no server becomes a
        StoreUnreachable naming `target` and the likely cause (from gRPC's words and this
        client's TLS settings); UNAUTHENTICATED says what to check about the token. A status
        of the server's own marks the store as reached."""
        if isinstance(error, StoreUnreachable):
            return error
        if not_connected(error):
            tls = self.settings.tls
            return connect_failure(
                error,
                address=target,
                tls=tls is not None,
                client_cert=tls is not None and tls.cert_file is not None,
            )
        if error.code not in _TRANSPORT_CODES:
            self._reached = True
        if error.code == grpc.StatusCode.UNAUTHENTICATED:
            return explain_unauthenticated(
                error,
                address=target,
                token_given=self._security.token is not None,
                token_file=self.settings.token_file,
            )
        return error

    def commitlog(self) -> commitlog_pb2_grpc.CommitLogStub:
        """The commit log: with several addresses (a broker group), the replica last found
        leading (`find_commitlog_leader`)."""
        return self._stub(
            commitlog_pb2_grpc.CommitLogStub, self._commitlog_targets[self._commitlog_at]
        )

    @property
    def commitlog_target(self) -> str:
        return self._commitlog_targets[self._commitlog_at]

    def find_commitlog_leader(self) -> str:
        """Ask each commit-log replica (from the one after the current) which role it has, and
        take the leader (a single replica is its own); without an answer naming one, move to
        the next address. Called after a stream to the commit log failed; returns the address
        taken. One address: nothing to find."""
        self._resolve_commitlog()
        targets = self._commitlog_targets
        if len(targets) > 1:
            channels = [self.channel(t) for t in targets]
            self._commitlog_at = find_leading(
                channels, self._commitlog_at, self.metadata, answered=self.mark_reached
            )
        return targets[self._commitlog_at]

    def _resolve_commitlog(self) -> None:
        """With `dns-all:` commit-log addresses: resolve them again (pods come and go), keeping
        the replica taken for the leader when it is still there."""
        given = self.settings.commitlog_targets
        if not any(a.startswith(DNS_ALL_PREFIX) for a in given):
            return
        current = self._commitlog_targets[self._commitlog_at]
        targets = _commitlog_addresses(given)
        self._commitlog_at = targets.index(current) if current in targets else 0
        self._commitlog_targets = targets

    def leader_elsewhere(self) -> str | None:
        """With several commit-log replicas: another replica that says it leads (the one in the
        newest epoch, when more than one says so), taken for the leader from now on; None when
        none does. For a caller whose answers stopped coming: a leader that stopped (paused,
        cut off from the network) answers nothing and may keep the connection open, while the
        group elects another within the lease TTL."""
        self._resolve_commitlog()
        targets = self._commitlog_targets
        current = self._commitlog_at
        best: tuple[int, int] | None = None  # (epoch, index)
        for at, target in enumerate(targets):
            if at == current:
                continue
            stub = commitlog_pb2_grpc.CommitLogStub(self.channel(target))
            try:
                status = stub.GetStatus(
                    commitlog_pb2.GetStatusRequest(),
                    timeout=ROLE_PROBE_TIMEOUT_S,
                    metadata=self.metadata,
                )
            except grpc.RpcError:
                continue
            self._reached = True
            if status.role == "leader":
                epoch = status.history.epochs[-1] if status.history.epochs else 0
                if best is None or epoch > best[0]:
                    best = (epoch, at)
        if best is None:
            return None
        self._commitlog_at = best[1]
        return targets[best[1]]

    def cq(self, target: str) -> consumequeue_pb2_grpc.ConsumeQueueStub:
        return self._stub(consumequeue_pb2_grpc.ConsumeQueueStub, target)

    def index(self, target: str) -> index_pb2_grpc.IndexStub:
        return self._stub(index_pb2_grpc.IndexStub, target)

    def call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        name: str,
        timeout_s: float | None = None,
    ) -> T:
        """One unary call with the deadline and the token; a failure raises its typed error
        (`explain`)."""
        try:
            out = method(
                request,
                timeout=self.settings.timeout_s if timeout_s is None else timeout_s,
                metadata=self.metadata,
            )
        except grpc.RpcError as err:
            target = self._method_targets.get(id(method), "")
            raise self.explain(from_rpc_error(err, name), target) from None
        self._reached = True
        return out

    def call_cq(
        self,
        pick: Callable[[consumequeue_pb2_grpc.ConsumeQueueStub], Callable[..., T]],
        request: Any,
        *,
        name: str,
        timeout_s: float | None = None,
    ) -> T:
        """A consume-queue call on the first replica that answers (in the listed order, starting
        from the one that answered last)."""
        targets = self.settings.cq
        if not targets:
            raise FailedPrecondition("no consume-queue address is configured", field="cq")
        last: ClientError | None = None
        start = self._cq_preferred
        for i in range(len(targets)):
            at = (start + i) % len(targets)
            try:
                out = self.call(pick(self.cq(targets[at])), request, name=name, timeout_s=timeout_s)
            except ClientError as err:
                if err.code not in RETRYABLE:
                    raise
                last = err
                continue
            self._cq_preferred = at
            return out
        assert last is not None
        raise last

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for channel in channels:
            channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
