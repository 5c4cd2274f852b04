"""The auth model in-process: scope grammar, what each scope covers, the method table, the
tokens file, the constant-time lookup, the settings that turn TLS and tokens on."""

from __future__ import annotations

import datetime as dt
import hmac
import os
import stat
from pathlib import Path

import pydantic
import pytest

from commitlog_svc.settings import CommitLogSettings
from cq_svc.settings import CqSettings
from index_svc.settings import IndexSettings
from mqstore.cli.security import new_token, prepare_secrets, toml_entry
from mqstore.errors import InvalidArgument, PermissionDenied, Unauthenticated
from mqstore.rpc import auth
from mqstore.rpc.auth import (
    AUTHENTICATED,
    CONSUME_ANY_TOPIC,
    CONSUME_TOPIC,
    NEEDS_ADMIN,
    NEEDS_REPLICATE,
    NEEDS_SUBSCRIBE,
    PRODUCE_BATCHES,
    REQUIREMENTS,
    Grant,
    TokenTable,
    parse_scope,
    presented_token,
    requirement_for,
)
from mqstore.rpc.channel import ChannelSecurity
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.rpc.gen.consumequeue.v1 import consumequeue_pb2 as cq
from mqstore.rpc.gen.index.v1 import index_pb2 as ix

# -- scopes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("admin", ("admin", "")),
        ("subscribe", ("subscribe", "")),
        ("replicate", ("replicate", "")),
        ("produce:orders", ("produce", "orders")),
        ("consume:orders*", ("consume", "orders*")),
        ("consume:*", ("consume", "*")),
        ("produce:eu-?-audit", ("produce", "eu-?-audit")),
    ],
)
def test_the_scope_grammar_accepts(text: str, parsed: tuple[str, str]) -> None:
    assert parse_scope(text) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Admin",
        "admin:x",
        "produce",
        "produce:",
        "consume: ",
        "read:x",
        "subscribe:x",
        "replicate:x",
    ],
)
def test_the_scope_grammar_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_scope(text)


def grant(*scopes: str) -> Grant:
    return Grant.of("t", b"\0" * 32, scopes)


def pull(topic: str) -> cq.PullRequest:
    return cq.PullRequest(topic=topic)


def append(*topics: str) -> cl.AppendRequest:
    return cl.AppendRequest(batches=[cl.MessageBatch(topic=t) for t in topics])


@pytest.mark.parametrize(
    ("scopes", "requirement", "request_", "allowed"),
    [
        (("produce:orders*",), PRODUCE_BATCHES, append("orders-eu"), True),
        (("produce:orders*",), PRODUCE_BATCHES, append("Orders"), False),  # case-sensitive
        (("produce:orders*",), PRODUCE_BATCHES, append("orders-eu", "payments"), False),
        (
            ("produce:orders*", "produce:payments"),
            PRODUCE_BATCHES,
            append("orders", "payments"),
            True,
        ),
        (("consume:orders*",), PRODUCE_BATCHES, append("orders"), False),
        (("consume:orders",), CONSUME_TOPIC, pull("orders"), True),
        (("consume:orders",), CONSUME_TOPIC, pull("orders2"), False),
        (("produce:*",), CONSUME_TOPIC, pull("orders"), False),
        (("consume:orders*",), CONSUME_ANY_TOPIC, cl.ReadRequest(), False),
        (("consume:*",), CONSUME_ANY_TOPIC, cl.ReadRequest(), True),
        (("consume:*",), NEEDS_SUBSCRIBE, cl.SubscribeRequest(), False),
        (("subscribe",), NEEDS_SUBSCRIBE, cl.SubscribeRequest(), True),
        (("subscribe", "consume:*", "produce:*"), NEEDS_ADMIN, cq.ListTopicsRequest(), False),
        ((), AUTHENTICATED, cl.GetStatusRequest(), True),
        (("admin",), NEEDS_ADMIN, cq.ListTopicsRequest(), True),
        (("admin",), PRODUCE_BATCHES, append("anything"), True),
        (("admin",), CONSUME_ANY_TOPIC, cl.ReadRequest(), True),
        (("admin",), NEEDS_SUBSCRIBE, cl.SubscribeRequest(), True),
        (("replicate",), NEEDS_REPLICATE, cl.ReplicateRequest(), True),
        (("subscribe", "consume:*"), NEEDS_REPLICATE, cl.ReplicateRequest(), False),
        (("replicate",), NEEDS_SUBSCRIBE, cl.SubscribeRequest(), False),
        (("replicate",), CONSUME_ANY_TOPIC, cl.ReadRequest(), False),
        (("replicate",), NEEDS_ADMIN, cl.SwitchoverRequest(), False),
        (("admin",), NEEDS_REPLICATE, cl.ReplicateRequest(), True),
    ],
)
def test_what_each_scope_covers(
    scopes: tuple[str, ...], requirement: auth.Requirement, request_: object, allowed: bool
) -> None:
    g = grant(*scopes)
    if allowed:
        g.check(requirement, request_)
    else:
        with pytest.raises(PermissionDenied):
            g.check(requirement, request_)


