"""Secrets for a secure store: tokens (`mqstore token new`) and the files `mqstore up --secure`
generates for one machine.

    DATA_DIR/secrets/          (mode 0700; every key and token file 0600)
      ca.pem, ca.key           a private CA (EC P-256, 10 years), only for this store
      server.pem, server.key   the services' certificate: 127.0.0.1, ::1 and localhost
      client.pem, client.key   a client certificate, for mutual TLS (`up --mtls`)
      tokens.toml              the services' tokens file: hashes and scopes only
      admin.token              a token with scope admin (everything): for you
      subscriber.token         the followers' token: subscribe, consume:*

What exists is kept, so tokens and the CA survive restarts; a missing file is made again
(with its dependants: a new CA means new certificates), and certificates that expire within
RENEW_BEFORE_DAYS are renewed. The CA's key never leaves the directory; nothing here prints a
secret except `token new` without --out, which prints the one token it was asked for.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mqstore.errors import InvalidArgument
from mqstore.rpc.auth import TOKENS_RELOAD_CHECK_S, TokenTable, hash_token, parse_scope

# 32 random bytes: 256 bits, beyond guessing; token_urlsafe makes 43 characters of them.
TOKEN_BYTES = 32
CA_DAYS = 3650
LEAF_DAYS = 365
# Renewed at start when this close to expiry, so a long-running store does not expire soon.
RENEW_BEFORE_DAYS = 30
# Clocks of the machines involved may be a little behind the one that signed.
CLOCK_SKEW = dt.timedelta(minutes=5)
SERVER_HOSTS = ("127.0.0.1", "::1", "localhost")
ADMIN_SCOPES = ("admin",)
# A follower subscribes and reads records by offset (its pulls and queries read the log).
SUBSCRIBER_SCOPES = ("subscribe", "consume:*")
# A broker group's replica copies the leader's log (Replicate) and nothing else.
REPLICA_SCOPES = ("replicate",)
SECRET_FILE_MODE = 0o600
SECRET_DIR_MODE = 0o700


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def toml_entry(
    name: str, token: str, scopes: Sequence[str], expires: dt.datetime | None = None
) -> str:
    """The tokens-file entry for `token`: its hash, never the token. JSON strings are valid
    TOML basic strings (same escapes), which keeps odd names safe."""
    if not name:
        raise InvalidArgument("a token needs a name", field="name")
    for scope in scopes:
        parse_scope(scope)
    entry = (
        "[[token]]\n"
        f"name = {json.dumps(name)}\n"
        f'sha256 = "{hash_token(token).hex()}"\n'
        f"scopes = [{', '.join(json.dumps(s) for s in scopes)}]\n"
    )
    if expires is not None:
        at = expires.astimezone(dt.UTC).replace(microsecond=0)
        entry += f"expires = {at.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
    return entry


def write_secret(path: Path, data: bytes | str) -> None:
    """Write a file that only its owner can read, created so from the start (no window in
    which it is readable by others); an existing file is replaced."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# -- certificates -------------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mqstore"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(common_name: str = "mqstore local CA") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA that may sign leaves only."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def issue_certificate(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    common_name: str,
    *,
    hosts: Sequence[str] = (),
    client: bool = False,
    days: int = LEAF_DAYS,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) signed by the CA: a server certificate for `hosts` (IP
    addresses and DNS names, checked by clients against the target), or a client one."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidArgument("the CA key is not an EC key", field="ca_key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return _cert_pem(cert), _key_pem(key)


def _expires_soon(path: Path) -> bool:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    return left < dt.timedelta(days=RENEW_BEFORE_DAYS)


# -- the files of `up --secure` -----------------------------------------------------------------


@dataclass(frozen=True)
class SecretFiles:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def tokens(self) -> Path:
        return self.directory / "tokens.toml"

    @property
    def admin_token(self) -> Path:
        return self.directory / "admin.token"

    @property
    def subscriber_token(self) -> Path:
        return self.directory / "subscriber.token"

    @property
    def replica_token(self) -> Path:
        return self.directory / "replica.token"


