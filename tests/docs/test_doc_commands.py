"""Every shell command in README.md and the docs works as written.

A fenced block tagged `sh` is a list of commands to run (a `\\` at a line's end continues it);
a block of Python tagged `python` in README.md is a program to run; anything else a reader
might take for commands (a synopsis, a transcript, output) is fenced `text`. For each document
the commands run in its order, in a directory holding the repository's files and no data, in
a network namespace of its own (the ports the docs name, nothing else listening), with the
venv's bin on PATH as after `. .venv/bin/activate` (README: "Using it"): tests/docs/
doc_session.py. A command that serves (`make run`, `mqstore up`, a service by hand) runs in
the background as in a shell of its own; one that follows (`--follow`) gets Ctrl-C after a
few seconds; every other one must exit 0.

NOT_RUN names the commands not run here and why; a rule that no longer matches anything fails,
so the list cannot outlive the docs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.environ import environ_without

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "deploy").rglob("README.md")]
)
SESSION_TIMEOUT_S = 1200.0
FENCE = re.compile(r"^```(\S*)\s*$")
# A line that reads as a command a reader would type, in a fence without a language.
LOOKS_LIKE_A_COMMAND = re.compile(
    r"^\s*(\$ )?(mqstore|make|python|\.venv/|pip|kubectl|docker|kind|export|grpcurl|"
    r"grpc_health_probe|spark-submit|curl)\b"
)
SERVES = re.compile(
    r"^(make run\b|mqstore up\b|python -m (commitlog_svc|cq_svc|index_svc) |\.venv/bin/etcd\b)"
)
FOLLOWS = re.compile(r"(^| )--follow\b")
NOT_RUN: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^make test\b"), "the suite this test belongs to"),
    (
        re.compile(r"^make (bench|bench-peers|bench-memory|chaos|fuzz)\b"),
        "benchmarks, chaos and fuzzing run for minutes to hours: their own make targets",
    ),
    (
        re.compile(r"^\.venv/bin/(python -m (bench|fuzz)\b|pip install -e '\.\[fuzz\]')"),
        "benchmarks and fuzzing run for minutes to hours: their own make targets",
    ),
    (
        re.compile(r"^(kubectl|docker|kind|R=)\b"),
        "needs a Kubernetes cluster or a container runtime; tests/deploy checks the manifests "
        "and the Dockerfile offline",
    ),
]


@dataclass(frozen=True)
class Command:
    doc: str  # path from the repository root
    line: int
    text: str
    kind: str  # "run", "follow", "serve", "python"


def fenced_blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line of the first body line, body lines) of every fenced block."""
    blocks = []
    lang: str | None = None
    body: list[str] = []
    start = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        m = FENCE.match(line)
        if m and lang is None:
            lang, body, start = m.group(1), [], number + 1
        elif line.strip() == "```" and lang is not None:
            blocks.append((lang, start, body))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def shell_commands(start: int, body: list[str]) -> list[tuple[int, str]]:
    """Logical lines: `\\` at the end continues; blank lines and whole-line comments skipped."""
    out = []
    pending = ""
    first = 0
    for offset, line in enumerate(body):
        if not pending:
            first = start + offset
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((first, (pending + line).strip()))
        pending = ""
    return out


def _bare(command: str) -> str:
    """The command without its trailing comment (for classifying only; bash gets it whole)."""
    return re.sub(r"\s+#.*$", "", command)


def commands(path: Path) -> list[Command]:
    doc = str(path.relative_to(REPO))
    out = []
    for lang, start, body in fenced_blocks(path):
        if lang == "sh":
            for line, text in shell_commands(start, body):
                bare = _bare(text)
                kind = (
                    "serve" if SERVES.match(bare) else "follow" if FOLLOWS.search(bare) else "run"
                )
                out.append(Command(doc, line, text, kind))
        elif lang == "python" and path.name == "README.md" and path.parent == REPO:
            out.append(Command(doc, start, "\n".join(body), "python"))
    return out


