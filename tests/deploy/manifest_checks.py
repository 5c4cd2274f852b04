"""The checklist K1-K24 (shared/reference/ops-and-reliability.md §1.3) as functions over the
rendered documents of one overlay, and R1-R6 for the commit log's broker group and its etcd
(issue 24). Each check returns the problems it finds ([] = holds), so that a test can also feed
it a broken manifest and see the problem named.

The services' own settings classes read the rendered ConfigMap and each container's environment
(`tier_settings`), so a check compares the manifests with what the processes will really do:
ports, drain and grace times, data directory, subscriber id, shard.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import click

from commitlog_svc.settings import CommitLogSettings
from cq_svc.settings import CqSettings
from index_svc.settings import IndexSettings
from mqstore.cli.cluster import (
    STATUS_TIMEOUT_S,
    SWITCHOVER_CALL_SLACK_S,
    cluster_switchover,
)
from mqstore.client.settings import DNS_ALL_PREFIX
from mqstore.coordination.etcd_process import min_lease_ttl_s
from mqstore.rpc.settings import FollowerSettings, ServiceSettings

Doc = dict[str, Any]

TIERS = ("commitlog", "cq", "index")
FOLLOWERS = ("cq", "index")
MODULES = {"commitlog": "commitlog_svc", "cq": "cq_svc", "index": "index_svc"}
SETTINGS: dict[str, type[ServiceSettings]] = {
    "commitlog": CommitLogSettings,
    "cq": CqSettings,
    "index": IndexSettings,
}
HEALTH_SERVICES = {"startup": "startupProbe", "readiness": "readinessProbe"}
# What the final flush and checkpoint may take after the calls in flight are done (a sync-flush
# log has little dirty data; an async one up to flush_interval_ms of writes).
FLUSH_BUDGET_S = 30.0
# The worst replay a startup probe must allow: the commit log's recovery walk (~2 us a record,
# docs/status.md) over a dirty 1 GiB segment of 100 B records is ~20 s; a 20-minute budget
# leaves room for slow disks and page-cache misses. Followers only open their files at
# startup (their replay is gated by readiness, which never restarts a pod).
STARTUP_BUDGET_S = {"commitlog": 1_200, "cq": 300, "index": 300}
MIN_RUN_AS_ID = 10_000
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
HASHED_NAME = re.compile(r"^(?P<base>.+)-[a-z0-9]{10}$")
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
CONFIG_ENV = "MQSTORE_CONFIG"
SHELLS = ("sh", "bash", "/bin/sh", "/bin/bash", "-c")
# A broker group's sizes (issue 24: N = 1, 3 or 5; one replica is `make run`, not a group).
GROUP_SIZES = (3, 5)
# Tiers whose replicas must not share a node: a node's loss may take one replica, not two.
ONE_PER_NODE = ("commitlog",)
# How the image runs the mqstore command (the venv's bin/ is on PATH; or the module).
MQSTORE_COMMANDS = (["mqstore"], ["python", "-m", "mqstore.cli"])
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
# etcd: the oldest 3.5 release free of the data inconsistency bugs of 3.5.0-3.5.5 (the
# Kubernetes docs' minimum for production).
ETCD_VERSION_MIN = (3, 5, 6)
ETCD_PEER_PORT = 2380
ETCD_NAME = "etcd"
CLUSTER_DOMAIN = "svc.cluster.local"
VAR_REF = re.compile(r"\$\$|\$\(([^)]+)\)")


@dataclass
class Manifests:
    """The documents of one rendered overlay (not to be changed while this object is in use:
    it keeps the settings each pod loads)."""

    docs: list[Doc]
    loaded: dict[tuple[str, int], ServiceSettings] = field(default_factory=dict, repr=False)

    def of(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d.get("kind") == kind]

    def get(self, kind: str, name: str) -> Doc | None:
        for d in self.of(kind):
            if d["metadata"]["name"] == name:
                return d
        return None

    def sts(self, tier: str) -> Doc:
        found = self.get("StatefulSet", tier)
        if found is None:
            raise KeyError(f"no StatefulSet {tier}")
        return found

    def pod(self, tier: str) -> Doc:
        return self.sts(tier)["spec"]["template"]

    def container(self, tier: str) -> Doc:
        containers = self.pod(tier)["spec"]["containers"]
        return next(c for c in containers if c["name"] == tier)

    @property
    def namespace(self) -> str:
        return str(self.sts("commitlog")["metadata"].get("namespace", ""))

    def configmap(self, name: str) -> dict[str, str]:
        found = self.get("ConfigMap", name)
        if found is None:
            raise KeyError(f"no ConfigMap {name}")
        return dict(found.get("data") or {})

    def configmap_named(self, base: str) -> Doc:
        """The generated ConfigMap whose name is `base` plus kustomize's hash."""
        for d in self.of("ConfigMap"):
            m = HASHED_NAME.match(d["metadata"]["name"])
            if m and m.group("base") == base:
                return d
        raise KeyError(f"no generated ConfigMap {base}")

    def env(self, tier: str, ordinal: int) -> dict[str, str]:
        """The container's environment as pod `<tier>-<ordinal>` sees it, with $(VAR)
        references to variables defined before expanded, as the kubelet does."""
        c = self.container(tier)
        out: dict[str, str] = {}
        for source in c.get("envFrom", []):
            out.update(self.configmap(source["configMapRef"]["name"]))
        for var in c.get("env", []):
            if "value" in var:
                out[var["name"]] = expand(str(var["value"]), out)
                continue
            ref = var["valueFrom"]
            if "fieldRef" in ref:
                path = ref["fieldRef"]["fieldPath"]
                assert path in ("metadata.name", "metadata.namespace"), ref
                out[var["name"]] = (
                    f"{tier}-{ordinal}" if path == "metadata.name" else self.namespace
                )
            elif "configMapKeyRef" in ref:
                key = ref["configMapKeyRef"]
                out[var["name"]] = self.configmap(key["name"])[key["key"]]
            else:
                out[var["name"]] = "<from a Secret>"  # k18 names it: secrets are files
        return out

    def mounted_file(self, tier: str, path: str) -> str:
        """The text of a file the container sees at `path`, from a mounted ConfigMap."""
        volumes = {v["name"]: v for v in self.pod(tier)["spec"].get("volumes", [])}
        for m in self.container(tier).get("volumeMounts", []):
            prefix = m["mountPath"].rstrip("/") + "/"
            if not path.startswith(prefix):
                continue
            volume = volumes.get(m["name"], {})
            if "configMap" in volume:
                return self.configmap(volume["configMap"]["name"])[path[len(prefix) :]]
        raise KeyError(f"{tier}: nothing mounts {path} from a ConfigMap")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command, args and env values: $(NAME) becomes the variable's
    value when the container defines it (else stays as written), $$ becomes $."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return VAR_REF.sub(one, text)


def command_line(m: Manifests, tier: str, ordinal: int) -> list[str]:
    """The container's command and args as pod `<tier>-<ordinal>` runs them."""
    c = m.container(tier)
    env = m.env(tier, ordinal)
    return [expand(part, env) for part in c["command"] + c.get("args", [])]


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_") and k != "POD_NAME"}
    with mock.patch.dict(os.environ, {**kept, **env}, clear=True):
        yield


