"""The `mqstore` client commands as a user runs them: a real store on loopback, the command as a
process (`python -m mqstore.cli`), its stdout and exit status checked.

Waiting on the store: an append is acknowledged by the commit log, and cq_svc / index_svc apply
it a moment later. Tests that read right after writing first poll (in-process, through the
SDK) until the consume queues or the index show what was written.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mqstore.cli import cli
from mqstore.client.admin import Admin
from mqstore.rpc.gen.commitlog.v1 import commitlog_pb2 as cl
from mqstore.testing.cluster import Cluster
from tests.client.conftest import settings_for, start_cluster
from tests.environ import environ_without

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 60.0
VISIBLE_TIMEOUT_S = 30.0
_topics = itertools.count()
RESULT_LINE = re.compile(
    r"^queue=(\d+) offset=(\d+) msg_id=([0-9A-F]{32}) uniq_key=([0-9A-F]{32})$"
)


@dataclass
class Store:
    cluster: Cluster
    env: dict[str, str]
    admin: Admin

    def run(
        self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The command as a process; one that outlives RUN_TIMEOUT_S fails the test with every
        thread's Python stack (faulthandler, on SIGABRT) and what it printed."""
        command = [sys.executable, "-m", "mqstore.cli", *args]
        with subprocess.Popen(
            command,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {}), "PYTHONFAULTHANDLER": "1"},
            cwd=REPO,
        ) as proc:
            text = input.decode() if input is not None else None
            try:
                out, err = proc.communicate(text, timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                out, err = proc.communicate()
                raise AssertionError(
                    f"{args} did not end within {RUN_TIMEOUT_S} s\n"
                    f"stdout:\n{out}\nstderr (stacks):\n{err}"
                ) from None
        return subprocess.CompletedProcess(command, proc.returncode, out, err)

    def ok(self, *args: str, input: bytes | None = None) -> str:
        done = self.run(*args, input=input)
        assert done.returncode == 0, (args, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        return done.stdout

    def wait_dispatched(self, topic: str, messages: int) -> None:
        """Until the consume queues hold `messages` messages of `topic`."""
        deadline = time.monotonic() + VISIBLE_TIMEOUT_S
        while sum(q.messages for q in self.admin.queues(topic)) < messages:
            assert time.monotonic() < deadline, f"{topic}: not dispatched to cq_svc in time"
            time.sleep(0.02)

    def wait_indexed(self, topic: str, key: str, messages: int) -> None:
        deadline = time.monotonic() + VISIBLE_TIMEOUT_S
        while len(self.admin.query_by_key(topic, key)) < messages:
            assert time.monotonic() < deadline, f"{topic}/{key}: not indexed in time"
            time.sleep(0.02)


def _client_env(c: Cluster) -> dict[str, str]:
    env = environ_without("MQSTORE_")
    env.update(
        MQSTORE_COMMITLOG=c.commitlog.target,
        MQSTORE_CQ=c.followers["cq"].target,
        MQSTORE_INDEX=c.followers["index"].target,
        PYTHONWARNINGS="error",
    )
    return env


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    c = start_cluster(tmp_path_factory.mktemp("cli-store"))
    try:
        with Admin(settings_for(c)) as admin:
            yield Store(c, _client_env(c), admin)
    finally:
        c.stop_all()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    name = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:80]
    return f"{name}_{next(_topics)}"


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- produce and consume ------------------------------------------------------------------------


def test_produce_prints_where_each_message_went_and_consume_prints_it_back(
    store: Store, topic: str
) -> None:
    out = store.ok("produce", topic, "hello", "wörld", "--key", "k1", "--tags", "t1", "-p", "a=b")
    lines = out.splitlines()
    assert len(lines) == 2
    matches = [RESULT_LINE.match(line) for line in lines]
    assert all(matches), lines
    # One key: one queue (the key's hash), offsets in the order given.
    queues = {m.group(1) for m in matches if m}
    assert len(queues) == 1
    assert [int(m.group(2)) for m in matches if m] == [0, 1]

    store.wait_dispatched(topic, 2)
    human = store.ok("consume", topic).splitlines()
    q = queues.pop()
    assert re.match(rf"^{q}:0  \d{{4}}-\d\d-\d\dT[\d:.]+[+-]\d\d:\d\d  k1  hello$", human[0])
    assert human[1].startswith(f"{q}:1  ") and human[1].endswith("  k1  wörld")

    records = _json_lines(store.ok("consume", topic, "--json"))
    assert [r["body"] for r in records] == ["hello", "wörld"]
    assert records[0]["tags"] == "t1" and records[0]["keys"] == ["k1"]
    assert records[0]["properties"]["a"] == "b"
    first = matches[0]
    assert first is not None and records[0]["msg_id"] == first.group(3)


def test_lines_from_stdin_and_a_file_and_a_whole_file_arrive_byte_for_byte(
    store: Store, topic: str, tmp_path: Path
) -> None:
    lines_file = tmp_path / "lines.txt"
    lines_file.write_bytes(b"from file 1\nfrom file 2\n")
    whole = tmp_path / "whole.json"
    whole.write_bytes(b'{\n  "multi": "line"\n}\n')
    # Everything to queue 0, so that consume's order is the order sent.
    sent = store.ok("produce", topic, "-", "--queue", "0", input=b"l1\nl2\r\n\nl4")
    assert len(sent.splitlines()) == 4  # an empty line is a message; no newline at the end
    store.ok("produce", topic, "--file", str(lines_file), "--queue", "0")
    results = _json_lines(
        store.ok("produce", topic, "--file", str(whole), "--whole", "--queue", "0", "--json")
    )
    assert len(results) == 1 and results[0]["queue_offset"] == 6

    store.wait_dispatched(topic, 7)
    bodies = [r["body"] for r in _json_lines(store.ok("consume", topic, "--json"))]
    assert bodies == ["l1", "l2", "", "l4", "from file 1", "from file 2", whole.read_text()]
    raw = store.ok("consume", topic, "--raw", "--count", "4")
    assert raw == "l1\nl2\n\nl4\n"


def test_load_mode_sends_count_messages_of_size_bytes_and_sums_up(store: Store, topic: str) -> None:
    summary = json.loads(store.ok("produce", topic, "--count", "300", "--size", "64", "--json"))
    assert summary["messages"] == 300 and summary["bytes"] == 300 * 64
    assert summary["seconds"] > 0 and summary["messages_per_s"] > 0
    human = store.ok("produce", topic, "--count", "20", "--size", "10")
    assert re.match(r"^sent 20 messages, 200 bytes to \S+ in [\d.]+ s: [\d,]+ msg/s", human)

    store.wait_dispatched(topic, 320)
    queues = json.loads(store.ok("queues", topic, "--json"))
    assert sum(q["messages"] for q in queues["queues"]) == 320
    assert len(queues["queues"]) == 4  # round robin over the default 4 queues
    sample = _json_lines(store.ok("consume", topic, "--count", "1", "--json"))
    assert len(sample) == 1 and len(sample[0]["body"]) in (64, 10)


def _produce_two_rounds(store: Store, topic: str) -> int:
    """a b c, then d e f in a later process (so a later store time): all in queue 0. Returns
    the store time of d."""
    store.ok("produce", topic, "a", "b", "c", "--queue", "0")
    second = _json_lines(store.ok("produce", topic, "d", "e", "f", "--queue", "0", "--json"))
    store.wait_dispatched(topic, 6)
    return int(second[0]["store_timestamp_ms"])


def _bodies(out: str) -> list[str]:
    return [r["body"] for r in _json_lines(out)]


def test_consume_starts_at_an_offset_a_time_the_start_or_the_end(store: Store, topic: str) -> None:
    d_ms = _produce_two_rounds(store, topic)
    assert _bodies(store.ok("consume", topic, "--from-offset", "4", "--json")) == ["e", "f"]
    assert _bodies(store.ok("consume", topic, "--from-time", str(d_ms), "--json")) == [
        "d",
        "e",
        "f",
    ]
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(d_ms // 1000))
    iso += f".{d_ms % 1000:03d}Z"
    assert _bodies(store.ok("consume", topic, "--from-time", iso, "--json")) == ["d", "e", "f"]
    assert _bodies(store.ok("consume", topic, "--from", "earliest", "-n", "2", "--json")) == [
        "a",
        "b",
    ]
    assert store.ok("consume", topic, "--from", "latest") == ""
    assert store.ok("consume", topic, "--from-time", "now") == ""


def test_a_group_commits_what_was_printed_and_resumes_there(store: Store, topic: str) -> None:
    d_ms = _produce_two_rounds(store, topic)
    group = f"g_{topic}"
    first = store.ok("consume", topic, "--group", group, "--count", "2", "--commit", "--json")
    assert _bodies(first) == ["a", "b"]
    # Default start with a group: where it committed.
    second = store.ok("consume", topic, "--group", group, "--count", "2", "--commit", "--json")
    assert _bodies(second) == ["c", "d"]
    shown = json.loads(store.ok("offsets", "show", group, topic, "--json"))
    assert shown["queues"] == [
        {"queue_id": 0, "committed": 4, "min_offset": 0, "max_offset": 6, "lag": 2}
    ]
    # Reading without --commit moves nothing.
    assert _bodies(store.ok("consume", topic, "-g", group, "--from", "committed", "--json")) == [
        "e",
        "f",
    ]
    assert json.loads(store.ok("offsets", "show", group, topic, "--json"))["total_lag"] == 2
    table = store.ok("offsets", "show", group, topic)
    assert re.search(r"│\s+0 │\s+4 │\s+0 │\s+6 │\s+2 │", table), table

    # A group that never committed: the whole queue is its lag (it would start at earliest).
    fresh = json.loads(store.ok("offsets", "show", f"{group}-new", topic, "--json"))
    assert fresh["queues"][0]["committed"] is None and fresh["total_lag"] == 6, fresh
    # --dry-run: what it would set, nothing committed.
    dry = ("offsets", "reset", group, topic, "--to", "earliest", "--dry-run")
    assert store.ok(*dry) == "queue 0: 4 -> 0\n"
    assert json.loads(store.ok(*dry, "--json"))["dry_run"] is True
    assert (
        json.loads(store.ok("offsets", "show", group, topic, "--json"))["queues"][0]["committed"]
        == 4
    )
    assert store.ok("offsets", "reset", group, topic, "--to", "earliest") == "queue 0: 4 -> 0\n"
    by_time = json.loads(
        store.ok("offsets", "reset", group, topic, "--to-time", str(d_ms), "--json")
    )
    assert by_time["queues"] == [{"queue_id": 0, "before": 0, "offset": 3}]
    assert store.ok("offsets", "reset", group, topic, "--to", "99") == "queue 0: 3 -> 6\n"
    assert store.ok("consume", topic, "--group", group) == ""


def test_groups_lists_every_group_with_its_lag_on_each_topic(store: Store, topic: str) -> None:
    _produce_two_rounds(store, topic)
    other = f"{topic}_b"
    store.ok("produce", other, "x", "y", "z")
    store.wait_dispatched(other, 3)
    group = f"lag_{topic}"
    store.ok("consume", topic, "--group", group, "--count", "2", "--commit")
    store.ok("offsets", "reset", group, other, "--to", "latest")
    store.ok("offsets", "reset", f"{group}_2", topic, "--to", "earliest")

    listed = json.loads(store.ok("groups", "--json"))
    mine = [g for g in listed["groups"] if g["group"].startswith(group)]
    assert [(g["group"], g["topic"], g["total_lag"]) for g in mine] == [
        (group, topic, 4),
        (group, other, 0),
        (f"{group}_2", topic, 6),
    ], mine
    assert listed["truncated"] is False
    one = json.loads(store.ok("groups", group, "--json"))["groups"]
    assert {g["group"] for g in one} == {group}
    assert one[[g["topic"] for g in one].index(topic)]["queues"] == [
        {"queue_id": 0, "committed": 2, "min_offset": 0, "max_offset": 6, "lag": 4}
    ]
    table = store.ok("groups", group)
    assert re.search(rf"{group}\s+│ {topic}\s+│\s+1 │\s+1 │\s+4 │", table), table

    missing = store.run("groups", "nosuchgroup")
    assert missing.returncode == 4 and "no consumer group 'nosuchgroup'" in missing.stderr


def test_follow_prints_new_messages_and_ctrl_c_commits_and_exits_0(
    store: Store, topic: str
) -> None:
    store.ok("produce", topic, "before", "--queue", "0")
    store.wait_dispatched(topic, 1)
    group = f"g_{topic}"
    command = [sys.executable, "-m", "mqstore.cli", "consume", topic, "--follow",
               "--group", group, "--commit", "--raw"]  # fmt: skip
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**store.env, "PYTHONFAULTHANDLER": "1"},
        cwd=REPO,
    ) as follower:
        assert follower.stdout is not None and follower.stderr is not None
        try:
            assert follower.stdout.readline() == b"before\n"
            store.ok("produce", topic, "after", "--queue", "0")
            assert follower.stdout.readline() == b"after\n"  # arrives while following
            follower.send_signal(signal.SIGINT)
            try:
                assert follower.wait(timeout=RUN_TIMEOUT_S) == 0
            except subprocess.TimeoutExpired:
                follower.send_signal(signal.SIGABRT)  # faulthandler prints where it hangs
                follower.wait()
                pytest.fail(f"no exit after Ctrl-C: {follower.stderr.read().decode()[-4000:]}")
            assert follower.stderr.read() == b""  # quiet: no "Aborted!", no traceback
        finally:
            if follower.poll() is None:
                follower.kill()
    shown = json.loads(store.ok("offsets", "show", group, topic, "--json"))
    assert shown["queues"][0]["committed"] == 2


