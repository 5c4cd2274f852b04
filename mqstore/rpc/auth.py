"""Who may call what: bearer tokens with scopes, checked before any handler runs.

    tokens file (TOML; --tokens-file), read when the service starts and again when it changes
    (TokensFile below: SIGHUP, or within TOKENS_RELOAD_CHECK_S of a change); hashes only:

        [[token]]
        name = "billing"                     # shown in logs and errors, never the token
        sha256 = "9f86d081884c7d65..."       # hex SHA-256 of the token's UTF-8 bytes
        scopes = ["produce:orders", "consume:orders*", "admin", "subscribe"]
        expires = 2027-01-31T00:00:00Z       # optional; from then on UNAUTHENTICATED

    scope      produce:<topic pattern>   Append / AppendStream to a matching topic
               consume:<topic pattern>   Pull, offsets, Receive/Ack, key queries on a matching
                                         topic; `consume:*` also raw reads by offset (Read,
                                         GetMessage), which may hit any topic
               subscribe                 the dispatch stream (Subscribe, Confirm): followers
               replicate                 copy the whole log (Replicate): a broker group's
                                         replicas
               admin                     every method (ListTopics and ListGroups need it)
               (any valid token)         GetStatus of each service, reflection
               (no token at all)         grpc.health.v1 Check (probes carry no token)
               patterns are fnmatch, case-sensitive: `*` every topic, `orders*`, `eu-?-audit`

    a call     metadata  authorization: Bearer <token>
               -> missing, repeated or not "Bearer <token>"          UNAUTHENTICATED
               -> SHA-256 of the token compared with every entry       UNAUTHENTICATED if none
                  (hmac.compare_digest on 32-byte digests, no early      matches, or the entry
                  exit: the time says nothing of which entry or how      has expired
                  much of it matched)
               -> the method's requirement (REQUIREMENTS) against     PERMISSION_DENIED if the
                  the entry's scopes, with the request in hand: every  scopes do not cover it
                  topic of an Append, each request of an AppendStream
                  as it arrives (a refused one ends the stream; the
                  requests before it were answered, nothing of it is
                  stored)
               -> the handler, with `caller=<entry name>` bound to its log lines

The token is checked before the request's bytes are parsed (admission.py: a caller without a
valid token is UNAUTHENTICATED whatever it sent), the scopes after. Refusals are logged at most
a few lines at a time (logs.RateLimitedLog) and counted by code in grpc_server_handled_total.

Health is open: grpc_health_probe, Kubernetes and load balancers send no token. It is served
by a plaintext server of its own (server.py) that holds nothing but grpc.health.v1, and its
Check also on the API port, where a token, if sent, is not looked at (the port's TLS still
applies). Reflection (v1 and v1alpha) is open to any valid token. A method missing from the
table needs `admin` (fail closed); a test checks that the table names every method.

Reload: a file that reads whole replaces the table at once (calls in flight keep the grant
they were admitted with; the next call sees the new table): a removed token is refused, a new
one admitted. A file that does not read (bad TOML, a bad entry, no entries, missing) changes
nothing: the table read last stays in force and one error line names the file, the line and
what is wrong. Neither a typo nor a half-edited file opens the door or locks everyone out.

Errors are the typed `Unauthenticated` / `PermissionDenied` of mqstore/errors.py, mapped to
their codes by the ErrorInterceptor, which sits outside the AdmissionInterceptor. Neither the
token nor its hash appears in an error or a log line.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import hmac
import logging
import os
import re
import threading
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from mqstore.errors import InvalidArgument, PermissionDenied, Unauthenticated
from mqstore.rpc.admission import ANYONE, Caller
from mqstore.rpc.channel import AUTHORIZATION_KEY
from mqstore.rpc.logs import RateLimitedLog
from mqstore.stop_request import StopRequest

log = logging.getLogger(__name__)
Metadata = tuple[tuple[str, str | bytes], ...] | None

PRODUCE: Final = "produce"
CONSUME: Final = "consume"
ADMIN: Final = "admin"
SUBSCRIBE: Final = "subscribe"
REPLICATE: Final = "replicate"
ALL_TOPICS: Final = "*"
DIGEST_BYTES = hashlib.sha256().digest_size
assert DIGEST_BYTES == 32
_ENTRY_KEYS = frozenset({"name", "sha256", "scopes", "expires"})
# How often a service looks at its tokens file's inode, size and mtime: a token added or
# removed there takes effect within this long (SIGHUP: at once). A stat() every 2 s is nothing.
TOKENS_RELOAD_CHECK_S: Final = 2.0
# The header of an entry, to name its line in an error (tomllib gives no positions for values).
_ENTRY_HEADER = re.compile(r"^[ \t]*\[\[[ \t]*token[ \t]*\]\]", re.MULTILINE)

Scope = Literal["produce", "consume", "admin", "subscribe", "replicate", "authenticated", "anyone"]
# Scopes without a topic pattern.
_FLAG_SCOPES = (ADMIN, SUBSCRIBE, REPLICATE)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def parse_scope(text: str) -> tuple[str, str]:
    """(action, topic pattern) of one scope; the pattern is "" for admin, subscribe and
    replicate."""
    if text in _FLAG_SCOPES:
        return text, ""
    action, sep, pattern = text.partition(":")
    if action in (PRODUCE, CONSUME) and sep and pattern and not pattern.isspace():
        return action, pattern
    raise InvalidArgument(
        f"scope {text!r}: expected produce:<topic pattern>, consume:<topic pattern>, "
        "admin, subscribe or replicate",
        field="scopes",
    )


# -- what a method needs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """`scope` on the topics `topics(request)` names; `topics` None for produce/consume means
    any topic at all (raw offsets), which only `<action>:*` or admin covers."""

    scope: Scope
    topics: Callable[[Any], Iterable[str]] | None = None


def _topic(request: Any) -> Iterable[str]:
    return (request.topic,)


def _pull_topic(request: Any) -> Iterable[str]:
    return (request.pull.topic,)


def _pulls_topics(request: Any) -> Iterable[str]:
    return {pull.topic for pull in request.pulls}


def _batch_topics(request: Any) -> Iterable[str]:
    return {batch.topic for batch in request.batches}


AUTHENTICATED = Requirement("authenticated")
ANYONE_AT_ALL = Requirement("anyone")  # not even a token: health checks
NEEDS_ADMIN = Requirement(ADMIN)
NEEDS_SUBSCRIBE = Requirement(SUBSCRIBE)
NEEDS_REPLICATE = Requirement(REPLICATE)
PRODUCE_BATCHES = Requirement(PRODUCE, _batch_topics)
CONSUME_TOPIC = Requirement(CONSUME, _topic)
CONSUME_PULL_TOPIC = Requirement(CONSUME, _pull_topic)
CONSUME_PULLS_TOPICS = Requirement(CONSUME, _pulls_topics)
CONSUME_ANY_TOPIC = Requirement(CONSUME)

_CL = "/mqstore.commitlog.v1.CommitLog/"
_CQ = "/mqstore.consumequeue.v1.ConsumeQueue/"
_IX = "/mqstore.index.v1.Index/"

# Every method of the three services. GetStatus is open to any valid token (offsets, lag and
# replica state, no names); ListTopics and ListGroups name every topic or group: admin.
REQUIREMENTS: dict[str, Requirement] = {
    _CL + "Append": PRODUCE_BATCHES,
    _CL + "AppendStream": PRODUCE_BATCHES,
    _CL + "Read": CONSUME_ANY_TOPIC,
    _CL + "GetMessage": CONSUME_ANY_TOPIC,
    _CL + "Subscribe": NEEDS_SUBSCRIBE,
    _CL + "Confirm": NEEDS_SUBSCRIBE,
    _CL + "GetStatus": AUTHENTICATED,
    _CL + "ForgetSubscriber": NEEDS_ADMIN,
    _CL + "Replicate": NEEDS_REPLICATE,
    _CL + "Switchover": NEEDS_ADMIN,
    _CQ + "Pull": CONSUME_TOPIC,
    _CQ + "PullStream": CONSUME_PULL_TOPIC,
    _CQ + "Follow": CONSUME_PULLS_TOPICS,
    _CQ + "GetOffsetByTime": CONSUME_TOPIC,
    _CQ + "GetQueueInfo": CONSUME_TOPIC,
    _CQ + "ListQueues": CONSUME_TOPIC,
    _CQ + "ListTopics": NEEDS_ADMIN,
    _CQ + "CommitOffset": CONSUME_TOPIC,
    _CQ + "FetchOffset": CONSUME_TOPIC,
    _CQ + "ListGroups": NEEDS_ADMIN,
    _CQ + "Receive": CONSUME_TOPIC,
    _CQ + "Ack": CONSUME_TOPIC,
    _CQ + "ChangeInvisibleDuration": CONSUME_TOPIC,
    _CQ + "GetStatus": AUTHENTICATED,
    _IX + "QueryByKey": CONSUME_TOPIC,
    _IX + "QueryByUniqKey": CONSUME_TOPIC,
    _IX + "GetStatus": AUTHENTICATED,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": AUTHENTICATED,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": AUTHENTICATED,
    "/grpc.health.v1.Health/Check": ANYONE_AT_ALL,
}


def requirement_for(method: str) -> Requirement:
    """A method nobody listed needs admin: a new RPC is closed until someone decides."""
    return REQUIREMENTS.get(method, NEEDS_ADMIN)


# -- who the caller is --------------------------------------------------------------------------


@dataclass(frozen=True)
class Grant:
    """One entry of the tokens file: a name, the token's digest and what it may do."""

    name: str
    digest: bytes = field(repr=False)
    scopes: tuple[str, ...] = ()
    admin: bool = False
    subscribe: bool = False
    replicate: bool = False
    produce: tuple[str, ...] = ()
    consume: tuple[str, ...] = ()
    expires: dt.datetime | None = None

    @classmethod
    def of(
        cls,
        name: str,
        digest: bytes,
        scopes: Sequence[str],
        expires: dt.datetime | None = None,
    ) -> Grant:
        patterns: dict[str, list[str]] = {PRODUCE: [], CONSUME: []}
        flags = set()
        for scope in scopes:
            action, pattern = parse_scope(scope)
            if pattern:
                patterns[action].append(pattern)
            else:
                flags.add(action)
        return cls(
            name=name,
            digest=digest,
            scopes=tuple(scopes),
            admin=ADMIN in flags,
            subscribe=SUBSCRIBE in flags,
            replicate=REPLICATE in flags,
            produce=tuple(patterns[PRODUCE]),
            consume=tuple(patterns[CONSUME]),
            expires=expires,
        )

    def check(self, requirement: Requirement, request: Any) -> None:
        """Raises PermissionDenied unless the scopes cover `requirement` for `request`."""
        scope = requirement.scope
        if self.admin or scope in ("authenticated", "anyone"):
            return
        if scope == SUBSCRIBE:
            if not self.subscribe:
                raise PermissionDenied(f"token {self.name!r} lacks the subscribe scope")
            return
        if scope == REPLICATE:
            if not self.replicate:
                raise PermissionDenied(f"token {self.name!r} lacks the replicate scope")
            return
        if scope == ADMIN:
            raise PermissionDenied(f"token {self.name!r} lacks the admin scope")
        patterns = self.produce if scope == PRODUCE else self.consume
        if requirement.topics is None:
            if ALL_TOPICS not in patterns:
                raise PermissionDenied(
                    f"token {self.name!r} may not {scope} every topic "
                    f"(reads by offset need {scope}:* or admin)"
                )
            return
        for topic in requirement.topics(request):
            if not any(fnmatch.fnmatchcase(topic, p) for p in patterns):
                raise PermissionDenied(f"token {self.name!r} may not {scope} topic {topic!r}")


