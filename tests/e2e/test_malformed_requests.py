"""Issue 23, item 2: request bytes that do not parse cost nothing that lasts.

Rule: a request whose bytes are not the method's message is answered INVALID_ARGUMENT, keeps
no memory, is counted in mqstore_rpc_malformed_requests_total and is logged a few lines at
most, on every RPC of every service (API port: the service's methods and reflection; health
port: grpc.health.v1), through real service processes. Before the fix grpcio parsed the bytes
itself: INTERNAL, ~19 KB of anonymous memory kept per call and an ERROR with a traceback each.

The short form spreads MALFORMED_CALLS_SHORT calls over a service's methods; the full form
(MQSTORE_MALFORMED_CALLS=20000, docs/security.md) sends that many to every method, and `-s`
prints each service's figures.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mqstore.launcher import ServiceProcess
from mqstore.testing.cluster import Cluster, start_store
from tests.e2e.malformed import HEALTH, MALFORMED, Flood, api_methods, calls_from_env, flood

pytestmark = pytest.mark.timeout(1_800)

# Calls per service in `make test`: enough that the old ~19 KB a call (38 MiB) and ~500 B of
# log a call (1 MB) are far past the bounds, in a few seconds a service.
MALFORMED_CALLS_SHORT = 2_000
ANON_GROWTH_BYTES_MAX = 10 << 20  # the bound
LOG_GROWTH_BYTES_MAX = 8 << 10  # "a few KB": a burst of lines, then one a minute
MALFORMED_METRIC = "mqstore_rpc_malformed_requests_total"

SERVICES = {"commitlog": "commitlog_svc", "cq": "cq_svc", "index": "index_svc"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_store(tmp_path_factory.mktemp("malformed"))
    try:
        yield c
    finally:
        c.stop_all()


def process_of(c: Cluster, name: str) -> ServiceProcess:
    return c.commitlog if name == "commitlog" else c.followers[name]


def malformed_counted(process: ServiceProcess) -> float:
    url = f"http://127.0.0.1:{process.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == MALFORMED_METRIC
    )


def assert_nothing_kept(figures: Flood, name: str) -> None:
    assert figures.grown_mib * (1 << 20) <= ANON_GROWTH_BYTES_MAX, figures.figures(name)
    assert figures.log_bytes <= LOG_GROWTH_BYTES_MAX, figures.figures(name)


@pytest.mark.parametrize("name", list(SERVICES))
def test_malformed_requests_to_every_rpc_are_invalid_argument_and_keep_nothing(
    cluster: Cluster, name: str
) -> None:
    process = process_of(cluster, name)
    methods = api_methods(SERVICES[name])
    per_method = calls_from_env(0)
    calls = per_method * (len(methods) + len(HEALTH)) if per_method else MALFORMED_CALLS_SHORT
    counted_before = malformed_counted(process)
    with (
        grpc.insecure_channel(process.target) as api,
        grpc.insecure_channel(process.health_target) as health,
    ):
        channels = [(api, methods), (health, HEALTH)]
        warm_up = 4 * len(MALFORMED) * (len(methods) + len(HEALTH))
        figures = flood(process, channels, calls, warm_up_calls=warm_up)
    print(figures.figures(name), dict(figures.codes))
    codes = {code for _, code in figures.codes}
    assert codes == {"INVALID_ARGUMENT"}, figures.codes
    assert {m for m, _ in figures.codes} == {m.path for m in [*methods, *HEALTH]}
    assert malformed_counted(process) - counted_before == calls + warm_up
    assert_nothing_kept(figures, name)
    log = Path(process.log_path).read_text(encoding="utf-8")
    assert "Traceback" not in log and "Exception deserializing" not in log
