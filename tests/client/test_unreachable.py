"""A store the SDK cannot reach: the call fails within a few seconds (connect_timeout_s, 3 s),
naming the address and the likely cause, as a new user meets it with the README's snippet.

Before: a Producer retried for its 30 s retry_timeout_s and said only "the commit log did not
take the messages within 30.0 s of retries"; a plaintext client at a TLS port said "Socket
closed". A store that answered once is still retried for the long deadline (a restart, a
leader failover): the last test.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mqstore.client import Admin, ClientSettings, Consumer, Producer
from mqstore.client.errors import (
    CAUSE_CLIENT_CERT_REJECTED,
    CAUSE_CLIENT_CERT_REQUIRED,
    CAUSE_PLAINTEXT_SERVER,
    CAUSE_REFUSED,
    CAUSE_SERVER_CERT_UNTRUSTED,
    CAUSE_TLS_EXPECTED,
    StoreUnreachable,
    Unauthenticated,
)
from mqstore.client.settings import CONNECT_TIMEOUT_S_DEFAULT, TlsSettings
from mqstore.testing.cluster import Cluster
from tests.client.reach import (
    MISMATCH_CONNECT_TIMEOUT_S,
    Secrets,
    free_address,
    plain,
    secrets,
    secure,
    start_commitlog,
)

__all__ = ["plain", "secrets", "secure"]  # fixtures, used by name

# A failure told within this (connect_timeout_s is 3 s; a loaded 2-core machine adds some).
# Before, a Producer took its 30 s retry_timeout_s, a Consumer its 30 s reconnect_timeout_s.
TOLD_WITHIN_S = 8.0
# Long enough for the old code's retries to end too, so that the test fails rather than hangs.
WAIT_S = 40.0


def send_fails(settings: ClientSettings) -> tuple[Exception, float]:
    """What a first send through a new Producer (default retries) fails with, and after how
    many seconds."""
    started = time.monotonic()
    with pytest.raises(Exception) as failed, Producer(settings) as producer:
        producer.send("orders", b"...", key="order-42").result(timeout=WAIT_S)
    return failed.value, time.monotonic() - started


def test_a_producer_with_nothing_listening_fails_within_seconds_naming_the_address() -> None:
    address = free_address()
    err, took_s = send_fails(ClientSettings(commitlog=address))
    assert isinstance(err, StoreUnreachable), repr(err)
    assert err.cause == CAUSE_REFUSED and err.address == address
    assert address in str(err) and "refused" in str(err) and "mqstore up" in str(err)
    assert CONNECT_TIMEOUT_S_DEFAULT <= took_s < TOLD_WITHIN_S, took_s
    print(f"producer, nothing listening: failed after {took_s:.1f} s: {err}")  # a figure


def test_a_consumer_with_nothing_listening_fails_within_seconds_naming_the_address() -> None:
    address = free_address()
    started = time.monotonic()
    consumer = Consumer(ClientSettings(cq=(address,)), "orders")
    with consumer, pytest.raises(StoreUnreachable) as failed:
        list(consumer.messages(follow=False))
    took_s = time.monotonic() - started
    assert failed.value.cause == CAUSE_REFUSED and address in str(failed.value)
    assert took_s < TOLD_WITHIN_S, took_s


def test_the_connect_deadline_is_a_setting_and_an_environment_variable() -> None:
    settings = ClientSettings.from_env(
        {"MQSTORE_COMMITLOG": free_address(), "MQSTORE_CONNECT_TIMEOUT_S": "0.5"}
    )
    assert settings.connect_timeout_s == 0.5
    err, took_s = send_fails(settings)
    assert isinstance(err, StoreUnreachable) and took_s < CONNECT_TIMEOUT_S_DEFAULT, took_s


def test_a_plaintext_client_at_a_tls_port_is_told_the_store_expects_tls(secure: Cluster) -> None:
    err, took_s = send_fails(
        ClientSettings(
            commitlog=secure.commitlog.target, connect_timeout_s=MISMATCH_CONNECT_TIMEOUT_S
        )
    )
    assert isinstance(err, StoreUnreachable), repr(err)
    assert err.cause == CAUSE_TLS_EXPECTED and secure.commitlog.target in str(err)
    assert "expects TLS" in str(err) and "MQSTORE_TLS_CA" in str(err)
    assert took_s < TOLD_WITHIN_S, took_s


def test_a_tls_client_at_a_plaintext_port_is_told_the_store_answers_in_plaintext(
    plain: Cluster, secrets: Secrets
) -> None:
    settings = ClientSettings(
        commitlog=plain.commitlog.target,
        tls=secrets.tls(),
        connect_timeout_s=MISMATCH_CONNECT_TIMEOUT_S,
    )
    err, took_s = send_fails(settings)
    assert isinstance(err, StoreUnreachable), repr(err)
    assert err.cause == CAUSE_PLAINTEXT_SERVER and plain.commitlog.target in str(err)
    assert "plaintext" in str(err)
    assert took_s < TOLD_WITHIN_S, took_s


def test_a_tls_client_without_a_certificate_is_told_the_store_requires_one(
    secure: Cluster, secrets: Secrets
) -> None:
    settings = ClientSettings(
        commitlog=secure.commitlog.target,
        tls=secrets.tls(client_cert=False),
        token_file=str(secrets.token_file),
        connect_timeout_s=MISMATCH_CONNECT_TIMEOUT_S,
    )
    err, took_s = send_fails(settings)
    assert isinstance(err, StoreUnreachable), repr(err)
    assert err.cause == CAUSE_CLIENT_CERT_REQUIRED and secure.commitlog.target in str(err)
    assert "client certificate" in str(err) and "MQSTORE_TLS_CERT" in str(err)
    assert took_s < TOLD_WITHIN_S, took_s


def test_a_certificate_from_another_ca_is_told_apart_from_a_missing_one(
    secure: Cluster, secrets: Secrets
) -> None:
    """Unary calls (Admin) are told the same way, on the first failure."""
    other_cert = TlsSettings(
        ca_file=str(secrets.ca),
        cert_file=str(secrets.other_client_cert),
        key_file=str(secrets.other_client_key),
    )
    untrusting = secrets.tls(ca=secrets.other_ca)
    for tls, cause in ((other_cert, CAUSE_CLIENT_CERT_REJECTED),
                       (untrusting, CAUSE_SERVER_CERT_UNTRUSTED)):  # fmt: skip
        settings = ClientSettings(commitlog=secure.commitlog.target, tls=tls)
        with Admin(settings) as admin, pytest.raises(StoreUnreachable) as failed:
            admin.status()
        assert failed.value.cause == cause, str(failed.value)
        assert secure.commitlog.target in str(failed.value)


def test_a_missing_or_unknown_token_is_told_with_the_address_at_once(
    secure: Cluster, secrets: Secrets
) -> None:
    target = secure.commitlog.target
    missing = ClientSettings(commitlog=target, tls=secrets.tls())
    err, took_s = send_fails(missing)
    assert isinstance(err, Unauthenticated), repr(err)
    assert target in str(err) and "MQSTORE_TOKEN_FILE" in str(err)
    assert took_s < TOLD_WITHIN_S, took_s
    unknown = ClientSettings(
        commitlog=target, tls=secrets.tls(), token_file=str(secrets.unknown_token_file)
    )
    with Admin(unknown) as admin, pytest.raises(Unauthenticated) as failed:
        admin.status()
    assert target in str(failed.value)
    assert f"did not take the token in {secrets.unknown_token_file}" in str(failed.value)
    assert failed.value.details == "the bearer token is not valid"  # the store's words
    with Admin(replace_token(unknown, secrets)) as admin:
        assert admin.lag() == []  # the right token: it answers (no subscriber)


def replace_token(settings: ClientSettings, secrets: Secrets) -> ClientSettings:
    return ClientSettings(
        commitlog=settings.commitlog, tls=settings.tls, token_file=str(secrets.token_file)
    )


@pytest.mark.slow  # a commit log started, stopped and started again: ~15 s on 2 busy cores
def test_a_store_reached_once_is_retried_through_a_restart_longer_than_the_connect_deadline(
    tmp_path: Path,
) -> None:
    """The fast failure is for a store never reached: one that answered and went away (a
    restart, a failover) is waited for, within retry_timeout_s, as before."""
    c = start_commitlog(tmp_path / "store")
    try:
        settings = ClientSettings(commitlog=c.commitlog.target, connect_timeout_s=0.5)
        with Producer(settings, linger_ms=1) as producer:
            before = producer.send_sync("T", b"before")
            c.commitlog.stop()
            pending = producer.send("T", b"while down")
            time.sleep(4 * settings.connect_timeout_s)  # refused meanwhile, retried
            assert not pending.done(), pending.exception()
            c.restart_commitlog()
            after = pending.result(timeout=WAIT_S)
            assert after.commit_log_offset > before.commit_log_offset
            assert producer.stats.reconnects >= 1
    finally:
        c.stop_all()
