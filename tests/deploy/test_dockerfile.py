"""The image, checked without a Docker engine: the rules of a good image (multi-stage, pinned
slim base, non-root, nothing to build with in the final stage), every path and command it
names exists, and the package it installs, built from exactly what it copies, holds the three
services and the `mqstore` command."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.tools import DEPLOY, REPO

DOCKERFILE = DEPLOY / "Dockerfile"
IGNORE = DEPLOY / "Dockerfile.dockerignore"
SERVICES = ("commitlog_svc", "cq_svc", "index_svc")
RUN_AS = 10001
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|make|build-essential|apt-get\s+install|apk\s+add|pip\s+install|"
    r"python\s+-m\s+pip|setup\.py)\b"
)
WHEEL_BUILD_TIMEOUT_S = 120.0


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]


def parse(text: str) -> list[Stage]:
    """Instructions by stage: continuation lines joined, comments and blank lines dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        op, _, arg = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = arg.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else ""
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instructions.append((op, arg.strip()))
        else:
            assert op == "ARG", f"{op} before the first FROM"
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))


def test_the_image_is_built_in_stages_on_a_pinned_slim_python(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    for stage in stages:
        repo, _, tag = stage.image.partition(":")
        assert repo == "python" and tag, stage.image
        assert tag != "latest" and "slim" in tag, stage.image
        assert re.match(r"\d+\.\d+\.\d+-", tag), f"{stage.image}: pin the patch version"
        assert stage.name, f"{stage.image}: name the stage (AS ...)"
    assert len({s.image for s in stages}) == 1, "the venv's python must be the base's"


def test_the_final_stage_runs_as_the_manifests_unprivileged_user(stages: list[Stage]) -> None:
    yaml = pytest.importorskip("yaml")
    final = stages[-1]
    users = final.all("USER")
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert (int(uid), int(gid or uid)) == (RUN_AS, RUN_AS)
    # The position of USER: after everything that needs root, before CMD.
    ops = [op for op, _ in final.instructions]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")
    for tier in ("commitlog", "cq", "index"):
        doc = next(yaml.safe_load_all((DEPLOY / "base" / f"{tier}.yaml").read_text()))
        sc = doc["spec"]["template"]["spec"]["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (RUN_AS, RUN_AS, RUN_AS)


def test_the_final_stage_has_no_build_tools_and_takes_only_the_venv(stages: list[Stage]) -> None:
    final = stages[-1]
    for run in final.all("RUN"):
        assert not BUILD_TOOLS.search(run), f"build step in the final stage: {run}"
    copies = final.all("COPY")
    assert copies, "the final stage copies nothing"
    earlier = {s.name for s in stages[:-1]}
    for copy in copies:
        m = re.match(r"--from=(\S+)\s+(\S+)\s+(\S+)$", copy)
        assert m, f"the final stage copies from the build context: {copy}"
        assert m.group(1) in earlier, f"{copy}: no earlier stage {m.group(1)}"
        assert m.group(2) == m.group(3) == "/opt/mqstore", copy
    env = " ".join(final.all("ENV"))
    assert "PATH=/opt/mqstore/bin:" in env, "the venv's bin must come first on PATH"
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "the root filesystem is read-only"
    build = stages[0]
    assert any("python -m venv /opt/mqstore" in r for r in build.all("RUN"))


def _ignored(relative: str, patterns: list[str]) -> bool:
    """BuildKit's rule, for the patterns used here: the last matching pattern decides."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        p = pattern[1:] if negate else pattern
        p = p.rstrip("/")
        if fnmatch.fnmatch(relative, p) or relative.startswith(p + "/"):
            ignored = not negate
    return ignored


def _ignore_patterns() -> list[str]:
    lines = IGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _context_sources(stages: list[Stage]) -> list[str]:
    sources = []
    for stage in stages:
        for copy in stage.all("COPY") + stage.all("ADD"):
            if copy.startswith("--from="):
                continue
            sources += copy.split()[:-1]
    return sources


def test_every_path_the_dockerfile_copies_exists_and_is_in_the_build_context(
    stages: list[Stage],
) -> None:
    assert not any(s.all("ADD") for s in stages), "ADD fetches and unpacks: use COPY"
    patterns = _ignore_patterns()
    sources = _context_sources(stages)
    assert sources
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: no such path in the repository"
        assert not _ignored(source.rstrip("/"), patterns), f"COPY {source}: .dockerignore hides it"
    # And the package's sources are all there: every package setuptools is told to include.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for include in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = include.rstrip("*")
        assert any(s.rstrip("/") == top for s in sources), f"package {top} is not copied"


def test_the_commands_the_image_and_the_manifests_run_exist(stages: list[Stage]) -> None:
    yaml = pytest.importorskip("yaml")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = pyproject["project"]["scripts"]
    cmd = stages[-1].all("CMD")[-1]
    assert cmd.startswith("[") and cmd.endswith("]"), "CMD in exec form (signals reach it)"
    program = re.findall(r'"([^"]*)"', cmd)[0]
    assert program in scripts, f"CMD runs {program}, which pyproject does not install"
    for service in SERVICES:
        assert (REPO / service / "__main__.py").is_file()
    assert (REPO / "mqstore" / "cli" / "__main__.py").is_file()
    for tier in ("commitlog", "cq", "index"):
        doc = next(yaml.safe_load_all((DEPLOY / "base" / f"{tier}.yaml").read_text()))
        command = doc["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[:2] == ["python", "-m"] and command[2] in SERVICES, command


def test_the_installed_package_holds_the_services_and_the_command(
    stages: list[Stage], tmp_path: Path
) -> None:
    """Build the wheel the image's `pip install` would, from a context holding only what the
    Dockerfile copies (so a file the image lacks fails here)."""
    pytest.importorskip("setuptools")
    context = tmp_path / "src"
    context.mkdir()
    for source in _context_sources(stages):
        src = REPO / source
        if src.is_dir():
            shutil.copytree(src, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, context / source)
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(context)],
        capture_output=True, text=True, timeout=WHEEL_BUILD_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (wheel,) = out.glob("mqstore-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        scripts = z.read(entry_points).decode()
    for module in (*SERVICES, "mqstore/cli"):
        assert f"{module}/__main__.py" in names, f"the image would lack {module}"
    assert "mqstore/rpc/gen/commitlog/v1/commitlog_pb2.py" in names
    assert any(re.match(r"mqstore/formats/_core\..*\.so$", n) for n in names), "no record core"
    assert re.search(r"^mqstore = mqstore\.cli:main$", scripts, re.M), scripts


def test_the_parser_sees_continuations_and_stages() -> None:
    text = (
        "# c\nFROM python:3.11.7-slim-bookworm AS a\nRUN one \\\n    two\n"
        "FROM python:3.11.7-slim-bookworm AS b\nUSER 1:1\n"
    )
    a, b = parse(text)
    assert (a.name, a.all("RUN"), b.all("USER")) == ("a", ["one two"], ["1:1"])
    assert _ignored("mqstore", ["*", "!mqstore/"]) is False
    assert _ignored("docs", ["*", "!mqstore/"]) is True
