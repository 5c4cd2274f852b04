"""The overlays rendered once per session (kubectl kustomize), parsed into documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import DEPLOY, OVERLAYS, render

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the manifests")


@pytest.fixture(scope="session")
def rendered_text() -> dict[str, str]:
    return {name: render(DEPLOY / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="session")
def rendered(rendered_text: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [d for d in yaml.safe_load_all(text) if d] for name, text in rendered_text.items()
    }


@pytest.fixture(scope="session")
def build_dir(rendered_text: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered overlays as files, one per overlay, for the command-line validators."""
    out = tmp_path_factory.mktemp("rendered")
    for name, text in rendered_text.items():
        (out / f"{name}.yaml").write_text(text, encoding="utf-8")
    return out