def tier_settings(m: Manifests, tier: str, ordinal: int = 0) -> ServiceSettings:
    """The settings the service of `tier` loads in pod `<tier>-<ordinal>`: its class, the
    rendered TOML file, the container's environment and its command-line flags."""
    kept = m.loaded.get((tier, ordinal))
    if kept is None:
        kept = m.loaded[(tier, ordinal)] = _load_settings(m, tier, ordinal)
    return kept


def _load_settings(m: Manifests, tier: str, ordinal: int) -> ServiceSettings:
    env = m.env(tier, ordinal)
    flags = command_line(m, tier, ordinal)[3:]  # after python -m <module>
    with tempfile.TemporaryDirectory() as tmp:
        if CONFIG_ENV in env:
            local = Path(tmp) / "mqstore.toml"
            local.write_text(m.mounted_file(tier, env[CONFIG_ENV]), encoding="utf-8")
            env = {**env, CONFIG_ENV: str(local)}
        with _environment(env):
            return SETTINGS[tier].load(flags)


def replicas(m: Manifests, tier: str) -> int:
    return int(m.sts(tier)["spec"].get("replicas", 1))


def shard_count(m: Manifests) -> int:
    s = tier_settings(m, "index", 0)
    assert isinstance(s, IndexSettings)
    return s.shard_count


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _port(c: Doc, name: str) -> int | None:
    for p in c.get("ports", []):
        if p.get("name") == name:
            return int(p["containerPort"])
    return None


def _services_selecting(m: Manifests, tier: str) -> list[Doc]:
    labels = m.pod(tier)["metadata"]["labels"]
    return [
        s for s in m.of("Service") if _labels_match(s["spec"].get("selector") or {"": "-"}, labels)
    ]


# -- the checks: each (m, tier) -> problems ----------------------------------------------------


def k1_workload(m: Manifests, tier: str) -> list[str]:
    if m.get("StatefulSet", tier) is None:
        return [f"{tier} is not a StatefulSet"]
    if m.get("Deployment", tier) is not None:
        return [f"{tier} is also a Deployment"]
    return []


def k2_headless_service(m: Manifests, tier: str) -> list[str]:
    name = m.sts(tier)["spec"].get("serviceName")
    svc = m.get("Service", name) if name else None
    if svc is None:
        return [f"{tier}: serviceName {name!r} names no Service"]
    spec = svc["spec"]
    problems = []
    if spec.get("clusterIP") != "None":
        problems.append(f"{name} is not headless")
    if spec.get("publishNotReadyAddresses") is not True:
        problems.append(f"{name} does not publish not-ready addresses")
    if not _labels_match(spec.get("selector", {}), m.pod(tier)["metadata"]["labels"]):
        problems.append(f"{name} does not select the {tier} pods")
    grpc_ports = [p for p in spec.get("ports", []) if p["name"] == "grpc"]
    if not grpc_ports or grpc_ports[0].get("appProtocol") != "grpc":
        problems.append(f"{name}: its grpc port lacks appProtocol grpc")
    return problems


def k3_client_service(m: Manifests, tier: str) -> list[str]:
    if tier == "commitlog":
        # A broker group has no client Service: a load-balanced address would send appends to
        # followers. Clients and followers take every replica's own name (R3).
        balanced = [
            s["metadata"]["name"]
            for s in _services_selecting(m, tier)
            if s["spec"].get("clusterIP") != "None"
        ]
        if balanced:
            return [f"commitlog: Service {balanced} balances over the replicas (give every name)"]
        return []
    svc = m.get("Service", tier)
    if svc is None:
        return [f"no client Service {tier}"]
    spec = svc["spec"]
    problems = []
    if spec.get("publishNotReadyAddresses"):
        problems.append(f"client Service {tier} lists pods that are not ready")
    if not _labels_match(spec.get("selector", {}), m.pod(tier)["metadata"]["labels"]):
        problems.append(f"client Service {tier} does not select the {tier} pods")
    api = tier_settings(m, tier).port
    if [p["port"] for p in spec.get("ports", [])] != [api]:
        problems.append(f"client Service {tier} should offer the API port {api} alone")
    # The SDK must reach every index replica by itself (shard routing), so the index tier's
    # client Service is headless: its name resolves to one address per ready pod.
    if tier == "index" and spec.get("clusterIP") != "None":
        problems.append("client Service index must be headless (the SDK resolves every pod)")
    return problems


def k4_pod_management(m: Manifests, tier: str) -> list[str]:
    spec = m.sts(tier)["spec"]
    policy = spec.get("podManagementPolicy", "OrderedReady")
    if tier == "commitlog":
        # Parallel: with OrderedReady, a commitlog-0 that may not lead (outside the in-sync set)
        # would keep commitlog-1 and -2 from ever starting after a whole-group restart.
        problems = [] if policy == "Parallel" else ["commitlog replicas must start in Parallel"]
        if replicas(m, tier) not in GROUP_SIZES:
            problems.append(
                f"commitlog runs {replicas(m, tier)} replicas: a broker group has "
                f"{' or '.join(map(str, GROUP_SIZES))}"
            )
        return problems
    return [] if policy == "Parallel" else [f"{tier} replicas are symmetric: use Parallel"]


def k5_volume_claims(m: Manifests, tier: str) -> list[str]:
    claims = m.sts(tier)["spec"].get("volumeClaimTemplates", [])
    data = [c for c in claims if c["metadata"]["name"] == "data"]
    if not data:
        return [f"{tier} has no data volume claim"]
    spec = data[0]["spec"]
    problems = []
    if spec.get("accessModes") != ["ReadWriteOnce"]:
        problems.append(f"{tier}: data claim is not ReadWriteOnce")
    if not spec.get("storageClassName"):
        problems.append(f"{tier}: data claim names no storageClassName")
    if not spec.get("resources", {}).get("requests", {}).get("storage"):
        problems.append(f"{tier}: data claim has no size")
    data_dir = tier_settings(m, tier).data_dir
    mounts = {v["name"]: v["mountPath"] for v in m.container(tier).get("volumeMounts", [])}
    if mounts.get("data") != data_dir:
        problems.append(
            f"{tier}: the data claim is mounted at {mounts.get('data')}, not {data_dir}"
        )
    if "persistentVolumeClaimRetentionPolicy" not in m.sts(tier)["spec"]:
        problems.append(f"{tier}: no persistentVolumeClaimRetentionPolicy chosen")
    return problems


def k6_health_port(m: Manifests, tier: str) -> list[str]:
    s = tier_settings(m, tier)
    c = m.container(tier)
    problems = []
    if _port(c, "health") != s.health_port:
        problems.append(f"{tier}: container port 'health' is not health_port {s.health_port}")
    if s.host not in ("0.0.0.0", "::"):
        problems.append(f"{tier}: binds {s.host}: probes reach the pod IP")
    if s.health_port in (s.port, s.metrics_port):
        problems.append(f"{tier}: the health port must be a port of its own")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc = c.get(probe, {}).get("grpc")
        if not grpc or grpc.get("port") != s.health_port:
            problems.append(f"{tier}: {probe} is not a gRPC probe of port {s.health_port}")
    return problems


