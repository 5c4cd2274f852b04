"""How a client in Kubernetes finds every index replica: `dns-all:HOST:PORT` (every address the
headless client Service's name resolves to, resolved again at each shard discovery), and the
TLS server name that goes with it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.client import Admin, ClientSettings, Producer
from mqstore.client.errors import Unavailable
from mqstore.client.settings import DNS_ALL_PREFIX, resolve_addresses
from mqstore.errors import InvalidArgument
from mqstore.testing.cluster import Cluster, start_store

# A name that never resolves (RFC 6761 reserves .invalid).
NOWHERE = "nothing.invalid"


def test_dns_all_becomes_every_address_of_the_name_in_order_once() -> None:
    got = resolve_addresses(["a:1", f"{DNS_ALL_PREFIX}localhost:7300", "a:1", "127.0.0.1:7300"])
    assert got[0] == "a:1"
    assert "127.0.0.1:7300" in got
    assert len(got) == len(set(got))
    assert all(not a.startswith(DNS_ALL_PREFIX) for a in got)


def test_dns_all_of_an_ipv6_literal_keeps_brackets() -> None:
    assert resolve_addresses([f"{DNS_ALL_PREFIX}[::1]:7300"]) == ("[::1]:7300",)


def test_a_name_without_addresses_contributes_nothing() -> None:
    assert resolve_addresses([f"{DNS_ALL_PREFIX}{NOWHERE}:7300", "x:1"]) == ("x:1",)


@pytest.mark.parametrize(
    "bad", ["dns-all:index", "dns-all:index:http", "dns-all::7300", "dns-all:i:0"]
)
def test_a_malformed_dns_all_entry_is_refused_when_the_settings_are_made(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        ClientSettings(index=(bad,))


def test_the_environment_sets_the_tls_server_name_for_addresses_by_ip() -> None:
    s = ClientSettings.from_env(
        {
            "MQSTORE_INDEX": "dns-all:index.mqstore.svc.cluster.local:7300",
            "MQSTORE_TLS_CA": "/run/secrets/mqstore/tls/ca.crt",
            "MQSTORE_TLS_SERVER_NAME": "index.mqstore.svc.cluster.local",
        }
    )
    assert s.index == ("dns-all:index.mqstore.svc.cluster.local:7300",)
    assert s.tls is not None and s.tls.server_name == "index.mqstore.svc.cluster.local"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_store(Path(tmp_path_factory.mktemp("store")))
    try:
        yield c
    finally:
        c.stop_all()


def test_the_admin_finds_replicas_through_a_dns_all_name(store: Cluster) -> None:
    port = store.followers["index"].ports["port"]
    settings = ClientSettings(
        commitlog=store.commitlog.target,
        cq=(store.followers["cq"].target,),
        index=(f"{DNS_ALL_PREFIX}localhost:{port}",),
    )
    with Producer(settings) as producer:
        producer.send("Dns", b"found", key="k-1").result(timeout=30)
    with Admin(settings) as admin:
        found: list[bytes] = []
        for _ in range(200):  # the index applies the message a moment after the append
            found = [m.body for m in admin.query_by_key("Dns", "k-1")]
            if found:
                break
            time.sleep(0.05)
        assert found == [b"found"]
        assert [r.address for r in admin.status().index if r.reachable] == [f"127.0.0.1:{port}"]


def test_the_admin_says_when_the_name_has_no_replica(store: Cluster) -> None:
    settings = ClientSettings(
        commitlog=store.commitlog.target, index=(f"{DNS_ALL_PREFIX}{NOWHERE}:7300",)
    )
    with Admin(settings) as admin, pytest.raises(Unavailable, match="resolve to no address"):
        admin.query_by_key("Dns", "k-1")


def test_the_sdk_reaches_the_commit_log_through_a_dns_all_name(store: Cluster) -> None:
    """MQSTORE_COMMITLOG=dns-all:HOST:PORT (a broker group's headless Service): every address
    the name resolves to is a replica to try, and the leader among them is taken."""
    port = store.commitlog.ports["port"]
    settings = ClientSettings(
        commitlog=f"{DNS_ALL_PREFIX}localhost:{port}", cq=(store.followers["cq"].target,)
    )
    with Producer(settings) as producer:
        producer.send("DnsLog", b"appended").result(timeout=30)
    with Admin(settings) as admin:
        assert admin.status().commitlog.address == f"127.0.0.1:{port}"


def test_a_malformed_dns_all_commit_log_address_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="dns-all:HOST:PORT") as refused:
        ClientSettings(commitlog="dns-all:commitlog")
    assert refused.value.field == "commitlog"