def prepare_secrets(directory: str | Path) -> SecretFiles:
    """Make whatever of the secrets is missing or expiring in `directory`; keep the rest."""
    files = SecretFiles(Path(directory))
    files.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(files.directory, SECRET_DIR_MODE)
    new_ca = not (files.ca.exists() and files.ca_key.exists()) or _expires_soon(files.ca)
    if new_ca:
        cert, key = make_ca()
        write_secret(files.ca_key, key)
        files.ca.write_bytes(cert)
    ca_cert, ca_key = files.ca.read_bytes(), files.ca_key.read_bytes()
    for cert_path, key_path, client in (
        (files.server_cert, files.server_key, False),
        (files.client_cert, files.client_key, True),
    ):
        if new_ca or not (cert_path.exists() and key_path.exists()) or _expires_soon(cert_path):
            cert, key = issue_certificate(
                ca_cert,
                ca_key,
                "mqstore client" if client else "mqstore server",
                hosts=() if client else SERVER_HOSTS,
                client=client,
            )
            write_secret(key_path, key)
            cert_path.write_bytes(cert)
    tokens = (files.tokens, files.admin_token, files.subscriber_token, files.replica_token)
    if not all(p.exists() for p in tokens):
        admin, subscriber, replica = new_token(), new_token(), new_token()
        write_secret(files.admin_token, admin + "\n")
        write_secret(files.subscriber_token, subscriber + "\n")
        write_secret(files.replica_token, replica + "\n")
        write_secret(
            files.tokens,
            "# Token hashes and scopes for mqstore's services (mqstore/rpc/auth.py).\n"
            + toml_entry("admin", admin, ADMIN_SCOPES)
            + "\n"
            + toml_entry("followers", subscriber, SUBSCRIBER_SCOPES)
            + "\n"
            + toml_entry("replicas", replica, REPLICA_SCOPES),
        )
    return files


# -- `mqstore token` ----------------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """Bearer tokens for services started with a tokens file.

    \b
    A token's scopes, each given with --scope:
      produce:PATTERN   append to topics matching PATTERN (fnmatch: *, ?, [..])
      consume:PATTERN   read, pull, receive, offsets, key queries on matching topics;
                        consume:* also reads by offset (any topic)
      subscribe         the dispatch stream (cq_svc and index_svc replicas)
      admin             everything, including the list of topics
    """


@token_group.command("new")
@click.option("--name", required=True, help="shown in the services' logs and errors")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    metavar="SCOPE",
    help="produce:PATTERN, consume:PATTERN, subscribe or admin (repeat for more)",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the token to this file (mode 0600) instead of printing it",
)
@click.option(
    "--expires-days",
    type=click.FloatRange(min=0, min_open=True),
    help="the token stops working this many days from now (default: never)",
)
@click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="append the entry to this tokens file (the services' --tokens-file; `mqstore up "
    "--secure` keeps it in DATA_DIR/secrets/tokens.toml) instead of printing it",
)
def token_new(
    name: str,
    scopes: tuple[str, ...],
    out: Path | None,
    expires_days: float | None,
    tokens_file: Path | None,
) -> None:
    """Make a random token; print the entry to append to the tokens file (or append it).

    \b
    The tokens file holds only the token's SHA-256; the token itself goes to the client
    (MQSTORE_TOKEN_FILE, --token-file). Running services read a changed tokens file within
    a few seconds (SIGHUP: at once).

    \b
    Examples:
      mqstore token new --name billing --scope consume:orders --out billing.token \\
          --tokens-file data/secrets/tokens.toml
      mqstore token new --name ci --scope admin --expires-days 7
    """
    token = new_token()
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(days=expires_days) if expires_days else None
    try:
        entry = toml_entry(name, token, scopes, expires)
    except InvalidArgument as err:
        raise click.UsageError(str(err)) from None
    if out is not None and out.exists():
        raise click.UsageError(f"{out} exists; choose another file or remove it first")
    if tokens_file is not None:
        _append_entry(tokens_file, entry, name)  # first: a bad tokens file leaves no token behind
    if out is not None:
        write_secret(out, token + "\n")
        click.echo(f"# the token is in {out}", err=True)
    else:
        click.echo(f"# token (give it to the client; it is not stored anywhere): {token}", err=True)
    if tokens_file is not None:
        click.echo(
            f"# added to {tokens_file}; running services read it within "
            f"{TOKENS_RELOAD_CHECK_S:g} s (SIGHUP: at once)",
            err=True,
        )
        return
    click.echo(
        "# append this to the tokens file the services read (their --tokens-file; "
        "`mqstore up --secure`: DATA_DIR/secrets/tokens.toml), or give --tokens-file:",
        err=True,
    )
    click.echo(entry, nl=False)


def _append_entry(tokens_file: Path, entry: str, name: str) -> None:
    """The tokens file with `entry` appended, checked whole before it replaces the old one:
    a file the services could not read, or a second token of the same name, is refused."""
    if not tokens_file.parent.is_dir():
        raise click.UsageError(
            f"{tokens_file.parent} is not a directory (`mqstore up --secure` makes "
            "DATA_DIR/secrets and its tokens.toml)"
        )
    old = tokens_file.read_text(encoding="utf-8") if tokens_file.exists() else ""
    text = old + ("" if not old or old.endswith("\n") else "\n") + entry
    try:
        table = TokenTable.from_toml(text)
    except (InvalidArgument, ValueError) as err:
        raise click.UsageError(f"{tokens_file}: {err}") from None
    if [g.name for g in table.grants].count(name) > 1:
        raise click.UsageError(f"{tokens_file} already has a token named {name!r}")
    write_secret(tokens_file, text)
