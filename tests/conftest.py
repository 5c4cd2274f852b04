"""What every test shares."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_contexts(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test its own context directory: `mqstore up` saves and selects a context
    (mqstore/client/contexts.py), which would otherwise land in the user's ~/.config and
    send later tests' (and the user's) commands to a store that is gone."""
    directory: Path = tmp_path_factory.mktemp("mqstore-config")
    monkeypatch.setenv("MQSTORE_CONFIG_DIR", str(directory))
    monkeypatch.delenv("MQSTORE_CONTEXT", raising=False)