def test_follow_with_count_commits_exactly_the_messages_printed(store: Store, topic: str) -> None:
    store.ok("produce", topic, "1", "2", "3", "4", "5", "--queue", "0")
    store.wait_dispatched(topic, 5)
    group = f"g_{topic}"
    # One poll brings all five; three are printed, and only three are committed.
    assert store.ok("consume", topic, "-f", "-n", "3", "-g", group, "--commit", "--raw") == (
        "1\n2\n3\n"
    )
    assert store.ok("consume", topic, "-g", group, "--raw") == "4\n5\n"


# -- queries ------------------------------------------------------------------------------------


def test_query_by_key_unique_id_and_message_id(store: Store, topic: str) -> None:
    sent = _json_lines(store.ok("produce", topic, "one", "two", "--key", "qk", "--json"))
    store.wait_indexed(topic, "qk", 2)

    lines = store.ok("query", "key", topic, "qk").splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(f"qk  two  [{sent[1]['msg_id']}]")  # newest first
    found = _json_lines(store.ok("query", "key", topic, "qk", "--all", "--json"))
    assert sorted(m["body"] for m in found) == ["one", "two"]
    assert _bodies(store.ok("query", "key", topic, "qk", "--max", "1", "--json")) == ["two"]

    by_uniq = _json_lines(store.ok("query", "uniq", topic, sent[0]["uniq_key"], "--json"))
    assert [m["body"] for m in by_uniq] == ["one"]
    block = store.ok("query", "msg", sent[1]["msg_id"])
    assert f"msg_id             {sent[1]['msg_id']}" in block
    assert block.endswith("body:\ntwo\n")
    assert json.loads(store.ok("query", "msg", sent[0]["msg_id"], "--json"))["body"] == "one"


