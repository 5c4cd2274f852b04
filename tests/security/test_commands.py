"""`mqstore token new` and `mqstore up --secure`: the one flag that runs a secure store, and a
client (the SDK and the command) that works with nothing but the environment it prints."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mqstore.cli import cli
from mqstore.client import Admin, ClientSettings, Consumer, Producer
from mqstore.client.errors import Unauthenticated
from mqstore.rpc.auth import TokenTable
from tests.e2e.support import start_up
from tests.environ import environ_without

pytestmark = pytest.mark.timeout(120)
START_S = 90.0
WAIT_S = 20.0


# -- mqstore token new ----------------------------------------------------------------------------


def test_token_new_prints_the_token_apart_from_the_entry_to_paste() -> None:
    result = CliRunner().invoke(
        cli, ["token", "new", "--name", "billing", "--scope", "consume:orders*", "--scope", "admin"]
    )
    assert result.exit_code == 0, result.output
    token = re.search(r"token .*: (\S+)", result.stderr)
    assert token is not None, result.stderr
    assert token.group(1) not in result.stdout  # stdout can go straight into the tokens file
    grant = TokenTable.from_toml(result.stdout).authenticate(token.group(1))
    assert (grant.name, grant.scopes) == ("billing", ("consume:orders*", "admin"))


def test_token_new_writes_the_token_to_a_private_file_and_never_prints_it(
    tmp_path: Path,
) -> None:
    out = tmp_path / "billing.token"
    result = CliRunner().invoke(
        cli, ["token", "new", "--name", "billing", "--scope", "subscribe", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    token = out.read_text(encoding="utf-8").strip()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert token not in result.stdout and token not in result.stderr
    assert TokenTable.from_toml(result.stdout).authenticate(token).subscribe

    again = CliRunner().invoke(cli, ["token", "new", "--name", "x", "--out", str(out)])
    assert again.exit_code == 2 and "exists" in again.stderr
    assert out.read_text(encoding="utf-8").strip() == token


def test_token_new_can_make_a_token_that_expires() -> None:
    result = CliRunner().invoke(
        cli, ["token", "new", "--name", "temp", "--scope", "admin", "--expires-days", "2"]
    )
    assert result.exit_code == 0, result.output
    (expires,) = (g.expires for g in TokenTable.from_toml(result.stdout).grants)
    assert expires is not None
    left = expires - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=2) - dt.timedelta(minutes=1) < left <= dt.timedelta(days=2)


def test_token_new_refuses_a_scope_outside_the_grammar() -> None:
    result = CliRunner().invoke(cli, ["token", "new", "--name", "x", "--scope", "write:orders"])
    assert result.exit_code == 2
    assert "expected produce:<topic pattern>" in result.stderr


# -- mqstore up --secure --------------------------------------------------------------------------


def _without_mqstore_env() -> dict[str, str]:
    return environ_without("MQSTORE_")


def test_up_secure_runs_a_store_that_a_client_reaches_with_the_printed_environment(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    proc, text = start_up(data, "--secure", timeout_s=START_S, env=_without_mqstore_env())
    try:
        env = dict(re.findall(r"^\s+export (MQSTORE_\w+)=(\S+)$", text, re.M))
        assert set(env) == {
            "MQSTORE_COMMITLOG",
            "MQSTORE_CQ",
            "MQSTORE_INDEX",
            "MQSTORE_TLS_CA",
            "MQSTORE_TOKEN_FILE",
        }, text
        admin_token = Path(env["MQSTORE_TOKEN_FILE"]).read_text(encoding="utf-8").strip()
        assert admin_token not in text

        settings = ClientSettings.from_env(env)
        with Producer(settings) as producer:
            sent = producer.send_sync("demo", b"over TLS", key="k1")
        with Admin(settings) as admin:
            deadline = time.monotonic() + WAIT_S
            while sum(q.max_offset for q in admin.queues("demo")) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            status = admin.status()
            assert all(r.reachable and r.caught_up for r in (*status.cq, *status.index)), status
        with Consumer(settings, "demo", start="earliest", long_poll_ms=0) as consumer:
            assert [m.body for m in consumer.messages(follow=False)] == [b"over TLS"]

        plain = ClientSettings.from_env({k: v for k, v in env.items() if k != "MQSTORE_TOKEN_FILE"})
        with Admin(plain) as admin, pytest.raises(Unauthenticated):
            admin.get_message(sent.msg_id)

        done = subprocess.run(
            [sys.executable, "-m", "mqstore.cli", "status"],
            env=_without_mqstore_env() | env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert env["MQSTORE_COMMITLOG"] in done.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text + out
    assert "stopped cleanly" in out
    for log in (data / "logs").iterdir():
        assert admin_token not in log.read_text(encoding="utf-8"), log


def test_up_secure_with_three_replicas_replicates_over_tls_with_the_replicate_scope(
    tmp_path: Path,
) -> None:
    """`mqstore up --secure --replicas 3`: the replicas copy the leader's log over TLS with a
    token of their own (scope replicate, nothing else); a client with the printed environment
    produces, and `mqstore cluster status` / `switchover` work with the admin token."""
    data = tmp_path / "data"
    proc, text = start_up(
        data, "--secure", "--replicas", "3", timeout_s=START_S, env=_without_mqstore_env()
    )
    try:
        env = dict(re.findall(r"^\s+export (MQSTORE_\w+)=(\S+)$", text, re.M))
        assert len(env["MQSTORE_COMMITLOG"].split(",")) == 3, text
        table = TokenTable.from_file(str(data / "secrets" / "tokens.toml"))
        (replicas,) = [g for g in table.grants if g.name == "replicas"]
        assert replicas.scopes == ("replicate",)
        with Producer(ClientSettings.from_env(env), retry_timeout_s=60) as producer:
            producer.send_sync("demo", b"replicated over TLS")

        def cluster(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "mqstore.cli", "cluster", *args, "--json"],
                env=_without_mqstore_env() | env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )

        deadline = time.monotonic() + WAIT_S
        while True:
            rows = json.loads(cluster("status").stdout)["replicas"]
            if all(r.get("in_sync") for r in rows):
                break  # both followers copied the log over TLS and joined the set
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        moved = json.loads(cluster("switchover").stdout)
        assert moved["switched"] and moved["to"] != moved["from"], moved
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text + out


def test_token_new_appends_to_the_tokens_file_it_names(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    out = tmp_path / "billing.token"
    first = CliRunner().invoke(
        cli,
        ["token", "new", "--name", "billing", "--scope", "consume:orders", "--out", str(out),
         "--tokens-file", str(tokens)],
    )  # fmt: skip
    assert first.exit_code == 0, first.output
    assert first.stdout == ""  # nothing left to paste
    assert f"added to {tokens}" in first.stderr
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    second = CliRunner().invoke(
        cli, ["token", "new", "--name", "ci", "--scope", "admin", "--tokens-file", str(tokens)]
    )
    assert second.exit_code == 0, second.output
    token = re.search(r"token .*: (\S+)", second.stderr)
    assert token is not None, second.stderr
    table = TokenTable.from_toml(tokens.read_text(encoding="utf-8"))
    assert table.authenticate(out.read_text(encoding="utf-8").strip()).name == "billing"
    assert table.authenticate(token.group(1)).name == "ci"
    # A second token of a name already there is refused, and the file is left as it was.
    before = tokens.read_text(encoding="utf-8")
    again = CliRunner().invoke(
        cli, ["token", "new", "--name", "ci", "--scope", "admin", "--tokens-file", str(tokens)]
    )
    assert again.exit_code == 2 and "already has a token named 'ci'" in again.stderr
    assert tokens.read_text(encoding="utf-8") == before


def test_token_new_into_a_directory_that_does_not_exist_is_a_bad_argument(tmp_path: Path) -> None:
    tokens = tmp_path / "data" / "secrets" / "tokens.toml"
    result = CliRunner().invoke(
        cli, ["token", "new", "--name", "x", "--scope", "admin", "--tokens-file", str(tokens)]
    )
    assert result.exit_code == 2, result.output
    assert "is not a directory" in result.stderr and "mqstore up --secure" in result.stderr
    assert not tokens.parent.exists()


def test_token_new_says_where_the_entry_goes() -> None:
    result = CliRunner().invoke(cli, ["token", "new", "--name", "x", "--scope", "admin"])
    assert result.exit_code == 0
    assert "--tokens-file" in result.stderr and "secrets/tokens.toml" in result.stderr