def test_the_table_names_every_method_of_the_three_services_and_nothing_else() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (cl, cq, ix)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    reflection = {
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
    health = {"/grpc.health.v1.Health/Check"}  # open: probes carry no token
    assert set(REQUIREMENTS) == methods | reflection | health


def test_a_method_nobody_listed_needs_admin() -> None:
    assert requirement_for("/mqstore.commitlog.v1.CommitLog/Truncate") is NEEDS_ADMIN


# -- the token on the wire ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        [],
        [("x-token", "Bearer abc")],
        [("authorization", "abc")],
        [("authorization", "Basic abc")],
        [("authorization", "Bearer ")],
        [("authorization", "Bearer a b")],
        [("authorization", "Bearer  abc")],
        [("authorization", b"Bearer abc")],
        [("authorization", "Bearer abc"), ("authorization", "Bearer abc")],
    ],
)
def test_a_missing_or_malformed_header_is_unauthenticated(
    metadata: list[tuple[str, str | bytes]],
) -> None:
    with pytest.raises(Unauthenticated):
        presented_token(metadata)


def test_the_token_is_what_follows_bearer() -> None:
    assert presented_token([("te", "x"), ("authorization", "bearer abc-_1")]) == "abc-_1"


# -- the tokens file ------------------------------------------------------------------------------


def test_an_entry_made_by_the_generator_authenticates_its_token() -> None:
    tokens = {name: new_token() for name in ('a "quoted" name', "b")}
    text = toml_entry('a "quoted" name', tokens['a "quoted" name'], ["produce:o*"]) + toml_entry(
        "b", tokens["b"], ["admin"]
    )
    table = TokenTable.from_toml(text)
    found = table.authenticate(tokens['a "quoted" name'])
    assert (found.name, found.produce) == ('a "quoted" name', ("o*",))
    assert table.authenticate(tokens["b"]).admin
    assert tokens["b"] not in text  # only the hash is in the file
    with pytest.raises(Unauthenticated):
        table.authenticate(tokens["b"] + "x")


def test_a_token_stops_working_when_its_entry_expires() -> None:
    token = new_token()
    expires = dt.datetime(2027, 1, 31, tzinfo=dt.UTC)
    entry = toml_entry("temp", token, ["admin"], expires)
    assert "expires = 2027-01-31T00:00:00Z" in entry
    table = TokenTable.from_toml(entry)
    assert table.authenticate(token, now=expires - dt.timedelta(seconds=1)).admin
    with pytest.raises(Unauthenticated, match="expired"):
        table.authenticate(token, now=expires)