def test_a_query_without_a_match_exits_4(store: Store, topic: str) -> None:
    store.ok("produce", topic, "x", "--key", "present")
    store.wait_indexed(topic, "present", 1)
    for args in (
        ("query", "key", topic, "absent"),
        ("query", "uniq", topic, "0" * 32),
        # A well-formed id past the end of the log: NOT_FOUND from the store.
        ("query", "msg", "7F00000100001F90" + "7" * 16),
        ("queues", f"{topic}_never_written"),
        # A one-off read of a topic or queue that does not exist: not an empty success.
        ("consume", f"{topic}_never_written"),
        ("consume", topic, "--queue", "99"),
        ("offsets", "reset", "g", topic, "--to", "earliest", "--queue", "99"),
        ("offsets", "reset", "g", f"{topic}_never_written", "--to", "earliest"),
    ):
        done = store.run(*args)
        assert done.returncode == 4, (args, done.stderr)
        assert done.stdout == ""
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1


# -- status -------------------------------------------------------------------------------------


def test_status_topics_and_queues_describe_the_store(store: Store, topic: str) -> None:
    store.ok("produce", topic, "s1", "s2", "--queue", "3")
    store.wait_dispatched(topic, 2)
    cq, index = store.env["MQSTORE_CQ"], store.env["MQSTORE_INDEX"]

    table = store.ok("status")
    for needed in ("commit log", "subscribers", "replicas", cq, index, "0 of 1"):
        assert needed in table
    status = json.loads(store.ok("status", "--json"))
    assert status["commitlog"]["address"] == store.env["MQSTORE_COMMITLOG"]
    assert status["commitlog"]["max_offset"] > 0 and status["commitlog"]["writable"]
    assert [r["address"] for r in status["cq"]] == [cq]
    assert status["cq"][0]["reachable"] and status["index"][0]["reachable"]
    assert {s["subscriber_id"] for s in status["commitlog"]["subscribers"]} == {"cq", "index"}

    assert topic in store.ok("topics").splitlines()
    assert topic in json.loads(store.ok("topics", "--json"))
    queues = store.ok("queues", topic)
    assert re.search(r"│\s+3 │\s+0 │\s+2 │\s+2 │", queues), queues


