"""data_mode.apply: the umask it sets, and the tightening of a data directory an earlier version
(or a copy) left readable by others. Real files; the process umask is restored after each test."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mqstore.storage import data_mode


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def loose_tree(top: Path) -> dict[str, Path]:
    """A directory 0755 holding a file 0644, a subdirectory 0775 with a 0664 file, and a link
    to a file outside the tree (which must stay as it is)."""
    top.mkdir(mode=0o755)
    (top / "sub").mkdir(mode=0o775)
    files = {"file": top / "segment", "nested": top / "sub" / "unit"}
    for path in files.values():
        path.write_bytes(b"data")
    os.chmod(files["file"], 0o644)
    os.chmod(files["nested"], 0o664)
    os.chmod(top, 0o755)
    os.chmod(top / "sub", 0o775)
    outside = top.parent / "outside"
    outside.write_bytes(b"not ours")
    os.chmod(outside, 0o644)
    (top / "link").symlink_to(outside)
    return {**files, "sub": top / "sub", "outside": outside}


@pytest.mark.parametrize(
    ("kind", "dirs", "files"), [("private", 0o700, 0o600), ("group", 0o750, 0o640)]
)
def test_a_loose_data_dir_is_tightened_and_new_files_are_born_tight(
    tmp_path: Path, kind: data_mode.DataMode, dirs: int, files: int
) -> None:
    top = tmp_path / "data"
    made = loose_tree(top)
    assert data_mode.apply(str(top), kind) == 4  # top, sub and the two files
    assert (mode(top), mode(made["sub"])) == (dirs, dirs)
    assert (mode(made["file"]), mode(made["nested"])) == (files, files)
    assert mode(made["outside"]) == 0o644  # a link is not followed
    (top / "new-dir").mkdir()
    (top / "new-file").write_bytes(b"x")
    assert (mode(top / "new-dir"), mode(top / "new-file")) == (dirs, files)
    assert data_mode.apply(str(top), kind) == 0  # already tight: nothing to walk


def test_bits_are_only_taken_away(tmp_path: Path) -> None:
    top = tmp_path / "data"
    top.mkdir(mode=0o755)
    tight = top / "owner-read-only"
    tight.write_bytes(b"x")
    os.chmod(tight, 0o400)
    os.chmod(top, 0o755)
    data_mode.apply(str(top), "private")
    assert mode(tight) == 0o400


def test_a_missing_data_dir_is_made_with_its_parents(tmp_path: Path) -> None:
    top = tmp_path / "a" / "b"
    data_mode.apply(str(top), "private")
    assert mode(top) == 0o700 and mode(tmp_path / "a") == 0o700
