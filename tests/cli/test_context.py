"""`mqstore context`: saved settings, which win over nothing but the defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore.client import ClientSettings, contexts
from tests.environ import environ_without

REPO = Path(__file__).resolve().parents[2]


def mq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = environ_without("MQSTORE_")
    return subprocess.run(
        [sys.executable, "-m", "mqstore.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def test_save_select_show_and_remove_a_context(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked until used")
    saved = mq("--commitlog", "db1:7100", "--cq", "db1:7200,db2:7200", "--tls-ca", str(ca),
               "context", "save", "db1")  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert json.loads(mq("context", "ls", "--json").stdout) == {
        "contexts": ["db1"],
        "selected": None,
    }
    # Saved, not selected: nothing in force yet.
    assert mq("context", "show").returncode == 4
    assert mq("context", "select", "db1").stdout == "selected db1\n"
    shown = json.loads(mq("context", "show").stdout)
    assert shown == {
        "name": "db1",
        "commitlog": "db1:7100",
        "cq": "db1:7200,db2:7200",
        "tls_ca": str(ca),
    }
    assert mq("context", "ls").stdout == "* db1                  db1:7100\n"
    assert mq("context", "rm", "db1").returncode == 0
    assert mq("context", "select", "db1").returncode == 4
    assert mq("context", "save", "../escape").returncode == 2


def test_flags_and_variables_win_over_the_context_and_the_context_over_defaults() -> None:
    contexts.save(
        contexts.Context("far", {"commitlog": "far:7100", "index": "far:7300"}), select=True
    )
    env = {"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]}
    s = ClientSettings.from_env(env)
    assert (s.commitlog, s.index, s.cq) == ("far:7100", ("far:7300",), ClientSettings().cq)
    s = ClientSettings.from_env({**env, "MQSTORE_COMMITLOG": "near:1"})
    assert (s.commitlog, s.index) == ("near:1", ("far:7300",))
    s = ClientSettings.from_env(env, commitlog="arg:2")
    assert s.commitlog == "arg:2"
    # The command says where it looked: a context's address is the one it names.
    down = mq("--timeout", "1", "status")
    assert down.returncode == 3 and "far:7100" in down.stderr, down.stderr
    down = mq("--timeout", "1", "--commitlog", "127.0.0.1:9", "status")
    assert "far:7100" not in down.stderr and "127.0.0.1:9" in down.stderr, down.stderr


def test_a_named_context_that_does_not_exist_is_a_bad_argument_not_a_fallback() -> None:
    contexts.save(contexts.Context("home", {"commitlog": "127.0.0.1:7100"}), select=True)
    done = mq("--context", "hom", "status")
    assert done.returncode == 2 and "no context 'hom'" in done.stderr, done.stderr
    done = mq("status", env={"MQSTORE_CONTEXT": "hom"})
    assert done.returncode == 2 and "no context 'hom'" in done.stderr, done.stderr
    with pytest.raises(Exception, match="no context 'hom'"):
        ClientSettings.from_env({**os.environ, "MQSTORE_CONTEXT": "hom"})
