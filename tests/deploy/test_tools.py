"""The offline validators over deploy/: yamllint, kubernetes-validate --strict against a pinned
Kubernetes version, checkov with no network, hadolint. Each is also shown a broken input, so a
validator that stopped checking (or stopped running) fails here instead of passing quietly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.deploy.tools import DEPLOY, KUBERNETES_VERSION, offline, require

TOOL_TIMEOUT_S = 120.0
# checkov with no cluster and no network: --skip-download stops it asking the Prisma Cloud API
# for guidelines; the environment keeps it from any other reach (and `offline` takes the
# network away altogether when it can).
CHECKOV_FLAGS = ("--skip-download", "--compact", "--quiet", "--output", "json")
CHECKOV_ENV = {"KUBECONFIG": os.devnull, "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
BROKEN_STATEFULSET = """\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: broken
spec:
  serviceName: broken
  replicas: "three"
  selector:
    matchLabels: {app: broken}
  template:
    metadata:
      labels: {app: broken}
    spec:
      containers:
        - name: broken
          image: broken:latest
          startupProbe:
            grpc: {port: health}
"""


def run(command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        check=False,
        env={**os.environ, **env},
    )


def test_yamllint_passes_every_yaml_file_under_deploy() -> None:
    yamllint = require("yamllint")
    done = run([yamllint, "--strict", "-c", str(DEPLOY / ".yamllint.yaml"), str(DEPLOY)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_yamllint_refuses_a_duplicate_key(tmp_path: Path) -> None:
    yamllint = require("yamllint")
    (tmp_path / "dup.yaml").write_text("a:\n  image: x\n  image: y\n")
    done = run([yamllint, "-c", str(DEPLOY / ".yamllint.yaml"), str(tmp_path)])
    assert done.returncode != 0 and "duplicat" in done.stdout


def test_every_overlay_validates_strictly_against_the_pinned_kubernetes(build_dir: Path) -> None:
    validate = require("kubernetes-validate")
    files = sorted(str(p) for p in build_dir.glob("*.yaml"))
    done = run([validate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, *files])
    assert done.returncode == 0, done.stdout + done.stderr
    # The Prometheus Operator's kinds have no schema there: it says so and passes them, and
    # tests/deploy/test_manifests.py checks them instead. Nothing else may be skipped.
    for line in (done.stdout + done.stderr).splitlines():
        if "Couldn't find schema" in line:
            assert "monitoring.coreos.com/v1" in line, line


def test_kubernetes_validate_refuses_a_broken_statefulset(tmp_path: Path) -> None:
    validate = require("kubernetes-validate")
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN_STATEFULSET)
    done = run([validate, "--strict", "--quiet", "-k", KUBERNETES_VERSION, str(path)])
    assert done.returncode != 0, done.stdout


def _checkov(args: list[str]) -> dict[str, object]:
    checkov = require("checkov")
    done = run(offline([checkov, *args, *CHECKOV_FLAGS]), **CHECKOV_ENV)
    # checkov exits 1 when a check fails; anything else is a crash.
    assert done.returncode in (0, 1), done.stderr[-4000:]
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    summary = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for r in reports:
        for key in ("passed", "failed", "skipped"):
            summary[key] += r["summary"][key]  # type: ignore[operator]
        summary["failures"] += [  # type: ignore[operator]
            f"{c['check_id']} {c['resource']} ({c['file_path']})"
            for c in r["results"]["failed_checks"]
        ]
    return summary


def test_checkov_finds_nothing_in_the_rendered_overlays(build_dir: Path) -> None:
    summary = _checkov(["-d", str(build_dir), "--framework", "kubernetes"])
    assert summary["failures"] == [], summary["failures"]
    assert summary["passed"] > 100  # it really looked: ~550 checks pass over the two overlays


def test_checkov_finds_the_faults_of_a_broken_statefulset(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text(BROKEN_STATEFULSET.replace('"three"', "3"))
    summary = _checkov(["-d", str(tmp_path), "--framework", "kubernetes"])
    failed = " ".join(summary["failures"])  # type: ignore[arg-type]
    for check in ("CKV_K8S_14", "CKV_K8S_22", "CKV_K8S_28"):  # :latest, writable root, NET_RAW
        assert check in failed, failed


def test_checkov_finds_nothing_in_the_dockerfile() -> None:
    summary = _checkov(["-f", str(DEPLOY / "Dockerfile"), "--framework", "dockerfile"])
    assert summary["failures"] == [], summary["failures"]
    # The one skip (HEALTHCHECK, which Kubernetes ignores) is justified in the Dockerfile.
    assert summary["skipped"] == 1


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = require("hadolint")
    done = run([hadolint, "--no-color", str(DEPLOY / "Dockerfile")])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_refuses_a_root_image_on_latest(tmp_path: Path) -> None:
    hadolint = require("hadolint")
    path = tmp_path / "Dockerfile"
    path.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\n")
    done = run([hadolint, "--no-color", str(path)])
    assert done.returncode != 0
    assert "DL3007" in done.stdout  # :latest
    assert "DL3008" in done.stdout  # unpinned apt package