def _probe_service(m: Manifests, tier: str, probe: str, service: str) -> list[str]:
    p = m.container(tier).get(probe)
    if p is None:
        return [f"{tier} has no {probe}"]
    if p.get("grpc", {}).get("service") != service:
        return [f"{tier}: {probe} should ask for health service {service!r}"]
    return []


def k7_startup_probe(m: Manifests, tier: str) -> list[str]:
    problems = _probe_service(m, tier, "startupProbe", "startup")
    p = m.container(tier).get("startupProbe", {})
    period = int(p.get("periodSeconds", 10))
    budget = period * int(p.get("failureThreshold", 3))
    if not 5 <= period <= 10:
        problems.append(f"{tier}: startupProbe period {period} s (5-10 s expected)")
    if budget < STARTUP_BUDGET_S[tier]:
        problems.append(
            f"{tier}: startupProbe allows {budget} s, less than the replay budget "
            f"{STARTUP_BUDGET_S[tier]} s"
        )
    return problems


def k8_readiness_probe(m: Manifests, tier: str) -> list[str]:
    return _probe_service(m, tier, "readinessProbe", "readiness")


def k9_liveness_probe(m: Manifests, tier: str) -> list[str]:
    problems = _probe_service(m, tier, "livenessProbe", "liveness")
    p = m.container(tier).get("livenessProbe", {})
    if int(p.get("failureThreshold", 3)) * int(p.get("periodSeconds", 10)) < 30:
        problems.append(f"{tier}: livenessProbe restarts within 30 s of a stall")
    return problems


def k10_grace(m: Manifests, tier: str) -> list[str]:
    s = tier_settings(m, tier)
    spec = m.pod(tier)["spec"]
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    # The preStop hook runs first, inside the same grace period.
    switchover = prestop_switchover(m, tier)
    hook_s = switchover.bound_s if switchover is not None else 0.0
    needed = hook_s + s.drain_delay_s + s.grace_period_s + FLUSH_BUDGET_S
    problems = []
    if grace < needed:
        problems.append(
            f"{tier}: terminationGracePeriodSeconds {grace} < preStop {hook_s} + drain "
            f"{s.drain_delay_s} + grace {s.grace_period_s} + flush {FLUSH_BUDGET_S}"
        )
    if s.drain_delay_s <= 0:
        problems.append(f"{tier}: no drain delay: endpoints still send calls after SIGTERM")
    return problems


def k11_sigterm_reaches_the_service(m: Manifests, tier: str) -> list[str]:
    """The service handles SIGTERM itself (drain, stop, flush): it must be PID 1, started in
    exec form without a shell in between. No preStop hook may eat into the grace, except the
    commit log's, which must be exactly the leadership handover (`switchover_problems`)."""
    c = m.container(tier)
    command = c.get("command", [])
    problems = []
    if command[:3] != ["python", "-m", MODULES[tier]]:
        problems.append(f"{tier}: command {command} is not `python -m {MODULES[tier]}`")
    if any(part in SHELLS for part in command):
        problems.append(f"{tier}: a shell in the command would swallow SIGTERM")
    if tier == "commitlog":
        problems += switchover_problems(m)
    elif c.get("lifecycle", {}).get("preStop"):
        problems.append(f"{tier}: a preStop hook counts against the grace period")
    return problems


def k12_pdb(m: Manifests, tier: str) -> list[str]:
    labels = m.pod(tier)["metadata"]["labels"]
    pdbs = [
        p
        for p in m.of("PodDisruptionBudget")
        if _labels_match(p["spec"]["selector"].get("matchLabels", {}), labels)
    ]
    if len(pdbs) != 1:
        return [f"{tier}: {len(pdbs)} PodDisruptionBudgets select it (1 expected)"]
    pdb = pdbs[0]
    problems = []
    if pdb["apiVersion"] != "policy/v1":
        problems.append(f"{tier}: PDB is not policy/v1")
    if tier == "commitlog":
        # A voluntary eviction only while min_insync others are ready (leader or in sync):
        # appends never stop for a drain; and below the replica count, or no drain could go.
        k = tier_settings(m, tier).min_insync
        n = replicas(m, tier)
        least = pdb["spec"].get("minAvailable")
        if "maxUnavailable" in pdb["spec"] or not isinstance(least, int):
            problems.append("commitlog: PDB should be minAvailable (a number), not a percentage")
        elif not k <= least < n:
            problems.append(
                f"commitlog: PDB minAvailable {least} should be at least min_insync {k} and "
                f"below the {n} replicas"
            )
        return problems
    if pdb["spec"].get("maxUnavailable") != 1 or "minAvailable" in pdb["spec"]:
        problems.append(f"{tier}: PDB should be maxUnavailable: 1")
    return problems