def not_run_reason(command: Command) -> str | None:
    for pattern, reason in NOT_RUN:
        if command.kind != "python" and pattern.match(_bare(command.text)):
            return reason
    return None


ALL = [c for path in DOCS for c in commands(path)]


def test_every_block_a_reader_would_type_is_tagged() -> None:
    """A fence without a language holding command lines: tag it `sh` (run here) or `text`."""
    untagged = []
    for path in DOCS:
        for lang, start, body in fenced_blocks(path):
            if lang == "" and any(LOOKS_LIKE_A_COMMAND.match(line) for line in body):
                untagged.append(f"{path.relative_to(REPO)}:{start - 1}")
    assert not untagged, f"fence these as sh (commands to run) or text: {untagged}"


def test_every_not_run_rule_still_matches_a_command() -> None:
    unused = [
        p.pattern
        for p, _ in NOT_RUN
        if not any(p.match(_bare(c.text)) for c in ALL if c.kind != "python")
    ]
    assert not unused, f"NOT_RUN rules that match no command any more: {unused}"


def _session_dir(root: Path) -> Path:
    """The repository's files, linked (as a reader's clone), without any data directory."""
    work = root / "repo"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name.startswith("data") or entry.name in (".git", "build"):
            continue
        (work / entry.name).symlink_to(entry)
    return work


def _unavailable() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip"
    done = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        check=False,
    )
    return None if done.returncode == 0 else f"unshare: {done.stderr.decode().strip()}"


@pytest.mark.slow
@pytest.mark.timeout(SESSION_TIMEOUT_S + 60)
@pytest.mark.parametrize("doc", sorted({c.doc for c in ALL if not_run_reason(c) is None}))
def test_the_commands_of_a_doc_work_as_written(doc: str, tmp_path: Path) -> None:
    why = _unavailable()
    if why is not None:
        pytest.fail(f"cannot make a network namespace here: {why}")
    work = _session_dir(tmp_path)
    steps = []
    for c in (c for c in ALL if c.doc == doc and not_run_reason(c) is None):
        if c.kind == "python":
            script = work / f".snippet-{c.line}.py"
            script.write_text(c.text + "\n")
            steps.append(
                {"doc": doc, "line": c.line, "command": f"python {script.name}", "kind": "run"}
            )
        else:
            steps.append({"doc": doc, "line": c.line, "command": c.text, "kind": c.kind})
    venv_bin = str(REPO / ".venv" / "bin")
    env = environ_without("MQSTORE_", "PYTEST", "PYSPARK", "SPARK_", "VIRTUAL_ENV")
    env.update(
        PATH=f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        VIRTUAL_ENV=str(REPO / ".venv"),
        HOME=str(tmp_path / "home"),
        TERM="dumb",
    )
    (tmp_path / "home").mkdir()
    plan = tmp_path / "plan.json"
    results_path = tmp_path / "results.json"
    plan.write_text(json.dumps({"workdir": str(work), "env": env, "steps": steps}))
    done = subprocess.run(
        [
            "unshare",
            # A network of its own (the docs' ports), and processes of its own: the session
            # is their pid 1, so whatever ends it (a timeout here included: --kill-child) ends
            # every server it started too.
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            sys.executable,
            "-m",
            "tests.docs.doc_session",
            str(plan),
            str(results_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT_S,
        check=False,
    )
    assert results_path.exists(), done.stderr[-3000:]
    results = json.loads(results_path.read_text())
    assert len(results) == len(steps), done.stderr[-3000:]
    failed = []
    for r in results:
        ok = r["status"] == 0 and not r["problems"]
        if r["kind"] == "serve":
            ok = not r["problems"]  # still serving when ready; a `&` command has ended
        if not ok:
            failed.append(
                f"{r['doc']}:{r['line']} [{r['kind']}] {r['command']!r} -> status "
                f"{r['status']} {r['problems']} after {r['seconds']} s\n{r['output']}"
            )
    assert not failed, "\n\n".join(failed)
