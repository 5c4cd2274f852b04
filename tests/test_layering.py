"""The package layering of STYLE.md, checked by walking every module's imports with ast.

mqstore/formats   imports nothing from mqstore.storage, mqstore.rpc or any service
mqstore/storage   imports nothing from mqstore.rpc (the disk layer knows no wire)
mqstore/          never imports commitlog_svc, cq_svc or index_svc
mqstore/client    (the SDK) imports nothing that starts processes or runs the CLI:
                  mqstore.launcher, mqstore.testing, mqstore.cli
each service      never imports another service
bench/, chaos/, fuzz/ and mqstore/ never import tests/ (shared support code lives in the
                  package, e.g. mqstore/testing/cluster.py)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVICES = ("commitlog_svc", "cq_svc", "index_svc")
TOOLS = ("bench", "chaos", "fuzz")
PACKAGES = ("mqstore", *SERVICES, *TOOLS)
# Generated gRPC stubs import only grpc and protobuf; they are not ours to lay out.
SKIP_DIRS = ("mqstore/rpc/gen",)
# What the SDK leaves out: an application that only sends and receives needs none of it.
SDK_BANNED = ("mqstore.launcher", "mqstore.testing", "mqstore.cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool) -> set[str]:
    """Every module an import statement in `source` names, relative imports resolved, including
    imports inside functions and under TYPE_CHECKING."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: -(node.level - 1)]
                base = ".".join(base_parts)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from mqstore import storage` imports the submodule mqstore.storage.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def python_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(rel.startswith(skip + "/") for skip in SKIP_DIRS):
                continue
            files.append(path)
    return files


def all_imports() -> dict[str, set[str]]:
    out = {}
    for path in python_files():
        name = module_name(path)
        out[name] = imported_modules(
            path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py"
        )
    return out


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(imports: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in sorted(imports.items()):
        for target in sorted(targets):
            if within(module, "mqstore.formats"):
                for banned in ("mqstore.storage", "mqstore.rpc", *SERVICES):
                    if within(target, banned):
                        found.append(f"{module} imports {target}: formats must stay pure")
            if within(module, "mqstore.client"):
                for banned in SDK_BANNED:
                    if within(target, banned):
                        found.append(f"{module} imports {target}: the SDK starts no processes")
            if within(module, "mqstore.storage") and within(target, "mqstore.rpc"):
                found.append(f"{module} imports {target}: storage knows no wire")
            if (within(module, "mqstore") or any(within(module, t) for t in TOOLS)) and within(
                target, "tests"
            ):
                found.append(f"{module} imports {target}: nothing outside tests/ imports it")
            if within(module, "mqstore"):
                for service in SERVICES:
                    if within(target, service):
                        found.append(f"{module} imports {target}: mqstore imports no service")
            for service in SERVICES:
                if not within(module, service):
                    continue
                for other in SERVICES:
                    if other != service and within(target, other):
                        found.append(f"{module} imports {target}: services never import each other")
    return found


def test_the_walk_sees_every_package_and_real_imports() -> None:
    imports = all_imports()
    # Guards against a walk that silently finds nothing and so always passes.
    assert "mqstore.formats.record" in imports
    assert "commitlog_svc.commitlog" in imports
    assert "mqstore.formats.properties" in imports["mqstore.formats.record"]
    assert any(within(t, "mqstore.storage") for t in imports["commitlog_svc.commitlog"])
    assert "mqstore.testing.cluster" in imports["chaos.services"]
    assert any(within(t, "mqstore") for t in imports["fuzz.targets.metafiles"])
    assert any(within(t, "mqstore") for t in imports["bench.e2e_bench"])


def test_packages_import_only_along_the_allowed_layers() -> None:
    assert violations(all_imports()) == []


@pytest.mark.parametrize(
    ("module", "is_package", "source", "expected"),
    [
        ("mqstore.formats.x", False, "from mqstore.storage import disk", "formats must stay pure"),
        ("mqstore.formats.x", False, "from ..storage.disk import Disk", "formats must stay pure"),
        ("mqstore.formats", True, "from ..rpc import gen", "formats must stay pure"),
        ("mqstore.formats.x", False, "def f():\n    import cq_svc.store", "formats must stay"),
        ("mqstore.cli", False, "import commitlog_svc.commitlog", "mqstore imports no service"),
        ("mqstore.x", False, "from index_svc import shards", "mqstore imports no service"),
        ("cq_svc.store", False, "from commitlog_svc.commitlog import X", "each other"),
        ("index_svc.a.b", False, "import cq_svc", "each other"),
        ("commitlog_svc.x", False, "from mqstore.storage import disk", None),
        ("mqstore.storage.x", False, "from mqstore.formats import record", None),
        ("mqstore.formats.x", False, "from . import sysflag\nfrom .properties import P", None),
        ("mqstore.storage.x", False, "from mqstore.rpc import channel", "knows no wire"),
        ("mqstore.storage.x", False, "from ..rpc.gen import x", "knows no wire"),
        ("mqstore.rpc.x", False, "from mqstore.storage import disk", None),
        ("bench.e2e_bench", False, "from tests.e2e.cluster import Cluster", "outside tests/"),
        ("chaos.services", False, "import tests.e2e.support", "outside tests/"),
        ("fuzz.targets.x", False, "from tests import helpers", "outside tests/"),
        ("mqstore.testing", True, "from tests.e2e import support", "outside tests/"),
        ("bench.x", False, "from mqstore.testing.cluster import Cluster", None),
        ("mqstore.client.settings", False, "from mqstore.launcher import X", "starts no"),
        ("mqstore.client", True, "from ..testing import cluster", "starts no processes"),
        ("mqstore.client.x", False, "from mqstore.ports import DEFAULT_PORTS", None),
        ("mqstore.cli.up", False, "from mqstore.launcher import ServiceProcess", None),
    ],
)
def test_the_checker_catches_each_kind_of_violation(
    module: str, is_package: bool, source: str, expected: str | None
) -> None:
    found = violations({module: imported_modules(source, module, is_package=is_package)})
    if expected is None:
        assert found == []
    else:
        assert any(expected in v for v in found), found