def k13_spread(m: Manifests, tier: str) -> list[str]:
    spec = m.pod(tier)["spec"]
    labels = m.pod(tier)["metadata"]["labels"]
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    terms = [
        t.get("podAffinityTerm", t)
        for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        + anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    ]
    problems = []
    if not any(
        t.get("topologyKey") == HOSTNAME
        and t.get("labelSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == tier
        and _labels_match(t["labelSelector"]["matchLabels"], labels)
        for t in terms
    ):
        problems.append(f"{tier}: no pod anti-affinity on {HOSTNAME} among its own pods")
    if tier in ONE_PER_NODE and not _required_apart(m, tier):
        problems.append(
            f"{tier}: replicas must be on different nodes (required anti-affinity on {HOSTNAME})"
        )
    if not any(
        t.get("topologyKey") == ZONE and t.get("whenUnsatisfiable") == "ScheduleAnyway"
        for t in spec.get("topologySpreadConstraints", [])
    ):
        problems.append(f"{tier}: no zone spread (ScheduleAnyway)")
    return problems


def _required_apart(m: Manifests, name: str) -> bool:
    """Does the StatefulSet require its pods on different nodes?"""
    labels = m.pod(name)["metadata"]["labels"]
    anti = m.pod(name)["spec"].get("affinity", {}).get("podAntiAffinity", {})
    return any(
        t.get("topologyKey") == HOSTNAME
        and t.get("labelSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == name
        and _labels_match(t["labelSelector"]["matchLabels"], labels)
        for t in anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    )


def k14_resources(m: Manifests, tier: str) -> list[str]:
    r = m.container(tier).get("resources", {})
    requests, limits = r.get("requests", {}), r.get("limits", {})
    problems = []
    if not requests.get("memory") or requests.get("memory") != limits.get("memory"):
        problems.append(f"{tier}: memory request must equal the limit (page cache is charged)")
    if not requests.get("cpu"):
        problems.append(f"{tier}: no CPU request")
    return problems


def k15_pod_security(m: Manifests, tier: str) -> list[str]:
    sc = m.pod(tier)["spec"].get("securityContext", {})
    problems = []
    if sc.get("runAsNonRoot") is not True:
        problems.append(f"{tier}: pod not runAsNonRoot")
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if int(sc.get(key, 0)) < MIN_RUN_AS_ID:
            problems.append(f"{tier}: pod {key} below {MIN_RUN_AS_ID}")
    if sc.get("fsGroupChangePolicy") != "OnRootMismatch":
        problems.append(f"{tier}: fsGroupChangePolicy should be OnRootMismatch")
    if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append(f"{tier}: seccomp profile is not RuntimeDefault")
    return problems


def k16_container_security(m: Manifests, tier: str) -> list[str]:
    c = m.container(tier)
    sc = c.get("securityContext", {})
    problems = []
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{tier}: privilege escalation allowed")
    if sc.get("readOnlyRootFilesystem") is not True:
        problems.append(f"{tier}: root filesystem writable")
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc["capabilities"].get("add"):
        problems.append(f"{tier}: capabilities not all dropped")
    if sc.get("privileged"):
        problems.append(f"{tier}: privileged")
    mounts = {v["mountPath"]: v["name"] for v in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in m.pod(tier)["spec"].get("volumes", [])}
    if "emptyDir" not in volumes.get(mounts.get("/tmp", ""), {}):
        problems.append(f"{tier}: no writable emptyDir at /tmp")
    if m.env(tier, 0).get("PYTHONDONTWRITEBYTECODE") != "1":
        problems.append(f"{tier}: PYTHONDONTWRITEBYTECODE is not set")
    return problems


def k17_service_account_token(m: Manifests, tier: str) -> list[str]:
    spec = m.pod(tier)["spec"]
    problems = []
    if spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{tier}: the API token is mounted")
    sa = m.get("ServiceAccount", spec.get("serviceAccountName", "default"))
    if sa is None or spec.get("serviceAccountName") in (None, "default"):
        problems.append(f"{tier}: runs under the default service account")
    elif sa.get("automountServiceAccountToken") is not False:
        problems.append(f"{tier}: its ServiceAccount mounts the API token")
    return problems


def k18_config_and_secrets(m: Manifests, tier: str) -> list[str]:
    c = m.container(tier)
    problems = []
    names = [
        v["configMap"]["name"] for v in m.pod(tier)["spec"].get("volumes", []) if "configMap" in v
    ]
    names += [s["configMapRef"]["name"] for s in c.get("envFrom", [])]
    for name in names:
        if not HASHED_NAME.match(name):
            problems.append(f"{tier}: ConfigMap {name} is not generated (no hash: no rollout)")
    if CONFIG_ENV not in m.env(tier, 0):
        problems.append(f"{tier}: {CONFIG_ENV} does not point at the mounted settings")
    for var in c.get("env", []):
        if "secretKeyRef" in var.get("valueFrom", {}):
            problems.append(f"{tier}: {var['name']} takes a secret into the environment")
    if any("secretRef" in s for s in c.get("envFrom", [])):
        problems.append(f"{tier}: envFrom a Secret: secrets belong in files")
    secret_volumes = {v["name"] for v in m.pod(tier)["spec"].get("volumes", []) if "secret" in v}
    for mount in c.get("volumeMounts", []):
        if mount["name"] in secret_volumes and mount.get("readOnly") is not True:
            problems.append(f"{tier}: secret volume {mount['name']} is writable")
    return problems


def k19_identity(m: Manifests, tier: str) -> list[str]:
    spec = m.pod(tier)["spec"]
    problems = []
    if spec.get("enableServiceLinks") is not False:
        problems.append(f"{tier}: service links on (env vars for every Service)")
    downward = [
        v
        for v in m.container(tier).get("env", [])
        if v["name"] == "POD_NAME"
        and v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
    ]
    if not downward:
        problems.append(f"{tier}: POD_NAME does not come from the downward API")
    if tier in FOLLOWERS:
        for ordinal in range(replicas(m, tier)):
            s = tier_settings(m, tier, ordinal)
            subscriber = getattr(s, "subscriber_id", None)
            if subscriber != f"{tier}-{ordinal}":
                problems.append(f"{tier}-{ordinal} subscribes as {subscriber!r}, not its pod name")
    return problems


def k20_image(m: Manifests, tier: str) -> list[str]:
    c = m.container(tier)
    problems = []
    if not DIGEST.search(c.get("image", "")):
        problems.append(f"{tier}: image {c.get('image')} is not pinned by digest")
    if c.get("imagePullPolicy") not in ("IfNotPresent", "Always"):
        problems.append(f"{tier}: imagePullPolicy not set")
    return problems


def k21_metrics(m: Manifests, tier: str) -> list[str]:
    s = tier_settings(m, tier)
    c = m.container(tier)
    annotations = m.pod(tier)["metadata"].get("annotations", {})
    problems = []
    if _port(c, "metrics") != s.metrics_port:
        problems.append(f"{tier}: container port 'metrics' is not metrics_port {s.metrics_port}")
    if annotations.get("prometheus.io/port") != str(s.metrics_port):
        problems.append(f"{tier}: prometheus.io/port is not {s.metrics_port}")
    if annotations.get("prometheus.io/scrape") != "true":
        problems.append(f"{tier}: prometheus.io/scrape is not 'true'")
    labels = m.pod(tier)["metadata"]["labels"]
    for pm in m.of("PodMonitor"):
        if not _labels_match(pm["spec"]["selector"].get("matchLabels", {}), labels):
            problems.append(f"{tier}: PodMonitor {pm['metadata']['name']} does not select it")
        for endpoint in pm["spec"]["podMetricsEndpoints"]:
            if _port(c, endpoint["port"]) is None:
                problems.append(f"{tier}: PodMonitor scrapes port {endpoint['port']!r} it lacks")
    return problems


def _egress_allows(policies: list[Doc], port: int, peer: dict[str, str]) -> bool:
    """Does an egress rule of one of the policies allow `port` to pods labelled `peer`?"""
    return any(
        any(p["port"] == port for p in rule.get("ports", []))
        and any(
            _labels_match(to.get("podSelector", {}).get("matchLabels", {"": "-"}), peer)
            for to in rule.get("to", [])
        )
        for policy in policies
        for rule in policy["spec"].get("egress", [])
    )


def _policies_of(m: Manifests, name: str) -> list[Doc]:
    labels = m.pod(name)["metadata"]["labels"]
    return [
        p
        for p in m.of("NetworkPolicy")
        if _labels_match(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]


def _policy_allows(policy: Doc, port: int, peer: dict[str, str] | None) -> bool:
    """Does an ingress rule of the policy allow `port` from a pod with labels `peer` (None:
    from any source that the rule names)?"""
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        if peer is None:
            return True
        for source in rule.get("from", []):
            selector = source.get("podSelector", {}).get("matchLabels", {})
            if "podSelector" in source and _labels_match(selector, peer):
                return True
    return False


def k22_network_policy(m: Manifests, tier: str) -> list[str]:
    labels = m.pod(tier)["metadata"]["labels"]
    policies = [
        p
        for p in m.of("NetworkPolicy")
        if _labels_match(p["spec"]["podSelector"].get("matchLabels", {}), labels)
    ]
    problems = []
    if not any("Ingress" in p["spec"].get("policyTypes", []) for p in policies):
        problems.append(f"{tier}: no NetworkPolicy restricts its ingress")
    s = tier_settings(m, tier)
    client = {"mqstore.io/client": "true"}
    if not any(_policy_allows(p, s.port, client) for p in policies):
        problems.append(f"{tier}: clients labelled mqstore.io/client=true cannot reach {s.port}")
    if not any(_policy_allows(p, s.metrics_port, None) for p in policies):
        problems.append(f"{tier}: nothing may scrape its metrics port {s.metrics_port}")
    if tier == "commitlog":
        cl_port = s.port
        for follower in FOLLOWERS:
            peer = m.pod(follower)["metadata"]["labels"]
            if not any(_policy_allows(p, cl_port, peer) for p in policies):
                problems.append(f"commitlog: {follower} pods cannot reach its API {cl_port}")
        # Replication: a follower replica copies from the leader's API.
        own = m.pod("commitlog")["metadata"]["labels"]
        if not any(_policy_allows(p, cl_port, own) for p in policies):
            problems.append(f"commitlog: the replicas cannot reach each other's API {cl_port}")
        if not _egress_allows(policies, cl_port, own):
            problems.append(f"commitlog: egress to the other replicas' API {cl_port} is denied")
    else:
        egress_ok = any(
            port["port"] == tier_settings(m, "commitlog").port
            and any(
                _labels_match(to.get("podSelector", {}).get("matchLabels", {"": "-"}),
                              m.pod("commitlog")["metadata"]["labels"])
                for to in rule.get("to", [])
            )
            for p in policies
            for rule in p["spec"].get("egress", [])
            for port in rule.get("ports", [])
        )  # fmt: skip
        if not egress_ok:
            problems.append(f"{tier}: egress to the commit log's API is not allowed")
    return problems


def k23_autoscaling(m: Manifests, tier: str) -> list[str]:
    hpas = [
        h for h in m.of("HorizontalPodAutoscaler") if h["spec"]["scaleTargetRef"]["name"] == tier
    ]
    if tier != "index":
        return [f"{tier}: an HPA on a state tier"] if hpas else []
    problems = []
    for h in hpas:
        spec = h["spec"]
        if h["apiVersion"] != "autoscaling/v2" or spec["scaleTargetRef"]["kind"] != "StatefulSet":
            problems.append("index HPA should be autoscaling/v2 on the StatefulSet")
        if spec.get("minReplicas") != replicas(m, "index"):
            problems.append(
                f"index HPA minReplicas {spec.get('minReplicas')} is not the overlay's "
                f"replica count {replicas(m, 'index')}"
            )
        shards = shard_count(m)
        for bound in ("minReplicas", "maxReplicas"):
            if int(spec.get(bound, 1)) % shards:
                problems.append(f"index HPA {bound} is not a multiple of {shards} shards")
        up = spec.get("behavior", {}).get("scaleUp", {}).get("policies", [])
        if not up or any(p["type"] != "Pods" or p["value"] != shards for p in up):
            problems.append(f"index HPA should add {shards} pods (one per shard) at a time")
        down = spec.get("behavior", {}).get("scaleDown", {})
        if int(down.get("stabilizationWindowSeconds", 0)) < 600:
            problems.append("index HPA scales down within 10 minutes of a replay")
    return problems


def k24_namespace(m: Manifests, tier: str) -> list[str]:
    problems = []
    ns = m.namespace
    if not ns or ns == "default":
        problems.append(f"namespace {ns!r}: set one with kustomize `namespace:`")
    namespace = m.get("Namespace", ns)
    if namespace is None:
        problems.append(f"no Namespace {ns} in the overlay")
    elif namespace["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") != (
        "restricted"
    ):
        problems.append(f"namespace {ns} does not enforce the restricted pod security standard")
    for d in m.docs:
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != ns:
            problems.append(f"{d['kind']} {d['metadata']['name']} is not in {ns}")
    return problems


CHECKS: dict[str, Callable[[Manifests, str], list[str]]] = {
    "K1": k1_workload,
    "K2": k2_headless_service,
    "K3": k3_client_service,
    "K4": k4_pod_management,
    "K5": k5_volume_claims,
    "K6": k6_health_port,
    "K7": k7_startup_probe,
    "K8": k8_readiness_probe,
    "K9": k9_liveness_probe,
    "K10": k10_grace,
    "K11": k11_sigterm_reaches_the_service,
    "K12": k12_pdb,
    "K13": k13_spread,
    "K14": k14_resources,
    "K15": k15_pod_security,
    "K16": k16_container_security,
    "K17": k17_service_account_token,
    "K18": k18_config_and_secrets,
    "K19": k19_identity,
    "K20": k20_image,
    "K21": k21_metrics,
    "K22": k22_network_policy,
    "K23": k23_autoscaling,
    "K24": k24_namespace,
}


# -- the index tier -------------------------------------------------------------------------------


def index_tier(m: Manifests) -> list[str]:
    """Replicas and shards: every shard has the same number of replicas (at least one), each
    pod derives its shard from its ordinal, and the client's index address covers the tier."""
    problems = []
    shards = shard_count(m)
    n = replicas(m, "index")
    if n < shards or n % shards:
        problems.append(f"{n} index replicas over {shards} shards leave shards uneven or empty")
    seen: dict[int, int] = {}
    for ordinal in range(n):
        s = tier_settings(m, "index", ordinal)
        assert isinstance(s, IndexSettings)
        if s.shard_index != ordinal % shards or s.shard_count != shards:
            problems.append(f"index-{ordinal} serves {s.shard_index}/{s.shard_count}")
        seen[s.shard_index] = seen.get(s.shard_index, 0) + 1
    if sorted(seen) != list(range(shards)):
        problems.append(f"shards served: {sorted(seen)}, expected 0..{shards - 1}")
    client = m.configmap_named("mqstore-client").get("data", {})
    expected = (
        f"{DNS_ALL_PREFIX}index.{m.namespace}.svc.cluster.local:{tier_settings(m, 'index').port}"
    )
    if client.get("MQSTORE_INDEX") != expected:
        problems.append(
            f"mqstore-client MQSTORE_INDEX is {client.get('MQSTORE_INDEX')!r}, not {expected!r}"
        )
    want = f"cq.{m.namespace}.svc.cluster.local:{tier_settings(m, 'cq').port}"
    if client.get("MQSTORE_CQ") != want:
        problems.append(f"mqstore-client MQSTORE_CQ is {client.get('MQSTORE_CQ')!r}, not {want!r}")
    return problems


# -- the commit log's preStop hook -----------------------------------------------------------------


@dataclass(frozen=True)
class Switchover:
    """The preStop hook's `mqstore cluster switchover`, as written in the manifest."""

    command: list[str]
    options: dict[str, str | None]  # --name -> value (None: a flag)
    unexpected: list[str]  # positional words after `cluster switchover`

    @property
    def address(self) -> str:
        return self.options.get("--commitlog") or ""

    @property
    def timeout_s(self) -> float:
        try:
            return float(self.options.get("--timeout-s") or 0)
        except ValueError:
            return 0.0

    @property
    def bound_s(self) -> float:
        """The longest the command can take: the replica's status, then the Switchover call
        (its timeout plus the round trip the CLI allows it)."""
        return STATUS_TIMEOUT_S + self.timeout_s + SWITCHOVER_CALL_SLACK_S


_SWITCHOVER_VALUED = ("--commitlog", "--timeout-s", "--to")


def prestop_switchover(m: Manifests, tier: str) -> Switchover | None:
    """The container's preStop `mqstore cluster switchover ...`, or None when its preStop is
    anything else (or absent)."""
    hook = m.container(tier).get("lifecycle", {}).get("preStop") or {}
    command = [str(part) for part in hook.get("exec", {}).get("command", [])]
    prefix = next((p for p in MQSTORE_COMMANDS if command[: len(p)] == p), None)
    if prefix is None or command[len(prefix) : len(prefix) + 2] != ["cluster", "switchover"]:
        return None
    options: dict[str, str | None] = {}
    unexpected: list[str] = []
    words = iter(command[len(prefix) + 2 :])
    for word in words:
        name, eq, value = word.partition("=")
        if not name.startswith("--"):
            unexpected.append(word)
        elif eq:
            options[name] = value
        elif name in _SWITCHOVER_VALUED:
            options[name] = next(words, "")
        else:
            options[name] = None
    return Switchover(command, options, unexpected)


def switchover_problems(m: Manifests) -> list[str]:
    """The commit log's preStop hands the leadership away when (and only when) its own replica
    leads, within a bounded time: `mqstore cluster switchover --commitlog 127.0.0.1:<API port>
    --if-leader --timeout-s S`, in exec form."""
    hook = m.container("commitlog").get("lifecycle", {}).get("preStop")
    if not hook:
        return ["commitlog: no preStop hook: a leading pod would stop without handing over"]
    if "exec" not in hook:
        return [f"commitlog: the preStop hook is not an exec of the mqstore command: {hook}"]
    command = hook["exec"].get("command", [])
    if any(part in SHELLS for part in command):
        return [f"commitlog: a shell in the preStop hook (the image has none): {command}"]
    switchover = prestop_switchover(m, "commitlog")
    if switchover is None:
        return [f"commitlog: the preStop hook is not `mqstore cluster switchover`: {command}"]
    problems = []
    api = tier_settings(m, "commitlog").port
    host, _, port = switchover.address.rpartition(":")
    if host not in LOOPBACK_HOSTS or port != str(api):
        problems.append(
            f"commitlog: the preStop switchover asks {switchover.address!r}, not this pod's own "
            f"replica at 127.0.0.1:{api}"
        )
    if "--if-leader" not in switchover.options or switchover.options["--if-leader"] is not None:
        problems.append(
            "commitlog: the preStop switchover lacks --if-leader: a follower's stop would move "
            "the leadership too"
        )
    if "--to" in switchover.options:
        problems.append("commitlog: the preStop switchover names a fixed --to replica")
    if switchover.timeout_s <= 0:
        problems.append("commitlog: the preStop switchover has no --timeout-s bound")
    if switchover.unexpected:
        problems.append(
            f"commitlog: the preStop switchover has stray words {switchover.unexpected}"
        )
    # The command itself must take these words (its options, their types and ranges).
    words = switchover.command[switchover.command.index("switchover") + 1 :]
    try:
        cluster_switchover.make_context("switchover", list(words))
    except click.ClickException as err:
        problems.append(f"commitlog: `mqstore cluster switchover` refuses {words}: {err}")
    return problems


# -- R1-R5: the commit log's broker group and its coordinator --------------------------------------


def _pod_names(m: Manifests, name: str) -> list[str]:
    return [f"{name}-{i}" for i in range(replicas(m, name))]


def _stable_names(m: Manifests, name: str, ordinal: int, *, fqdn_only: bool = False) -> set[str]:
    """The DNS names of pod `<name>-<ordinal>` through its StatefulSet's headless Service: short
    (this namespace), `.<ns>.svc` and fully qualified."""
    service = m.sts(name)["spec"].get("serviceName", "")
    short = f"{name}-{ordinal}.{service}"
    full = f"{short}.{m.namespace}.{CLUSTER_DOMAIN}"
    return {full} if fqdn_only else {short, f"{short}.{m.namespace}.svc", full}


def _split_address(address: str) -> tuple[str, str]:
    host, _, port = address.strip().rpartition(":")
    return host, port


def _replica_list_problems(
    m: Manifests, what: str, addresses: list[str], *, fqdn_only: bool = False
) -> list[str]:
    """`addresses` must be every commit-log replica once, in ordinal order, each by a name that
    resolves through the headless Service, on the API port."""
    n = replicas(m, "commitlog")
    api = tier_settings(m, "commitlog").port
    problems = []
    if len(addresses) != n:
        problems.append(f"{what} lists {len(addresses)} commit-log replicas, not all {n}")
    for ordinal, address in enumerate(addresses[:n]):
        host, port = _split_address(address)
        names = _stable_names(m, "commitlog", ordinal, fqdn_only=fqdn_only)
        if host not in names or port != str(api):
            problems.append(
                f"{what}: {address!r} is not commitlog-{ordinal} by its stable name "
                f"({' or '.join(sorted(names))}) on port {api}"
            )
    return problems


def r1_group_settings(m: Manifests) -> list[str]:
    """Every replica loads the same group settings (group, etcd, sync replication, min_insync,
    lease TTL), and its own name: its pod name."""
    n = replicas(m, "commitlog")
    loaded = [tier_settings(m, "commitlog", i) for i in range(n)]
    groups = [s for s in loaded if isinstance(s, CommitLogSettings)]
    problems = []
    shared = ("group", "etcd", "replication", "min_insync", "lease_ttl_s", "allow_unclean_election")
    for key in shared:
        values = {str(getattr(s, key)) for s in groups}
        if len(values) != 1:
            problems.append(f"commitlog replicas disagree on {key}: {sorted(values)}")
    first = groups[0]
    if not first.group:
        problems.append("commitlog: no broker group (--group): each replica would be a log alone")
    if first.replication != "sync":
        problems.append("commitlog: replication is not sync: a failover may lose acknowledged")
    if not 2 <= first.min_insync <= n - 1:
        problems.append(
            f"commitlog: min_insync {first.min_insync} with {n} replicas: at least 2 (an "
            f"acknowledged append on two disks) and at most {n - 1} (appends go on with one down)"
        )
    if first.allow_unclean_election:
        problems.append("commitlog: unclean election allowed: it may lose acknowledged appends")
    names = [s.replica_name for s in groups]
    if names != _pod_names(m, "commitlog"):
        problems.append(f"commitlog replica names {names} are not their pod names")
    return problems


def r2_advertise(m: Manifests) -> list[str]:
    """Each replica advertises its pod's stable name through the headless Service (which lists
    not-ready pods: a replica catching up must be reachable) and its API port."""
    service = m.get("Service", m.sts("commitlog")["spec"].get("serviceName", ""))
    problems = []
    if service is None or service["spec"].get("clusterIP") != "None":
        problems.append("commitlog: its serviceName is no headless Service")
    elif service["spec"].get("publishNotReadyAddresses") is not True:
        problems.append("commitlog: its headless Service hides replicas that are not ready")
    for ordinal in range(replicas(m, "commitlog")):
        s = tier_settings(m, "commitlog", ordinal)
        assert isinstance(s, CommitLogSettings)
        problems += _advertise_problem(m, ordinal, s)
    return problems


def _advertise_problem(m: Manifests, ordinal: int, s: CommitLogSettings) -> list[str]:
    host, port = _split_address(s.advertise)
    names = _stable_names(m, "commitlog", ordinal)
    if host in names and port == str(s.port):
        return []
    return [
        f"commitlog-{ordinal} advertises {s.advertise!r}, not its stable name "
        f"({' or '.join(sorted(names))}) on port {s.port}"
    ]


def r3_replica_addresses(m: Manifests) -> list[str]:
    """cq_svc, index_svc and client pods are given every replica's stable name (the SDK and the
    followers find the leader among them); clients, in any namespace, the full names."""
    problems = []
    for tier in FOLLOWERS:
        targets = [t for t in tier_settings(m, tier).commitlog_target.split(",") if t.strip()]
        problems += _replica_list_problems(m, f"{tier} commitlog_target", targets)
    client = m.configmap_named("mqstore-client").get("data", {})
    listed = [a for a in client.get("MQSTORE_COMMITLOG", "").split(",") if a.strip()]
    problems += _replica_list_problems(
        m, "mqstore-client MQSTORE_COMMITLOG", listed, fqdn_only=True
    )
    return problems


def _etcd_flags(m: Manifests, ordinal: int) -> dict[str, str]:
    """etcd's settings in pod `etcd-<ordinal>`: its ETCD_* variables (etcd reads them as flags)
    overridden by the `--flag=value` words of its command."""
    env = m.env(ETCD_NAME, ordinal)
    flags = {
        "--" + k.removeprefix("ETCD_").lower().replace("_", "-"): v
        for k, v in env.items()
        if k.startswith("ETCD_")
    }
    for word in command_line(m, ETCD_NAME, ordinal)[1:]:
        name, eq, value = word.partition("=")
        if name.startswith("--"):
            flags[name] = value if eq else "true"
    return flags


def _url_host_port(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    try:
        return parts.hostname or "", parts.port
    except ValueError:
        return parts.hostname or "", None


def _container_port(c: Doc, port: int | str) -> int | None:
    """A Service's targetPort (a number or a port name) as the container's port number."""
    if isinstance(port, int):
        return port
    return _port(c, port)


def r4_etcd_endpoint(m: Manifests) -> list[str]:
    """The commit log's etcd endpoint is served: a name in this namespace must be a Service of
    ready etcd members on their client port, reachable through the NetworkPolicies; a name
    elsewhere is an etcd of the operator's own, and then components/etcd must not run idle."""
    endpoint = tier_settings(m, "commitlog").etcd
    host, port = _url_host_port(endpoint)
    if urlsplit(endpoint).scheme not in ("http", "https") or not host or port is None:
        return [f"commitlog: etcd endpoint {endpoint!r} is not http(s)://host:port"]
    local = m.get("StatefulSet", ETCD_NAME)
    first, _, rest = host.partition(".")
    if rest not in ("", f"{m.namespace}.svc", f"{m.namespace}.{CLUSTER_DOMAIN}"):
        if local is not None:
            return [f"components/etcd runs, but the commit log uses another etcd ({endpoint})"]
        # An etcd elsewhere: some egress rule of the commit log's policies must let it out on
        # that port (to another namespace or an address block; the base allows etcd pods only).
        outside = any(
            any(p["port"] == port for p in rule.get("ports", []))
            and (
                not rule.get("to")
                or any("namespaceSelector" in t or "ipBlock" in t for t in rule["to"])
            )
            for policy in _policies_of(m, "commitlog")
            for rule in policy["spec"].get("egress", [])
        )
        if not outside:
            return [f"commitlog: no NetworkPolicy lets it reach {endpoint}"]
        return []
    service = m.get("Service", first)
    if service is None:
        return [
            f"commitlog: etcd endpoint {endpoint} names no Service here: add components/etcd, "
            "or set MQSTORE_COMMITLOG_ETCD to your etcd"
        ]
    if local is None or not _labels_match(
        service["spec"].get("selector") or {"": "-"}, m.pod(ETCD_NAME)["metadata"]["labels"]
    ):
        return [f"commitlog: Service {first} does not select the etcd members"]
    problems = []
    if service["spec"].get("publishNotReadyAddresses"):
        problems.append(f"Service {first} sends the commit log to members without a quorum")
    c = m.container(ETCD_NAME)
    targets = [
        p.get("targetPort", p["port"]) for p in service["spec"]["ports"] if p["port"] == port
    ]
    client_port = _url_host_port(_etcd_flags(m, 0).get("--listen-client-urls", ""))[1]
    if not targets or _container_port(c, targets[0]) != client_port:
        problems.append(f"Service {first}:{port} does not lead to etcd's client port {client_port}")
    commitlog = m.pod("commitlog")["metadata"]["labels"]
    if client_port is not None and not _egress_allows(
        _policies_of(m, "commitlog"), client_port, m.pod(ETCD_NAME)["metadata"]["labels"]
    ):
        problems.append(f"commitlog: egress to etcd's client port {client_port} is denied")
    if client_port is not None and not any(
        _policy_allows(p, client_port, commitlog) for p in _policies_of(m, ETCD_NAME)
    ):
        problems.append(f"etcd: the commit log may not reach its client port {client_port}")
    return problems


def _etcd_version(image: str) -> tuple[int, ...] | None:
    tag = image.split("@", 1)[0].rpartition(":")[2]
    found = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", tag)
    return tuple(int(x) for x in found.groups()) if found else None


def r5_etcd_members(m: Manifests) -> list[str]:
    """components/etcd, when the overlay runs it: an odd number of members, one per node,
    started in parallel, each named after its pod and advertising its stable peer name, and a
    bootstrap member list naming exactly those pods; probes that never restart a member for a
    lost quorum; a lease as short as the group's granted; a recent etcd; the tiers' pod
    security; a PDB that keeps the quorum."""
    if m.get("StatefulSet", ETCD_NAME) is None:
        return []
    n = replicas(m, ETCD_NAME)
    spec = m.sts(ETCD_NAME)["spec"]
    problems = []
    if n not in (1, 3, 5):
        problems.append(f"etcd runs {n} members: 1, 3 or 5 (a quorum is a majority)")
    if spec.get("podManagementPolicy") != "Parallel":
        problems.append("etcd members must start in Parallel (each waits for a quorum)")
    service = m.get("Service", spec.get("serviceName", ""))
    if service is None or service["spec"].get("publishNotReadyAddresses") is not True:
        problems.append("etcd: its headless Service must list members before they are ready")
    peers: dict[str, str] = {}
    clusters: set[str] = set()
    for ordinal in range(n):
        pod = f"{ETCD_NAME}-{ordinal}"
        flags = _etcd_flags(m, ordinal)
        if flags.get("--name") != pod:
            problems.append(f"{pod} is named {flags.get('--name')!r}, not its pod name")
        peer = flags.get("--initial-advertise-peer-urls", "")
        host, port = _url_host_port(peer)
        if host not in _stable_names(m, ETCD_NAME, ordinal) or port != ETCD_PEER_PORT:
            problems.append(f"{pod} advertises peer URL {peer!r}, not its stable name")
        peers[pod] = peer
        clusters.add(flags.get("--initial-cluster", ""))
    if len(clusters) != 1:
        problems.append(f"etcd members disagree on the initial cluster: {sorted(clusters)}")
    listed = dict(
        entry.partition("=")[::2] for entry in next(iter(clusters), "").split(",") if entry
    )
    if listed != peers:
        problems.append(f"etcd's initial cluster {listed} is not its {n} pods {peers}")
    data = _etcd_flags(m, 0).get("--data-dir", "")
    mounts = {v["name"]: v["mountPath"] for v in m.container(ETCD_NAME).get("volumeMounts", [])}
    claims = [c["metadata"]["name"] for c in spec.get("volumeClaimTemplates", [])]
    if not any(name in claims and data.startswith(path) for name, path in mounts.items()):
        problems.append(f"etcd: its data dir {data!r} is not on a volume claim")
    if n > 1 and not _required_apart(m, ETCD_NAME):
        problems.append("etcd members must be on different nodes (required anti-affinity)")
    c = m.container(ETCD_NAME)
    live = c.get("livenessProbe", {}).get("httpGet", {}).get("path", "")
    ready = c.get("readinessProbe", {}).get("httpGet", {}).get("path", "")
    if "serializable=true" not in live:
        problems.append("etcd: its liveness must not need a quorum (/health?serializable=true)")
    if not ready.startswith("/health") or "serializable=true" in ready:
        problems.append("etcd: its readiness must need a quorum (/health, linearizable)")
    if "startupProbe" not in c:
        problems.append("etcd: no startupProbe")
    # etcd raises a shorter TTL to its minimum, which follows from its raft timing; the term
    # then runs on the TTL granted, and the group fails over slower than lease_ttl_s says.
    flags = _etcd_flags(m, 0)
    try:
        least = min_lease_ttl_s(
            int(flags.get("--heartbeat-interval", 100)), int(flags.get("--election-timeout", 1000))
        )
    except ValueError:
        least = 0
        problems.append("etcd: --heartbeat-interval and --election-timeout are not numbers")
    ttl = tier_settings(m, "commitlog")
    assert isinstance(ttl, CommitLogSettings)
    if ttl.lease_ttl_s < least:
        problems.append(
            f"commitlog: lease_ttl_s {ttl.lease_ttl_s} is below the {least} s etcd grants "
            "with its heartbeat and election timeout"
        )
    version = _etcd_version(c.get("image", ""))
    if version is None or version < ETCD_VERSION_MIN:
        problems.append(
            f"etcd image {c.get('image')!r}: {'.'.join(map(str, ETCD_VERSION_MIN))} or later "
            "(3.5.0-3.5.5 have data inconsistency bugs)"
        )
    if m.pod(ETCD_NAME)["spec"].get("enableServiceLinks") is not False:
        problems.append("etcd: service links on (etcd reads ETCD_* variables as flags)")
    sc = c.get("securityContext", {})
    if (
        sc.get("allowPrivilegeEscalation") is not False
        or sc.get("readOnlyRootFilesystem") is not True
        or sc.get("capabilities", {}).get("drop") != ["ALL"]
    ):
        problems.append("etcd: its container is not locked down like the tiers'")
    problems += k14_resources(m, ETCD_NAME) + k15_pod_security(m, ETCD_NAME)
    problems += k17_service_account_token(m, ETCD_NAME)
    labels = m.pod(ETCD_NAME)["metadata"]["labels"]
    pdbs = [
        p
        for p in m.of("PodDisruptionBudget")
        if _labels_match(p["spec"]["selector"].get("matchLabels", {}), labels)
    ]
    most = max(1, (n - 1) // 2)
    if len(pdbs) != 1 or not 1 <= int(pdbs[0]["spec"].get("maxUnavailable", 0)) <= most:
        problems.append(f"etcd: one PDB with maxUnavailable 1..{most} (keeps the quorum)")
    if not _egress_allows(_policies_of(m, ETCD_NAME), ETCD_PEER_PORT, labels) or not any(
        _policy_allows(p, ETCD_PEER_PORT, labels) for p in _policies_of(m, ETCD_NAME)
    ):
        problems.append(f"etcd: members cannot reach each other's peer port {ETCD_PEER_PORT}")
    return problems


def _link_problems(who: str, api: CommitLogSettings, link: FollowerSettings) -> list[str]:
    """Does a client of the commit log (a follower service, or a replica reaching another)
    speak what the commit log's API serves: TLS when it has a certificate, a token when it
    checks tokens?"""
    problems = []
    if api.tls_cert_file and not (link.commitlog_tls or link.commitlog_tls_ca_file):
        problems.append(f"{who}: the commit log serves TLS, but {who} reaches it in plaintext")
    if api.tokens_file and not link.commitlog_token_file:
        problems.append(f"{who}: the commit log checks tokens, but {who} has none")
    if api.tls_cert_file and not link.commitlog_tls_server_name:
        problems.append(
            f"{who}: reaches replicas by per-pod names: name the certificate's "
            "(commitlog_tls_server_name)"
        )
    return problems


def r6_links_match_the_api(m: Manifests) -> list[str]:
    """Under TLS and tokens (components/secure), everything that calls a commit-log replica is
    equipped for it: the replicas themselves (Replicate, scope replicate), the followers, and
    the preStop switchover (a client of its own replica: CA, certificate name, admin token)."""
    api = tier_settings(m, "commitlog")
    assert isinstance(api, CommitLogSettings)
    problems = _link_problems("commitlog replicas", api, api)
    for tier in FOLLOWERS:
        follower = tier_settings(m, tier)
        assert isinstance(follower, FollowerSettings)
        problems += _link_problems(tier, api, follower)
    env = m.env("commitlog", 0)
    if api.tls_cert_file and not (env.get("MQSTORE_TLS_CA") and env.get("MQSTORE_TLS_SERVER_NAME")):
        problems.append("commitlog: the preStop switchover has no CA or certificate name for TLS")
    if api.tokens_file and not env.get("MQSTORE_TOKEN_FILE"):
        problems.append("commitlog: the preStop switchover has no token (it needs scope admin)")
    return problems


GROUP_CHECKS: dict[str, Callable[[Manifests], list[str]]] = {
    "R1": r1_group_settings,
    "R2": r2_advertise,
    "R3": r3_replica_addresses,
    "R4": r4_etcd_endpoint,
    "R5": r5_etcd_members,
    "R6": r6_links_match_the_api,
}