class TokenTable:
    """The entries of a tokens file, and the constant-time lookup of a presented token."""

    def __init__(self, grants: Sequence[Grant]) -> None:
        if not grants:
            raise InvalidArgument("the tokens file has no [[token]] entries", field="token")
        by_digest: dict[bytes, str] = {}
        for g in grants:
            if g.digest in by_digest:
                raise InvalidArgument(
                    f"tokens {by_digest[g.digest]!r} and {g.name!r} have the same sha256",
                    field="sha256",
                )
            by_digest[g.digest] = g.name
        self.grants = tuple(grants)

    @classmethod
    def from_file(cls, path: str) -> TokenTable:
        try:
            return cls.from_toml(Path(path).read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            raise InvalidArgument(f"tokens file {path}: {err}", field="tokens_file") from None
        except InvalidArgument as err:
            raise InvalidArgument(f"tokens file {path}: {err}", field=err.field) from None

    @classmethod
    def from_toml(cls, text: str) -> TokenTable:
        entries = tomllib.loads(text).get("token", [])
        if not isinstance(entries, list):
            raise InvalidArgument("`token` must be an array of tables: [[token]]", field="token")
        # The line of each entry's [[token]] header, when the headers are what made the array.
        lines = [text.count("\n", 0, m.start()) + 1 for m in _ENTRY_HEADER.finditer(text)]
        if len(lines) != len(entries):
            lines = []
        return cls(
            [_grant(i, entry, lines[i] if lines else None) for i, entry in enumerate(entries)]
        )

    def authenticate(self, token: str, now: dt.datetime | None = None) -> Grant:
        """The entry whose digest is the token's. Every entry is compared, each in constant
        time on 32 bytes whatever the token's length, so timing tells nothing."""
        found = self.find(hash_token(token))
        if found is None:
            raise Unauthenticated("the bearer token is not valid")
        if found.expires is not None and (now or dt.datetime.now(dt.UTC)) >= found.expires:
            raise Unauthenticated(f"the bearer token {found.name!r} expired at {found.expires}")
        return found

    def find(self, digest: bytes) -> Grant | None:
        """The entry of `digest`, every entry compared in constant time (no early exit)."""
        found: Grant | None = None
        for grant in self.grants:
            if hmac.compare_digest(digest, grant.digest):
                found = grant
        return found


def _grant(index: int, entry: object, line: int | None = None) -> Grant:
    at = f" (line {line})" if line is not None else ""
    where = f"[[token]] #{index + 1}{at}"
    if not isinstance(entry, dict):
        raise InvalidArgument(f"{where} is not a table", field="token")
    if "token" in entry:
        raise InvalidArgument(
            f"{where} holds a token: store only its sha256 (`mqstore token new` prints it)",
            field="token",
        )
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise InvalidArgument(f"{where}: unknown keys {sorted(unknown)}", field="token")
    name, hex_digest, scopes = entry.get("name"), entry.get("sha256"), entry.get("scopes", [])
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}: `name` must be a non-empty string", field="name")
    where = f"token {name!r}{at}"
    try:
        digest = bytes.fromhex(hex_digest) if isinstance(hex_digest, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != DIGEST_BYTES:
        raise InvalidArgument(f"{where}: `sha256` must be 64 hex digits", field="sha256")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise InvalidArgument(f"{where}: `scopes` must be a list of strings", field="scopes")
    expires = entry.get("expires")
    if expires is not None and not (isinstance(expires, dt.datetime) and expires.tzinfo):
        raise InvalidArgument(
            f"{where}: `expires` must be a TOML date-time with an offset (2027-01-31T00:00:00Z)",
            field="expires",
        )
    try:
        return Grant.of(name, digest, scopes, expires)
    except InvalidArgument as err:
        raise InvalidArgument(f"{where}: {err}", field="scopes") from None


def presented_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The token of `authorization: Bearer <token>`; Unauthenticated when there is not
    exactly one such header of that form."""
    values = [v for k, v in metadata or () if k == AUTHORIZATION_KEY]
    if not values:
        raise Unauthenticated("no bearer token: send the metadata authorization: Bearer <token>")
    if len(values) > 1:
        raise Unauthenticated("more than one authorization header")
    value = values[0]
    scheme, _, token = value.partition(" ") if isinstance(value, str) else ("", "", "")
    if scheme.lower() != "bearer" or not token or token != token.strip() or " " in token:
        raise Unauthenticated("malformed authorization header: expected Bearer <token>")
    return token


# -- the tokens file, read again when it changes --------------------------------------------------


def _signature(path: str) -> tuple[int, int, int, int] | None:
    """What changes when the file is replaced or edited: device, inode, size, mtime; None when
    it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class TokensFile:
    """A tokens file and the table read from it last.

    `check()` reads the file again when its signature (device, inode, size, mtime) changed
    since the last read, `reload()` whatever it is; `watch()` runs `check()` every
    TOKENS_RELOAD_CHECK_S in a thread, and at once after `request_reload()` (SIGHUP). A read
    that fails keeps the old table and logs one error naming the file and the line; the
    failed file's signature is remembered, so the error is logged once, not every check, and
    the next change is read again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature = _signature(path)  # before the read: a change during it is seen
        self.table = TokenTable.from_file(path)  # at start a bad file stops the service
        self._lock = threading.Lock()  # one reload at a time (the watcher and a caller)
        self._wake = threading.Event()
        self._forced = False  # set by request_reload: reload even if the file looks the same
        self._listeners: list[Callable[[TokenTable], None]] = []

    def on_reload(self, listener: Callable[[TokenTable], None]) -> None:
        self._listeners.append(listener)

    def check(self) -> bool:
        """Reload if the file changed since it was last read; True when a new table is in."""
        if _signature(self.path) == self._signature:
            return False
        return self.reload()

    def reload(self, why: str = "changed") -> bool:
        """Read the file; a table that reads whole replaces the old one (True), else the old
        one stays and the error is logged (False)."""
        with self._lock:
            self._signature = _signature(self.path)
            try:
                table = TokenTable.from_file(self.path)
            except (InvalidArgument, OSError, ValueError) as err:
                detail = str(err) if isinstance(err, InvalidArgument) else f"{self.path}: {err}"
                log.error(
                    "tokens file %s (%s) not reloaded; the %d tokens read before stay in force: %s",
                    self.path,
                    why,
                    len(self.table.grants),
                    detail,
                )
                return False
            old = {g.name for g in self.table.grants}
            new = {g.name for g in table.grants}
            self.table = table
            for listener in self._listeners:
                listener(table)
        log.info(
            "tokens file %s (%s) reloaded: %d tokens, added %s, removed %s",
            self.path,
            why,
            len(table.grants),
            sorted(new - old) or "none",
            sorted(old - new) or "none",
        )
        return True

    def request_reload(self) -> None:
        """Reload now, in the watcher's thread (safe to call from a signal handler)."""
        self._forced = True
        self._wake.set()

    def watch(self, stopping: StopRequest) -> threading.Thread:
        """A daemon thread that checks the file every TOKENS_RELOAD_CHECK_S until `stopping`."""

        def run() -> None:
            while not stopping.is_set():
                self._wake.wait(TOKENS_RELOAD_CHECK_S)
                self._wake.clear()
                if stopping.is_set():
                    return
                forced, self._forced = self._forced, False
                try:
                    if forced:
                        self.reload("SIGHUP")
                    else:
                        self.check()
                except Exception:  # a bug here must not end the watching
                    log.exception("tokens file %s: reload failed", self.path)

        thread = threading.Thread(target=run, name="tokens-reload", daemon=True)
        thread.start()
        return thread


# -- the gate ------------------------------------------------------------------------------------


class TokenGate:
    """Who calls, by bearer token, for the AdmissionInterceptor (admission.py): it authenticates
    a call from its metadata before the request's bytes are parsed, and checks the method's
    requirement against each request once they are. Both run in the handler's thread.

    `replace(table)` puts a reloaded table in force for every call admitted after it (one
    attribute assignment, atomic: a call sees the old table or the new one, never a mix).

    Refusals are logged through RateLimitedLogs: one for every UNAUTHENTICATED call (whoever
    it is, it is not a name of ours), one per token name for PERMISSION_DENIED (the tokens file
    bounds the names): a flood of refused calls writes a few lines, and one token's refusals
    never hide another's."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table
        self._unknown_log = RateLimitedLog(log)
        self._denied_logs: dict[str, RateLimitedLog] = {}
        self.replace(table)

    def replace(self, table: TokenTable) -> None:
        for grant in table.grants:  # names only grow: a few per token ever named in the file
            self._denied_logs.setdefault(grant.name, RateLimitedLog(log))
        self.table = table

    def door(self, method: str) -> Callable[[Metadata], Caller]:
        requirement = requirement_for(method)
        if requirement is ANYONE_AT_ALL:
            return _open_door
        unknown_log = self._unknown_log
        denied_logs = self._denied_logs

        def admit(metadata: Metadata) -> _Caller:
            table = self.table
            try:
                grant = table.authenticate(presented_token(metadata))
            except Unauthenticated as err:
                unknown_log.warning("refused %s: %s", method, err)
                raise
            return _Caller(self, table, grant, requirement, method, denied_logs[grant.name])

        return admit


def _open_door(_: Metadata) -> Caller:
    """Whoever calls, with or without a token (whatever token: it is not looked at)."""
    return ANYONE


class _Caller:
    """A call's grant and its method's requirement, and the table the grant came from: a call
    that outlives a reload (a stream) is held to the new table at its next request or response
    (`revalidate`): its token removed, UNAUTHENTICATED; its scopes narrowed, PERMISSION_DENIED."""

    __slots__ = ("denied_log", "gate", "grant", "method", "request", "requirement", "table")

    def __init__(
        self,
        gate: TokenGate,
        table: TokenTable,
        grant: Grant,
        requirement: Requirement,
        method: str,
        denied_log: RateLimitedLog,
    ) -> None:
        self.gate = gate
        self.table = table
        self.grant = grant
        self.requirement = requirement
        self.method = method
        self.denied_log = denied_log
        self.request: Any = None  # the last request checked, for `revalidate`

    @property
    def name(self) -> str:
        return self.grant.name

    def check(self, request: Any) -> None:
        self._follow_reload()
        self.request = request
        self._check(request)

    def revalidate(self) -> None:
        """Between a stream's responses: nothing unless the table was reloaded since the call
        was admitted (one attribute compared); then the token and the last request again."""
        if self.gate.table is self.table:
            return
        self._follow_reload()
        if self.request is not None:
            self._check(self.request)

    def _follow_reload(self) -> None:
        table = self.gate.table
        if table is self.table:
            return
        grant = table.find(self.grant.digest)
        if grant is None:
            err = Unauthenticated(
                f"the bearer token {self.grant.name!r} was removed from the tokens file"
            )
            self.gate._unknown_log.warning("refused %s: %s", self.method, err)
            raise err
        self.table, self.grant = table, grant
        self.denied_log = self.gate._denied_logs[grant.name]

    def _check(self, request: Any) -> None:
        try:
            self.grant.check(self.requirement, request)
        except PermissionDenied as err:
            self.denied_log.warning("refused %s: %s", self.method, err)
            raise
