"""What every test shares."""

from __future__ import annotations

import os
import tempfile

import pytest

_SESSION_CONFIG = tempfile.mkdtemp(prefix="mqstore-test-config-")


def pytest_configure(config: pytest.Config) -> None:
    """Contexts (mqstore/client/contexts.py) live under XDG_CONFIG_HOME/mqstore: the whole run
    gets a directory of its own before anything starts, so that processes started once for many
    tests (a SparkSession's JVM and its Python workers) never read the user's ~/.config."""
    os.environ["XDG_CONFIG_HOME"] = _SESSION_CONFIG
    os.environ.pop("MQSTORE_CONFIG_DIR", None)
    os.environ.pop("MQSTORE_CONTEXT", None)


@pytest.fixture(autouse=True)
def _private_contexts(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test its own context directory: `mqstore up` saves and selects a context, which
    would otherwise send later tests' commands to a store that is gone. XDG_CONFIG_HOME, not
    MQSTORE_CONFIG_DIR: tests that hand a process a clean MQSTORE_* environment keep it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
