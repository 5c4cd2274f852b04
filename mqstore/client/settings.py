"""Where the services are and how to talk to them.

    ClientSettings()                       the addresses `mqstore up` listens on
    ClientSettings.from_env()              MQSTORE_COMMITLOG, MQSTORE_CQ, MQSTORE_INDEX (comma
                                           separated), MQSTORE_TOKEN_FILE, MQSTORE_TLS_CA,
                                           MQSTORE_TLS_CERT, MQSTORE_TLS_KEY, MQSTORE_TIMEOUT_S,
                                           MQSTORE_CONNECT_TIMEOUT_S; what they leave unset,
                                           from the context in force (contexts.py: `mqstore
                                           up` selects its store's)

Index replicas are listed flat: the SDK asks each which shard it holds (GetStatus) and sends a
query to a caught-up replica of the key's shard. Consume-queue replicas are equivalent: calls
go to the first that answers, and move on when one is unavailable.

An index entry may also be `dns-all:HOST:PORT`: every address HOST resolves to, looked up again
whenever the SDK rediscovers the shards. In Kubernetes, HOST is the index tier's headless client
Service (`index.mqstore.svc.cluster.local`), whose DNS name lists one address per ready pod, so a
replica added by scaling is found without a change to the client (deploy/, docs/operations.md).
With TLS, the certificates are then checked against `server_name` (MQSTORE_TLS_SERVER_NAME).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mqstore.client import contexts
from mqstore.errors import InvalidArgument
from mqstore.ports import DEFAULT_PORTS

CALL_TIMEOUT_S_DEFAULT = 10.0
# How long a client keeps trying a store it has not reached yet before it fails naming the
# address and the likely cause (refused, TLS on one side only, a client certificate missing):
# a store `mqstore up` starts listens within a second or two, while a wrong address or TLS
# setting never gets better. Once a server answered, an outage (a restart, a leader failover of
# ~3 s) is retried for the longer Producer.retry_timeout_s / Consumer.reconnect_timeout_s.
CONNECT_TIMEOUT_S_DEFAULT = 3.0
# An address list entry meaning "every address this host:port resolves to" (resolve_addresses).
DNS_ALL_PREFIX = "dns-all:"
# A long poll waits on the server up to this long; the call's deadline adds the timeout to it.
LONG_POLL_MS_DEFAULT = 20_000


def _local(package: str) -> str:
    return f"127.0.0.1:{DEFAULT_PORTS[package][0]}"


@dataclass(frozen=True)
class TlsSettings:
    """TLS material, as file paths. `ca_file` None trusts the system's roots; `cert_file` and
    `key_file` together present a client certificate (mutual TLS); `server_name` overrides the
    name checked against the servers' certificates."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise InvalidArgument("a client certificate needs both cert_file and key_file")

    def credentials_bytes(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(root CAs, private key, certificate chain), read from the files."""
        return (_read(self.ca_file), _read(self.key_file), _read(self.cert_file))


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


@dataclass(frozen=True)
class ClientSettings:
    commitlog: str = field(default_factory=lambda: _local("commitlog_svc"))
    cq: tuple[str, ...] = field(default_factory=lambda: (_local("cq_svc"),))
    index: tuple[str, ...] = field(default_factory=lambda: (_local("index_svc"),))
    tls: TlsSettings | None = None
    # A bearer token, or a file holding one (preferred: secrets stay out of argv and logs).
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    # The deadline of every unary call; long polls add their wait to it.
    timeout_s: float = CALL_TIMEOUT_S_DEFAULT
    # How long a store not reached yet is retried (CONNECT_TIMEOUT_S_DEFAULT).
    connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT
    # Set glibc's malloc thresholds once in this process (mqstore/rpc/allocator.py), as the
    # services do: a pull's megabyte answer then reuses heap memory instead of fresh pages,
    # each a page fault and a zeroing (a consumer spends less CPU a message: docs/bench.md).
    # The price is that freed memory stays in the process. False leaves malloc as it is.
    keep_large_blocks: bool = True

    def __post_init__(self) -> None:
        if not self.commitlog:
            raise InvalidArgument("the commit log's address is required", field="commitlog")
        if isinstance(self.cq, str) or isinstance(self.index, str):
            raise InvalidArgument("cq and index are tuples of addresses, not a string")
        if self.timeout_s <= 0:
            raise InvalidArgument("timeout_s must be positive", field="timeout_s")
        if self.connect_timeout_s <= 0:
            raise InvalidArgument("connect_timeout_s must be positive", field="connect_timeout_s")
        if self.token is not None and self.token_file is not None:
            raise InvalidArgument("give a token or a token file, not both", field="token")
        for named, addresses in (
            ("commitlog", self.commitlog_targets),
            ("cq", self.cq),
            ("index", self.index),
        ):
            for address in addresses:
                _check_address(address, named)

    @property
    def commitlog_targets(self) -> tuple[str, ...]:
        """The commit log's addresses: one, or every replica of a broker group
        (`a:7100,b:7100,c:7100`, or `dns-all:HOST:PORT`: every address HOST resolves to, as
        for the index tier), of which the client finds and follows the leader."""
        return split_addresses(self.commitlog)

    def bearer_token(self) -> str | None:
        if self.token_file is not None:
            token = _read(self.token_file)
            assert token is not None
            return token.decode("utf-8").strip() or None
        return self.token

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ClientSettings:
        """Settings from MQSTORE_* variables; keyword arguments win over the environment, and
        the environment over the context in force (MQSTORE_CONTEXT, or the selected one:
        `mqstore up` selects its own; mqstore/client/contexts.py)."""
        env = os.environ if env is None else env
        context = contexts.active(env=env)
        if context is not None:
            env = {**context.as_env(), **env}
        kwargs: dict[str, object] = {}
        if env.get("MQSTORE_COMMITLOG"):
            kwargs["commitlog"] = env["MQSTORE_COMMITLOG"]
        for key, var in (("cq", "MQSTORE_CQ"), ("index", "MQSTORE_INDEX")):
            if env.get(var):
                kwargs[key] = split_addresses(env[var])
        if env.get("MQSTORE_TOKEN_FILE"):
            kwargs["token_file"] = env["MQSTORE_TOKEN_FILE"]
        for key, var in (
            ("timeout_s", "MQSTORE_TIMEOUT_S"),
            ("connect_timeout_s", "MQSTORE_CONNECT_TIMEOUT_S"),
        ):
            if env.get(var):
                try:
                    kwargs[key] = float(env[var])
                except ValueError:
                    raise InvalidArgument(f"{var} must be a number of seconds", field=var) from None
        tls = {
            name: env[var]
            for name, var in (
                ("ca_file", "MQSTORE_TLS_CA"),
                ("cert_file", "MQSTORE_TLS_CERT"),
                ("key_file", "MQSTORE_TLS_KEY"),
                ("server_name", "MQSTORE_TLS_SERVER_NAME"),
            )
            if env.get(var)
        }
        if tls:
            kwargs["tls"] = TlsSettings(**tls)
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kwargs)  # type: ignore[arg-type]


def split_addresses(text: str) -> tuple[str, ...]:
    return tuple(a.strip() for a in text.split(",") if a.strip())


def resolve_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """The addresses, with each `dns-all:HOST:PORT` replaced by `IP:PORT` for every address HOST
    resolves to now (IPv6 as `[IP]:PORT`), in the order given, each once. A name that resolves
    to nothing (a headless Service with no ready pod) contributes nothing; callers decide
    whether an empty answer is an error. Other entries are kept as they are."""
    out: dict[str, None] = {}
    for address in addresses:
        if not address.startswith(DNS_ALL_PREFIX):
            out[address] = None
            continue
        host, port = _host_port(address)
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for family, _, _, _, sockaddr in sorted(infos, key=lambda i: (i[0], str(i[4][0]))):
            ip = str(sockaddr[0])
            out[f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"] = None
    return tuple(out)


# Targets gRPC resolves by a scheme of its own, passed through as they are.
_GRPC_SCHEMES = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")


def _check_address(address: str, field: str) -> None:
    """HOST:PORT (or dns-all:HOST:PORT, or a gRPC target with its own scheme): a mistyped
    address is a bad setting at once, not a host name that fails to resolve seconds later."""
    if not address.startswith(_GRPC_SCHEMES):
        _host_port(address, field)


def _host_port(address: str, field: str = "index") -> tuple[str, int]:
    """(host, port) of HOST:PORT or dns-all:HOST:PORT; InvalidArgument naming `field`."""
    text = address.removeprefix(DNS_ALL_PREFIX)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        form = f"{DNS_ALL_PREFIX}HOST:PORT" if text != address else "HOST:PORT"
        raise InvalidArgument(
            f"the {field} address {address!r} is not one: expected {form} with a port in 1..65535",
            field=field,
        )
    return host.strip("[]"), int(port)