# -- failures -----------------------------------------------------------------------------------


def test_an_unreachable_store_exits_3_naming_where_it_looked(store: Store, topic: str) -> None:
    nowhere = f"127.0.0.1:{_closed_port()}"
    env = {"MQSTORE_COMMITLOG": nowhere, "MQSTORE_CQ": nowhere, "MQSTORE_INDEX": nowhere,
           "MQSTORE_TIMEOUT_S": "0.5"}  # fmt: skip
    for args in (("status",), ("consume", topic), ("produce", topic, "x")):
        done = store.run(*args, env=env)
        assert done.returncode == 3, (args, done.stderr)
        assert "Traceback" not in done.stderr
        last = done.stderr.splitlines()[-1]  # after any "warning: ... retrying"
        assert last.startswith("error: ") and nowhere in last
    # The options win over the environment.
    real = ("--commitlog", store.env["MQSTORE_COMMITLOG"], "--cq", store.env["MQSTORE_CQ"],
            "--index", store.env["MQSTORE_INDEX"])  # fmt: skip
    assert store.run(*real, "status", env=env).returncode == 0


def test_an_error_answered_by_the_store_exits_1(store: Store) -> None:
    done = store.run("queues", "no/such/topic")  # the server checks the topic's pattern
    assert done.returncode == 1
    assert done.stderr.startswith("error: ConsumeQueue/ListQueues: INVALID_ARGUMENT: ")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ["consume", "t", "--from-time", "yesterday"],
        ["consume", "t", "--no-such-option"],
        ["produce", "t", "--count", "-1"],
    ],
)
def test_bad_arguments_exit_2_with_one_error_line_as_a_process(
    store: Store, args: list[str]
) -> None:
    done = store.run(*args)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.startswith("Error: ")]) == 1


