"""The checklist K1-K24 (shared/reference/ops-and-reliability.md §1.3) as functions over the
rendered documents of one overlay. Each check returns the problems it finds ([] = holds), so
that a test can also feed it a broken manifest and see the problem named.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from commitlog_svc.settings import CommitLogSettings
from cq_svc.settings import CqSettings
from index_svc.settings import IndexSettings
from mqstore.client.settings import DNS_ALL_PREFIX
from mqstore.rpc.settings import ServiceSettings

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


@dataclass
class Manifests:
    """The documents of one rendered overlay."""

    docs: list[Doc]

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
        """The container's environment as pod `<tier>-<ordinal>` sees it."""
        c = self.container(tier)
        out: dict[str, str] = {}
        for source in c.get("envFrom", []):
            out.update(self.configmap(source["configMapRef"]["name"]))
        for var in c.get("env", []):
            if "value" in var:
                out[var["name"]] = str(var["value"])
                continue
            ref = var["valueFrom"]
            if "fieldRef" in ref:
                assert ref["fieldRef"]["fieldPath"] == "metadata.name", ref
                out[var["name"]] = f"{tier}-{ordinal}"
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


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_") and k != "POD_NAME"}
    with mock.patch.dict(os.environ, {**kept, **env}, clear=True):
        yield


def tier_settings(m: Manifests, tier: str, ordinal: int = 0) -> ServiceSettings:
    """The settings the service of `tier` loads in pod `<tier>-<ordinal>`: its class, the
    rendered TOML file, the container's environment and its command-line flags."""
    env = m.env(tier, ordinal)
    command = m.container(tier)["command"] + m.container(tier).get("args", [])
    flags = command[3:]  # after python -m <module>
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
        problems = [] if policy == "OrderedReady" else ["commitlog must be OrderedReady"]
        if replicas(m, tier) != 1:
            problems.append("commitlog is a single writer: replicas must be 1")
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
    needed = s.drain_delay_s + s.grace_period_s + FLUSH_BUDGET_S
    problems = []
    if grace < needed:
        problems.append(
            f"{tier}: terminationGracePeriodSeconds {grace} < drain {s.drain_delay_s} + "
            f"grace {s.grace_period_s} + flush {FLUSH_BUDGET_S}"
        )
    if s.drain_delay_s <= 0:
        problems.append(f"{tier}: no drain delay: endpoints still send calls after SIGTERM")
    return problems


def k11_sigterm_reaches_the_service(m: Manifests, tier: str) -> list[str]:
    """The service handles SIGTERM itself (drain, stop, flush): it must be PID 1, started in
    exec form without a shell in between, and no preStop hook may eat into the grace."""
    c = m.container(tier)
    command = c.get("command", [])
    problems = []
    if command[:3] != ["python", "-m", MODULES[tier]]:
        problems.append(f"{tier}: command {command} is not `python -m {MODULES[tier]}`")
    if any(part in ("sh", "bash", "/bin/sh", "-c") for part in command):
        problems.append(f"{tier}: a shell in the command would swallow SIGTERM")
    if c.get("lifecycle", {}).get("preStop"):
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
    if not any(
        t.get("topologyKey") == ZONE and t.get("whenUnsatisfiable") == "ScheduleAnyway"
        for t in spec.get("topologySpreadConstraints", [])
    ):
        problems.append(f"{tier}: no zone spread (ScheduleAnyway)")
    return problems


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
    for key, tier in (("MQSTORE_COMMITLOG", "commitlog"), ("MQSTORE_CQ", "cq")):
        want = f"{tier}.{m.namespace}.svc.cluster.local:{tier_settings(m, tier).port}"
        if client.get(key) != want:
            problems.append(f"mqstore-client {key} is {client.get(key)!r}, not {want!r}")
    return problems