H = "ab" * 32


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "no [[token]] entries"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\ntoken = "secret"\n', "store only its sha256"),
        ('[[token]]\nname = "a"\nsha256 = "abc"\n', "64 hex digits"),
        (f'[[token]]\nname = "a"\nsha256 = "{"zz" * 32}"\n', "64 hex digits"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\nscope = ["admin"]\n', "unknown keys"),
        (f'[[token]]\nsha256 = "{H}"\n', "name"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\nscopes = ["root"]\n', "scope 'root'"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\nscopes = "admin"\n', "list of strings"),
        (
            f'[[token]]\nname = "a"\nsha256 = "{H}"\n[[token]]\nname = "b"\nsha256 = "{H}"\n',
            "same sha256",
        ),
        ('token = "x"\n', "array of tables"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\nexpires = 2027-01-31T00:00:00\n', "offset"),
        (f'[[token]]\nname = "a"\nsha256 = "{H}"\nexpires = 2027-01-31\n', "offset"),
    ],
)
def test_a_bad_tokens_file_is_refused_with_the_reason(text: str, complaint: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        TokenTable.from_toml(text)
    assert complaint in str(caught.value)


def test_a_bad_tokens_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text("[[token]\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match=str(path)):
        TokenTable.from_file(str(path))


def test_every_entry_is_compared_in_constant_time_on_equal_length_digests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hmac.compare_digest does the comparing, on two 32-byte digests whatever the presented
    token's length, once per entry whether or not (and wherever) one matches."""
    tokens = [new_token() for _ in range(3)]
    table = TokenTable.from_toml("".join(toml_entry(f"t{i}", t, []) for i, t in enumerate(tokens)))
    seen: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    for presented in [tokens[0], tokens[2], "x", "y" * 5000, tokens[1][:-1]]:
        seen.clear()
        try:
            table.authenticate(presented)
        except Unauthenticated:
            pass
        assert seen == [(32, 32)] * 3, presented[:10]


# -- settings -------------------------------------------------------------------------------------


def test_a_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="go together"):
        CommitLogSettings(tls_cert_file="server.pem")


def test_client_certificates_need_server_tls() -> None:
    with pytest.raises(pydantic.ValidationError, match="needs server TLS"):
        CqSettings(tls_client_ca_file="ca.pem")


def test_a_follower_client_certificate_without_its_key_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="go together"):
        IndexSettings(commitlog_tls_cert_file="client.pem")


def test_the_follower_security_comes_from_files(tmp_path: Path) -> None:
    token_file = tmp_path / "t"
    token_file.write_text("s3cret\n", encoding="utf-8")
    settings = CqSettings.load(
        ["--commitlog-tls-ca-file", "ca.pem", "--commitlog-token-file", str(token_file)]
    )
    security = settings.commitlog_security()
    assert (security.tls, security.ca_file, security.token) == (True, "ca.pem", "s3cret")
    assert "s3cret" not in repr(security) and "s3cret" not in repr(settings)
    assert CqSettings().commitlog_security() == ChannelSecurity()


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match="empty"):
        ChannelSecurity.from_files(token_file=str(tmp_path / "t"))


# -- the generated secrets ------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_secrets_are_private_and_kept_across_starts(tmp_path: Path) -> None:
    files = prepare_secrets(tmp_path / "secrets")
    assert _mode(files.directory) == 0o700
    for secret in (files.ca_key, files.server_key, files.client_key, files.admin_token):
        assert _mode(secret) == 0o600, secret
    assert _mode(files.subscriber_token) == _mode(files.tokens) == 0o600
    table = TokenTable.from_file(str(files.tokens))
    admin = table.authenticate(files.admin_token.read_text(encoding="utf-8").strip())
    followers = table.authenticate(files.subscriber_token.read_text(encoding="utf-8").strip())
    assert admin.admin and followers.subscribe and followers.consume == ("*",)

    before = {p.name: p.read_bytes() for p in files.directory.iterdir()}
    files.server_cert.unlink()
    prepare_secrets(files.directory)
    after = {p.name: p.read_bytes() for p in files.directory.iterdir()}
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"server.pem", "server.key"}  # the rest, tokens and CA, are kept
