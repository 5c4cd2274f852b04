"""Stores a client cannot reach, for the SDK's and the CLI's tests of the errors that say why: a
free port with nothing listening, a plaintext commit log, and a secure one (TLS, client
certificates required, bearer tokens), each a real commitlog_svc process on loopback.

The certificates come from the generator `mqstore up --secure` uses; a second CA signs
nothing of the store, for a client certificate and a CA the store does not know.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mqstore.cli.security import issue_certificate, make_ca, new_token, toml_entry, write_secret
from mqstore.client.settings import TlsSettings
from mqstore.testing.cluster import Cluster

# The connect deadline of the tests about which cause a TLS mismatch is told as: every
# handshake fails the same way, and the client tells the cause when the deadline ends, so the
# default (3 s) was waited out whole for nothing. A second leaves a loaded machine several
# handshakes. The default itself is pinned by the tests with nothing listening.
MISMATCH_CONNECT_TIMEOUT_S = 1.0


def free_address() -> str:
    """A loopback port nothing listens on (bound, then closed: refused until someone takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@dataclass(frozen=True)
class Secrets:
    root: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signed nothing of the store
    other_client_cert: Path  # signed by other_ca
    other_client_key: Path
    tokens_file: Path  # the store's table: one admin token
    token_file: Path  # that token
    unknown_token_file: Path  # a token the store does not know

    def tls(self, *, client_cert: bool = True, ca: Path | None = None) -> TlsSettings:
        return TlsSettings(
            ca_file=str(ca or self.ca),
            cert_file=str(self.client_cert) if client_cert else None,
            key_file=str(self.client_key) if client_cert else None,
        )

    def server_flags(self) -> list[str]:
        return [
            "--tls-cert-file", str(self.server_cert),
            "--tls-key-file", str(self.server_key),
            "--tls-client-ca-file", str(self.ca),
            "--tokens-file", str(self.tokens_file),
        ]  # fmt: skip


def _pair(root: Path, stem: str, pair: tuple[bytes, bytes]) -> tuple[Path, Path]:
    cert, key = root / f"{stem}.pem", root / f"{stem}.key"
    cert.write_bytes(pair[0])
    write_secret(key, pair[1])
    return cert, key


def make_secrets(root: Path) -> Secrets:
    ca_pem, ca_key = make_ca()
    (root / "ca.pem").write_bytes(ca_pem)
    server = _pair(root, "server", issue_certificate(ca_pem, ca_key, "s", hosts=("127.0.0.1",)))
    client = _pair(root, "client", issue_certificate(ca_pem, ca_key, "c", client=True))
    other_pem, other_key = make_ca("another CA")
    (root / "other-ca.pem").write_bytes(other_pem)
    other = _pair(root, "other", issue_certificate(other_pem, other_key, "c", client=True))
    token = new_token()
    write_secret(root / "tokens.toml", toml_entry("admin", token, ("admin",), None))
    write_secret(root / "admin.token", token + "\n")
    write_secret(root / "unknown.token", new_token() + "\n")
    return Secrets(
        root=root,
        ca=root / "ca.pem",
        server_cert=server[0],
        server_key=server[1],
        client_cert=client[0],
        client_key=client[1],
        other_ca=root / "other-ca.pem",
        other_client_cert=other[0],
        other_client_key=other[1],
        tokens_file=root / "tokens.toml",
        token_file=root / "admin.token",
        unknown_token_file=root / "unknown.token",
    )


def start_commitlog(root: Path, flags: list[str] | None = None) -> Cluster:
    """A commit log alone (no followers): what a client's first call reaches."""
    c = Cluster(root, extra={"commitlog_svc": flags or []})
    try:
        c.start_commitlog()
    except BaseException:
        c.stop_all()
        raise
    return c


# -- fixtures, for the modules that import them ---------------------------------------------------


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    return make_secrets(tmp_path_factory.mktemp("secrets"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_commitlog(tmp_path_factory.mktemp("plain"))
    yield c
    c.stop_all()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, secrets: Secrets) -> Iterator[Cluster]:
    c = start_commitlog(tmp_path_factory.mktemp("secure"), secrets.server_flags())
    yield c
    c.stop_all()
