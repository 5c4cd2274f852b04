"""The compiled record core's build (setup.py): a machine without a C compiler gets one error
that names what to install, not a page of compiler output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = (
    "setup.py",
    "mqstore/formats/_core.pyx",
    "mqstore/formats/_core_support.h",
    # the files _core.pyx includes, one per operation
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "mqstore/formats").glob("_core_*.pxi")),
)


def test_a_missing_compiler_names_the_packages_to_install(tmp_path: Path) -> None:
    for source in SOURCES:
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / source, tmp_path / source)
    env = {**os.environ, "CC": str(tmp_path / "no-such-gcc")}
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "no C compiler" in done.stderr, done.stderr[-2000:]
    assert "apt-get install gcc python3-dev" in done.stderr
    assert not list(tmp_path.rglob("*.so"))
