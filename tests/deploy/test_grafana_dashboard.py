"""deploy/grafana/mqstore-dashboard.json: a dashboard Grafana 10/11 imports (datasource as a
variable, unique panel ids, every panel with a datasource and a query), whose every PromQL
query names only metrics the services really export, as scraped from their /metrics after
produce, consume and index traffic: commitlog_svc, cq_svc and index_svc of one store, and a
broker group of two commit-log replicas on etcd for the replication panels."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mqstore.client import Admin, ClientSettings, Consumer, Producer
from mqstore.coordination.etcd_process import EtcdProcess
from mqstore.launcher import ServiceProcess
from mqstore.testing.cluster import Cluster, start_store
from tests.coordination.conftest import etcd  # noqa: F401 - the session's etcd, a fixture
from tests.replication.test_group_processes import start_replica

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "mqstore-dashboard.json"
DATASOURCE_UID = "${datasource}"
GRID_COLUMNS = 24
WAIT_S = 30.0

# -- metric names out of PromQL ------------------------------------------------------------------

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")  # [5m], [$__rate_interval], [1h:5m]
_MATCHERS = re.compile(r"\{[^}]*\}")  # {grpc_code!="OK"}: label names and values
# Label lists of aggregations and vector matching: by (le, kind), on (pod), group_left(x).
_LABEL_LIST = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", re.IGNORECASE
)
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")  # Grafana's $__rate_interval, ${var}
_IDENTIFIER = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "start", "end", "inf", "nan", "atan2"}
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not a function
    (followed by `(`), a keyword, a label (in {...} or a by/on list), a duration or a variable."""
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names = set()
    for m in _IDENTIFIER.finditer(text):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("sum(rate(mqstore_commitlog_appended_messages_total[$__rate_interval]))",
         {"mqstore_commitlog_appended_messages_total"}),
        ('sum by (grpc_code) (rate(grpc_server_handled_total{grpc_code!="OK"}[5m]))',
         {"grpc_server_handled_total"}),
        ("histogram_quantile(0.99, sum by (le, kind) (rate(x_seconds_bucket[1m])))",
         {"x_seconds_bucket"}),
        ("max by (instance) (a_used_bytes / a_total_bytes) > 0.75",
         {"a_used_bytes", "a_total_bytes"}),
        ('max(a) and on (pod) (b{role="leader"} == 1) unless c offset 5m', {"a", "b", "c"}),
        ("sum without (queue) (a) / ignoring (x) group_left (y) b", {"a", "b"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)")', {"up"}),
        ("1e3 * rate(a[${window}]) + 0x1f", {"a"}),
        ('{__name__="hidden"}', set()),
    ],
)  # fmt: skip
def test_metric_names_are_read_out_of_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


# -- the dashboard's structure -------------------------------------------------------------------


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def query_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel but rows, rows' nested panels included."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def test_the_dashboard_is_an_importable_grafana_model() -> None:
    d = load()
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    assert "id" not in d or d["id"] is None  # an id would overwrite another dashboard
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    every = [*d["panels"], *(p for r in d["panels"] for p in r.get("panels", []))]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in every:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= GRID_COLUMNS, p["title"]
        mine = {(g["y"] + dy, g["x"] + dx) for dy in range(g["h"]) for dx in range(g["w"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine

    panels = list(query_panels(d))
    assert len(panels) >= 20
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DATASOURCE_UID, p["title"]
            assert t["expr"].strip() and metric_names(t["expr"]), (p["title"], t["expr"])


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    """Produce and consume rates, group and dispatch lag, flush latency, disk, replication."""
    titles = {p["title"] for p in query_panels(load())}
    for wanted in (
        "Produce rate",
        "Consume rate",
        "Consumer group lag",
        "Dispatch lag (bytes)",
        "Flush latency",
        "Disk used",
        "Replica role",
        "Replica lag (bytes)",
        "Replica lag (seconds)",
        "In-sync replicas",
    ):
        assert wanted in titles


# -- every metric named is one the services export ------------------------------------------------


def scrape(process: ServiceProcess) -> str:
    url = f"http://127.0.0.1:{process.ports['metrics_port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode("utf-8")
    return text


def exported(text: str) -> set[str]:
    """The sample names of a Prometheus text exposition (histograms as _bucket, _sum, _count)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def eventually(probe: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {WAIT_S} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_store(tmp_path_factory.mktemp("grafana-store"))
    try:
        yield cluster
    finally:
        cluster.stop_all()


def traffic(c: Cluster) -> None:
    """Produce with keys, consume as a group and commit, query the index."""
    settings = ClientSettings(
        commitlog=c.commitlog.target,
        cq=(c.followers["cq"].target,),
        index=(c.followers["index"].target,),
    )
    topic = "dash-orders"
    with Producer(settings) as producer:
        for i in range(20):
            producer.send_sync(topic, f"order {i}".encode(), key=f"order-{i}")
    with Admin(settings) as admin:
        eventually(lambda: sum(q.max_offset for q in admin.queues(topic)) == 20, "dispatched")
        with Consumer(settings, topic, group="dashboard", long_poll_ms=0) as consumer:
            got = list(consumer.messages(follow=False, limit=5))
            consumer.commit()
        assert len(got) == 5
        eventually(lambda: bool(admin.query_by_key(topic, "order-3")), "indexed")


@pytest.mark.slow
def test_every_query_names_a_metric_the_services_export(
    store: Cluster,
    etcd: EtcdProcess,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    traffic(store)
    names: set[str] = set()
    for process in (store.commitlog, *store.followers.values()):
        names |= exported(scrape(process))
    # The group read 5 of the 20 messages and committed: its lag is the other 15, as `mqstore
    # groups` counts it.
    lag = 'mqstore_cq_group_lag_messages{group="dashboard",topic="dash-orders"} 15.0'
    assert lag in scrape(store.followers["cq"])

    # A broker group of two replicas: the leader's in-sync set and lag, each one's role.
    replicas = [start_replica(tmp_path, n, etcd, "grafana-dashboard") for n in ("r0", "r1")]
    try:

        def leader_with_follower() -> bool:
            texts = [scrape(r) for r in replicas]
            return any(
                'mqstore_replica_role{role="leader"} 1.0' in t and "mqstore_replica_lag_bytes{" in t
                for t in texts
            )

        eventually(leader_with_follower, "a leader with a follower in its lag table")
        for r in replicas:
            names |= exported(scrape(r))
    finally:
        for r in replicas:
            r.stop()

    unknown = {
        (p["title"], name)
        for p in query_panels(load())
        for t in p["targets"]
        for name in metric_names(t["expr"])
        if name not in names
    }
    assert not unknown, f"panels name metrics no service exports: {sorted(unknown)}"
