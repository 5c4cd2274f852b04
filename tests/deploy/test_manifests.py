"""The checklist K1-K24 over every rendered overlay, the index tier's replicas and shards, the
alerts' series, and proof that the checks catch the mistakes they are for."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy.manifest_checks import (
    CHECKS,
    FOLLOWERS,
    TIERS,
    Manifests,
    index_tier,
    replicas,
    shard_count,
    tier_settings,
)
from tests.deploy.tools import OVERLAYS, REPO

SOURCE_DIRS = ("mqstore", "commitlog_svc", "cq_svc", "index_svc")


@pytest.fixture(scope="module")
def manifests(rendered: dict[str, list[dict[str, Any]]]) -> dict[str, Manifests]:
    return {name: Manifests(docs) for name, docs in rendered.items()}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("item", sorted(CHECKS, key=lambda k: int(k[1:])))
def test_every_checklist_item_holds_for_every_tier(
    manifests: dict[str, Manifests], overlay: str, item: str
) -> None:
    m = manifests[overlay]
    problems = [p for tier in TIERS for p in CHECKS[item](m, tier)]
    assert problems == [], f"{overlay} {item}: {problems}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_index_tier_has_every_shard_with_equal_replicas(
    manifests: dict[str, Manifests], overlay: str
) -> None:
    m = manifests[overlay]
    assert index_tier(m) == []
    assert replicas(m, "index") >= shard_count(m)


def test_prod_runs_two_replicas_of_each_of_two_shards_and_dev_one_of_each(
    manifests: dict[str, Manifests],
) -> None:
    prod, dev = manifests["prod"], manifests["dev"]
    assert (shard_count(prod), replicas(prod, "index")) == (2, 4)
    assert (shard_count(dev), replicas(dev, "index")) == (2, 2)
    assert replicas(prod, "cq") == 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_followers_reach_the_commit_log_through_its_client_service(
    manifests: dict[str, Manifests], overlay: str
) -> None:
    m = manifests[overlay]
    port = tier_settings(m, "commitlog").port
    service = m.get("Service", "commitlog")
    assert service is not None
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    for tier in FOLLOWERS:
        assert tier_settings(m, tier).commitlog_target == f"commitlog:{port}"


def test_prod_serves_tls_and_tokens_from_secret_files(manifests: dict[str, Manifests]) -> None:
    m = manifests["prod"]
    for tier in TIERS:
        s = tier_settings(m, tier)
        mounts = {v["mountPath"] for v in m.container(tier)["volumeMounts"]}
        for path in (s.tls_cert_file, s.tls_key_file, s.tokens_file):
            assert path, f"{tier}: a TLS or token setting is empty in prod"
            assert any(path.startswith(mount + "/") for mount in mounts), path
        if tier in FOLLOWERS:
            assert s.commitlog_tls_ca_file and s.commitlog_token_file
    dev = manifests["dev"]
    assert all(not tier_settings(dev, t).tls_cert_file for t in TIERS)


def _metric_names_in_code() -> set[str]:
    names: set[str] = set()
    pattern = re.compile(r"\"(mqstore_[a-z0-9_]+|grpc_server_[a-z_]+)\"")
    for directory in SOURCE_DIRS:
        for path in (REPO / directory).rglob("*.py"):
            for name in pattern.findall(path.read_text(encoding="utf-8")):
                names.add(name)
    # prometheus_client adds _total to counters (and _bucket/_sum/_count to histograms).
    return names | {n + "_total" for n in names} | {n.removesuffix("_total") for n in names}


def test_every_mqstore_series_an_alert_uses_is_exported_by_the_services(
    manifests: dict[str, Manifests],
) -> None:
    exported = _metric_names_in_code()
    rules = manifests["prod"].of("PrometheusRule")
    assert rules, "prod has no PrometheusRule"
    alerts = [r for g in rules[0]["spec"]["groups"] for r in g["rules"]]
    wanted = {"volume", "flush", "dispatch", "crc", "restart"}  # volume: disk space
    covered = {w for w in wanted for a in alerts if w in (a["alert"] + a["expr"]).lower()}
    assert covered == wanted, f"no alert about {wanted - covered}"
    for alert in alerts:
        for name in re.findall(r"\bmqstore_[a-z0-9_]+", alert["expr"]):
            assert name in exported, f"{alert['alert']}: {name} is not a series the code exports"


# -- the checks catch what they are for -----------------------------------------------------------


def _container(docs: list[dict[str, Any]], tier: str) -> dict[str, Any]:
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == tier)
    containers: list[dict[str, Any]] = sts["spec"]["template"]["spec"]["containers"]
    return containers[0]


def _pod_spec(docs: list[dict[str, Any]], tier: str) -> dict[str, Any]:
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == tier)
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def _drop(kind: str, name: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        docs[:] = [d for d in docs if not (d["kind"] == kind and d["metadata"]["name"] == name)]

    return mutate


def _set_env(tier: str, name: str, value: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        env = _container(docs, tier)["env"]
        env[:] = [v for v in env if v["name"] != name] + [{"name": name, "value": value}]

    return mutate


def _cm_literal(base: str, key: str, value: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        for d in docs:
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(base + "-"):
                d["data"][key] = value

    return mutate


BROKEN: dict[str, tuple[str, str, Callable[[list[dict[str, Any]]], None]]] = {
    "no headless service": ("K2", "index", _drop("Service", "index-headless")),
    "headless hides not-ready pods": (
        "K2",
        "cq",
        lambda d: next(
            x for x in d if x["kind"] == "Service" and x["metadata"]["name"] == "cq-headless"
        )["spec"].pop("publishNotReadyAddresses"),
    ),
    "two commit logs": (
        "K4",
        "commitlog",
        lambda d: next(
            x for x in d if x["kind"] == "StatefulSet" and x["metadata"]["name"] == "commitlog"
        )["spec"].update(replicas=2),
    ),
    "probe on the API port": (
        "K6",
        "cq",
        lambda d: _container(d, "cq")["livenessProbe"]["grpc"].update(port=7200),
    ),
    "health port moved by env only": (
        "K6",
        "index",
        _set_env("index", "MQSTORE_INDEX_HEALTH_PORT", "9999"),
    ),
    "short startup": (
        "K7",
        "commitlog",
        lambda d: _container(d, "commitlog")["startupProbe"].update(failureThreshold=6),
    ),
    "readiness asks for liveness": (
        "K8",
        "index",
        lambda d: _container(d, "index")["readinessProbe"]["grpc"].update(service="liveness"),
    ),
    "grace shorter than the drain": (
        "K10",
        "commitlog",
        lambda d: _pod_spec(d, "commitlog").update(terminationGracePeriodSeconds=30),
    ),
    "drain made longer by env": ("K10", "cq", _set_env("cq", "MQSTORE_CQ_GRACE_PERIOD_S", "50")),
    "shell wrapper": (
        "K11",
        "cq",
        lambda d: _container(d, "cq").update(command=["sh", "-c", "python -m cq_svc"]),
    ),
    "no PDB": ("K12", "cq", _drop("PodDisruptionBudget", "cq")),
    "memory limit above the request": (
        "K14",
        "index",
        lambda d: _container(d, "index")["resources"]["limits"].update(memory="64Gi"),
    ),
    "root": ("K15", "cq", lambda d: _pod_spec(d, "cq")["securityContext"].update(runAsUser=0)),
    "writable root": (
        "K16",
        "commitlog",
        lambda d: _container(d, "commitlog")["securityContext"].update(
            readOnlyRootFilesystem=False
        ),
    ),
    "token mounted": (
        "K17",
        "index",
        lambda d: _pod_spec(d, "index").update(automountServiceAccountToken=True),
    ),
    "secret in the environment": (
        "K18",
        "cq",
        lambda d: _container(d, "cq")["env"].append(
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
        ),
    ),
    "subscriber id fixed": ("K19", "cq", _set_env("cq", "MQSTORE_CQ_SUBSCRIBER_ID", "cq")),
    "image by tag": (
        "K20",
        "cq",
        lambda d: _container(d, "cq").update(image="registry.example.com/mqstore/mqstore:latest"),
    ),
    "metrics port moved by env only": (
        "K21",
        "commitlog",
        _set_env("commitlog", "MQSTORE_COMMITLOG_METRICS_PORT", "9102"),
    ),
    "followers cut off from the log": ("K22", "commitlog", _drop("NetworkPolicy", "commitlog")),
    "HPA below the replica count": (
        "K23",
        "index",
        lambda d: next(x for x in d if x["kind"] == "HorizontalPodAutoscaler")["spec"].update(
            minReplicas=3
        ),
    ),
    "default namespace": (
        "K24",
        "cq",
        lambda d: next(x for x in d if x["kind"] == "PodDisruptionBudget")["metadata"].update(
            namespace="default"
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_check_names_the_mistake_it_is_for(
    rendered: dict[str, list[dict[str, Any]]], case: str
) -> None:
    item, tier, mutate = BROKEN[case]
    docs = copy.deepcopy(rendered["prod"])
    assert CHECKS[item](Manifests(docs), tier) == []
    mutate(docs)
    assert CHECKS[item](Manifests(docs), tier) != [], f"{item} missed: {case}"


@pytest.mark.parametrize(
    ("case", "mutate"),
    [
        ("three replicas over two shards", lambda d: next(
            x for x in d if x["kind"] == "StatefulSet" and x["metadata"]["name"] == "index"
        )["spec"].update(replicas=3)),
        ("shard index pinned", _set_env("index", "MQSTORE_INDEX_SHARD_FROM_ORDINAL", "false")),
        ("client in the wrong namespace", _cm_literal(
            "mqstore-client", "MQSTORE_INDEX", "dns-all:index.other.svc.cluster.local:7300"
        )),
    ],
)  # fmt: skip
def test_the_index_tier_check_names_uneven_shards_and_wrong_addresses(
    rendered: dict[str, list[dict[str, Any]]],
    case: str,
    mutate: Callable[[list[dict[str, Any]]], None],
) -> None:
    docs = copy.deepcopy(rendered["prod"])
    mutate(docs)
    assert index_tier(Manifests(docs)) != [], case
