"""What every test shares."""

from __future__ import annotations

import os
import signal
import tempfile
from typing import Any

import pytest

from tests.environ import DISK_PRESSURE_OFF

_SESSION_CONFIG = tempfile.mkdtemp(prefix="mqstore-test-config-")
# `make test` runs two pytest-xdist workers (-n 2 --dist loadgroup). The tests of these
# directories run one after another in one worker, beside the other worker's light tests and
# never beside each other: Spark (a JVM per worker, whose Python workers must connect back
# within 10 s), the doc sessions (`make run`, Spark jobs), the chaos and bench short forms
# (kills and restarts on timers, CPU-bound figures).
ALONE_DIRS = frozenset({"spark", "docs", "chaos", "bench"})
ALONE_GROUP = "alone"


def pytest_configure(config: pytest.Config) -> None:
    """Contexts (mqstore/client/contexts.py) live under XDG_CONFIG_HOME/mqstore: the whole run
    gets a directory of its own before anything starts, so that processes started once for many
    tests (a SparkSession's JVM and its Python workers) never read the user's ~/.config."""
    os.environ["XDG_CONFIG_HOME"] = _SESSION_CONFIG
    os.environ.update(DISK_PRESSURE_OFF)  # every store a test starts (tests/environ.py)
    os.environ.pop("MQSTORE_CONFIG_DIR", None)
    os.environ.pop("MQSTORE_CONTEXT", None)
    _ctrl_c_reaches_children()


def _ctrl_c_reaches_children() -> None:
    """Tests press Ctrl-C (SIGINT) on the processes they start, as a person at a terminal does.
    A run started as a background job of a script (`make test &`) inherits SIGINT ignored, and
    so would every process a test starts: the CLI keeps an ignored SIGINT ignored, so `consume
    --follow` would never stop. A handler here (not ignored) becomes the default in children."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup with ALONE_DIRS as one group, decided by the test's path. Not by an
    xdist_group mark: pytest-xdist 3.8 names a marked test's group by rewriting
    `item._nodeid`, which pytest 9.2 no longer reads (a node's id is `_id`), so marks never
    group anything here."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # noqa: PLC0415 (xdist is loaded)

    class DirectoryGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            parts = nodeid.partition("::")[0].split("/")
            if len(parts) > 2 and parts[0] == "tests" and parts[1] in ALONE_DIRS:
                return ALONE_GROUP
            return str(super()._split_scope(nodeid))

    return DirectoryGroups(config, log)


@pytest.fixture(autouse=True)
def _private_contexts(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test its own context directory: `mqstore up` saves and selects a context, which
    would otherwise send later tests' commands to a store that is gone. XDG_CONFIG_HOME, not
    MQSTORE_CONFIG_DIR: tests that hand a process a clean MQSTORE_* environment keep it."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
