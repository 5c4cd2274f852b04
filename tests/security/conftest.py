"""A secure store for the security tests: certificates and tokens made once per session by
the same generator `mqstore up --secure` uses, and one cluster (commitlog_svc, cq_svc,
index_svc as processes on loopback) that requires mutual TLS and bearer tokens everywhere,
its followers subscribing with their own certificate and token.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqstore.cli.security import issue_certificate, make_ca, new_token, toml_entry, write_secret
from mqstore.client.settings import ClientSettings, TlsSettings
from mqstore.rpc.channel import ChannelSecurity
from mqstore.testing.cluster import Cluster

# Small index files: RocketMQ's default 420 MB file per replica is too much for a test.
INDEX_ARGS = ("--slot-num", "4096", "--entry-num", "16384")
HOSTS = ("127.0.0.1", "localhost")

# name -> scopes of the tokens every test may use.
SCOPES: dict[str, tuple[str, ...]] = {
    "admin": ("admin",),
    "followers": ("subscribe", "consume:*"),
    "orders-producer": ("produce:orders*",),
    "orders-consumer": ("consume:orders*",),
    "reader-all": ("consume:*",),
    "no-scopes": (),
    "expired-admin": ("admin",),  # expired: see EXPIRES
}
EXPIRES = {"expired-admin": dt.datetime(2020, 1, 1, tzinfo=dt.UTC)}


@dataclass(frozen=True)
class Material:
    """Paths of the certificates and keys, and the tokens (in memory and in files)."""

    root: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing of this store
    other_client_cert: Path  # a client certificate from that other CA
    other_client_key: Path
    tokens_file: Path
    tokens: dict[str, str]

    def token_file(self, name: str) -> Path:
        return self.root / f"{name}.token"

    def security(self, *, token: str | None = None, client_cert: bool = True) -> ChannelSecurity:
        return ChannelSecurity(
            tls=True,
            ca_file=str(self.ca),
            cert_file=str(self.client_cert) if client_cert else None,
            key_file=str(self.client_key) if client_cert else None,
            token=token,
        )


def _write_pair(root: Path, stem: str, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    cert, key = root / f"{stem}.pem", root / f"{stem}.key"
    cert.write_bytes(pair[0])
    write_secret(key, pair[1])
    return cert, key


@pytest.fixture(scope="session")
def material(tmp_path_factory: pytest.TempPathFactory) -> Material:
    root = tmp_path_factory.mktemp("secrets")
    ca_pem, ca_key = make_ca()
    (root / "ca.pem").write_bytes(ca_pem)
    server = _write_pair(root, "server", issue_certificate(ca_pem, ca_key, "server", hosts=HOSTS))
    client = _write_pair(root, "client", issue_certificate(ca_pem, ca_key, "c", client=True))
    other_pem, other_key = make_ca("another CA")
    (root / "other-ca.pem").write_bytes(other_pem)
    other_client = _write_pair(
        root, "other-client", issue_certificate(other_pem, other_key, "c", client=True)
    )
    tokens = {name: new_token() for name in SCOPES}
    for name, token in tokens.items():
        write_secret(root / f"{name}.token", token + "\n")
    tokens_file = root / "tokens.toml"
    entries = [toml_entry(n, tokens[n], s, EXPIRES.get(n)) for n, s in SCOPES.items()]
    write_secret(tokens_file, "\n".join(entries))
    return Material(
        root=root,
        ca=root / "ca.pem",
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        other_ca=root / "other-ca.pem",
        other_client_cert=other_client[0],
        other_client_key=other_client[1],
        tokens_file=tokens_file,
        tokens=tokens,
    )


def server_flags(m: Material, *, mtls: bool = True, tokens: bool = True) -> list[str]:
    flags = ["--tls-cert-file", str(m.server_cert), "--tls-key-file", str(m.server_key)]
    if mtls:
        flags += ["--tls-client-ca-file", str(m.ca)]
    if tokens:
        flags += ["--tokens-file", str(m.tokens_file)]
    # Debug logs: the most a service ever writes, for the test that looks for the token there.
    return [*flags, "--log-level", "debug"]


def follower_flags(m: Material) -> list[str]:
    return [
        *server_flags(m),
        "--commitlog-tls-ca-file", str(m.ca),
        "--commitlog-tls-cert-file", str(m.client_cert),
        "--commitlog-tls-key-file", str(m.client_key),
        "--commitlog-token-file", str(m.token_file("followers")),
    ]  # fmt: skip


@pytest.fixture(scope="session")
def secure_cluster(
    material: Material, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    extra = {
        "commitlog_svc": server_flags(material),
        "cq_svc": follower_flags(material),
        "index_svc": follower_flags(material),
    }
    c = Cluster(tmp_path_factory.mktemp("secure-store"), extra=extra)
    try:
        c.start_commitlog()
        c.add("cq_svc", "cq")
        c.add("index_svc", "index", *INDEX_ARGS)
        c.start("cq")  # ready = subscribed over mTLS with its token and caught up
        c.start("index")
        yield c
    finally:
        c.stop_all()


def client_settings(
    c: Cluster, m: Material, token: str | None, **overrides: object
) -> ClientSettings:
    """SDK settings for the secure cluster: mutual TLS and the named token's file."""
    return ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=(c.followers["index"].target,),
        tls=TlsSettings(
            ca_file=str(m.ca), cert_file=str(m.client_cert), key_file=str(m.client_key)
        ),
        token_file=str(m.token_file(token)) if token else None,
        **overrides,  # type: ignore[arg-type]
    )
