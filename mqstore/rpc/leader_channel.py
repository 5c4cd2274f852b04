"""A channel to a broker group's commit log that follows its leader.

cq_svc and index_svc are given every replica (`--commitlog-target a:7100,b:7100,c:7100`); their
subscription, reads and probes go to the one leading. `LeaderChannel` looks like one
`grpc.Channel` to the stubs built on it: each call goes to the replica taken for the leader at
that moment. `find_leader()` (the subscriber calls it when its stream breaks) asks each replica
its role (GetStatus) and takes the leader, or, with no answer naming one, the next address.

    stub.Read(...) ──▶ LeaderChannel ──▶ channel of the current leader ──▶ replica b
                         │ find_leader(): GetStatus of c, a, b ... role == "leader"

One address: `commitlog_channel` makes a plain channel, as before broker groups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from mqstore.rpc.channel import PLAINTEXT, ChannelSecurity, make_channel
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as pb
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2_grpc as pb_grpc

# How long one replica has to say its role while the leader is looked for.
ROLE_PROBE_TIMEOUT_S = 1.0
# The roles that take appends and serve Subscribe.
LEADING_ROLES = ("leader", "single")


def split_targets(target: str) -> list[str]:
    return [t.strip() for t in target.split(",") if t.strip()]


def find_leading(
    channels: Sequence[grpc.Channel],
    current: int,
    metadata: tuple[tuple[str, str], ...] | None = None,
    *,
    answered: Callable[[], None] | None = None,
) -> int:
    """The index of the replica that says it leads, asking from the one after `current`
    around; without an answer naming one, the next index (the caller tries it). `answered`
    is called for each replica that answers at all."""
    count = len(channels)
    for i in range(1, count + 1):
        at = (current + i) % count
        try:
            status = pb_grpc.CommitLogStub(channels[at]).GetStatus(
                pb.GetStatusRequest(), timeout=ROLE_PROBE_TIMEOUT_S, metadata=metadata
            )
        except grpc.RpcError:
            continue
        if answered is not None:
            answered()
        if status.role in LEADING_ROLES:
            return at
    return (current + 1) % count


class LeaderChannel(grpc.Channel):
    def __init__(self, targets: Sequence[str], security: ChannelSecurity = PLAINTEXT) -> None:
        if not targets:
            raise ValueError("a commit log needs at least one address")
        self.targets = list(targets)
        self._channels = [make_channel(t, security) for t in self.targets]
        self._at = 0
        self._lock = threading.Lock()

    @property
    def target(self) -> str:
        return self.targets[self._at]

    def current(self) -> grpc.Channel:
        return self._channels[self._at]

    def find_leader(self) -> str:
        """Take the replica that says it leads (from the one after the current), else the
        next address; returns the address taken."""
        with self._lock:
            self._at = find_leading(self._channels, self._at)
            return self.targets[self._at]

    # -- grpc.Channel --------------------------------------------------------------------------

    def subscribe(self, callback: Callable[..., Any], try_to_connect: bool = False) -> None:
        self.current().subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[..., Any]) -> None:
        self.current().unsubscribe(callback)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Follow(self, "unary_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Follow(self, "unary_stream", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Follow(self, "stream_unary", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return _Follow(self, "stream_stream", method, args, kwargs)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self) -> LeaderChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Follow:
    """A method of a LeaderChannel: each call goes to the current leader's channel (the
    multi-callable of each channel made once)."""

    def __init__(
        self, owner: LeaderChannel, kind: str, method: str, args: tuple[Any, ...], kwargs: Any
    ) -> None:
        self._owner = owner
        self._callables = [
            getattr(channel, kind)(method, *args, **kwargs) for channel in owner._channels
        ]

    def _now(self) -> Any:
        return self._callables[self._owner._at]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._now()(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._now().with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._now().future(*args, **kwargs)


def commitlog_channel(target: str, security: ChannelSecurity = PLAINTEXT) -> grpc.Channel:
    """A channel to the commit log at `target`: a plain one for one address, a LeaderChannel
    for a comma list of a broker group's replicas."""
    targets = split_targets(target)
    if len(targets) == 1:
        return make_channel(targets[0], security)
    return LeaderChannel(targets, security)