# -- in-process: usage checks that never reach a service ----------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["consume", "t", "--from", "committed"], "--from committed needs --group"),
        (["consume", "t", "--commit"], "--commit needs --group"),
        (["consume", "t", "--from-offset", "1", "--from", "latest"], "give one of"),
        (["consume", "t", "--raw", "--json"], "--raw or --json"),
        (["produce", "t"], "nothing to send"),
        (["produce", "t", "--size", "5"], "--size needs --count"),
        (["produce", "t", "--whole"], "--whole needs --file"),
        (["produce", "t", "a", "b", "--count", "2"], "at most one BODY"),
        (["produce", "t", "-p", "novalue"], "is not NAME=VALUE"),
        (["offsets", "reset", "g", "t"], "give one of --to"),
        (["offsets", "reset", "g", "t", "--to", "-3"], "not earliest, latest or an offset"),
        (["query", "key", "t", "k", "--begin", "2 fortnights ago"], "unknown unit"),
        (["query", "key", "t", "k", "--begin", "now", "--end", "1 day ago"], "before --begin"),
        (["query", "key", "t", "k", "--max", "0"], "--max"),
    ],
)
def test_bad_arguments_exit_2_before_anything_is_sent(args: list[str], message: str) -> None:
    nowhere = f"127.0.0.1:{_closed_port()}"  # nothing may be contacted
    result = CliRunner().invoke(cli, ["--commitlog", nowhere, "--cq", nowhere, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_settings_that_cannot_work_exit_2() -> None:
    for args, message in (
        (["--timeout", "0", "status"], "a number of seconds above 0"),
        (["--token-file", "/nonexistent/token", "status"], "cannot read /nonexistent/token"),
        (["--tls-cert", "c.pem", "status"], "--tls-cert and --tls-key go together"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        assert message in result.output


def test_offline_commands_ignore_the_connection_settings(store: Store, topic: str) -> None:
    store.ok("produce", topic, "on disk")  # the log has a segment, whichever test ran first
    env = {"MQSTORE_TIMEOUT_S": "not a number", "MQSTORE_TLS_CERT": "missing.pem"}
    directory = str(store.cluster.root / "commitlog")
    result = CliRunner().invoke(cli, ["log", "verify", directory], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok: ")


@pytest.mark.parametrize(
    "command",
    [
        ["produce"],
        ["consume"],
        ["query"],
        ["query", "key"],
        ["query", "uniq"],
        ["query", "msg"],
        ["status"],
        ["topics"],
        ["queues"],
        ["offsets"],
        ["offsets", "show"],
        ["offsets", "reset"],
        ["groups"],
    ],
)
def test_every_command_explains_itself_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    examples = result.output.partition("Examples:")[2]
    assert examples.count("\n    mqstore ") >= 2


def test_subscribers_are_listed_and_a_stopped_one_is_forgotten(store: Store) -> None:
    status = store.admin.status().commitlog
    stub = store.cluster.commitlog_stub()
    stub.Confirm(
        cl.ConfirmRequest(
            subscriber_id="scaled-away", store_id=bytes.fromhex(status.store_id),
            confirmed_offset=0,
        ),
        timeout=10,
    )  # fmt: skip
    listed = {s["subscriber_id"]: s for s in json.loads(store.ok("subscribers", "list", "--json"))}
    assert {"cq", "index", "scaled-away"} <= set(listed)
    assert listed["cq"]["connected"] and not listed["scaled-away"]["connected"]
    # When each was last seen (a Subscribe or a Confirm), so a gone one can be told apart.
    now_ms = time.time() * 1000
    assert all(0 < s["last_seen_ms"] <= now_ms for s in listed.values())
    table = store.ok("subscribers", "list")
    assert "scaled-away" in table and "last seen" in table and " s ago" in table
    out = store.ok("subscribers", "forget", "scaled-away")
    assert out.startswith("forgot scaled-away; retention floor now")
    assert "scaled-away" not in {s.subscriber_id for s in store.admin.lag()}
    again = store.run("subscribers", "forget", "scaled-away")
    assert again.returncode == 4 and again.stderr.startswith("error:")
    connected = store.run("subscribers", "forget", "cq")
    assert connected.returncode == 1 and "connected" in connected.stderr


@pytest.mark.parametrize("msg_id", ["ZZZ", "7F00000100001F90" + "Z" * 16, "7F000001" * 3])
def test_a_malformed_message_id_is_a_bad_argument(msg_id: str) -> None:
    # Nothing listens at the address: the id is refused before any store is asked (exit 2,
    # not 3 for an unreachable store nor 1 for a store error).
    result = CliRunner().invoke(
        cli, ["query", "msg", msg_id], env={"MQSTORE_COMMITLOG": "127.0.0.1:9"}
    )
    assert result.exit_code == 2, result.output
    assert "MSG_ID" in result.output and "hex" in result.output


@pytest.mark.parametrize("address", ["notaport", "host:99999", "host:"])
def test_a_mistyped_address_is_a_bad_argument(address: str) -> None:
    result = CliRunner().invoke(cli, ["--commitlog", address, "status"])
    assert result.exit_code == 2, result.output
    assert f"the commitlog address {address!r} is not one" in result.output
