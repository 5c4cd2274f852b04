"""The fuzzing child: one target under atheris (libFuzzer), in its own process.

    python -m fuzz.engine TARGET [--keep-going] [--findings DIR] [libFuzzer flags and corpus]

`python -m fuzz` starts this; run it directly only to pass libFuzzer something unusual.

atheris instruments a module only when it is first imported inside its import hook, so this
module imports nothing of the project before `instrument_imports` (fuzz.findings and
fuzz.targets import nothing of it either).

Without --keep-going, the first finding is libFuzzer's crash: atheris prints the traceback and
libFuzzer saves the input (crash-<sha1>, under -artifact_prefix) and stops. With --keep-going, a
finding is written to DIR once per signature (fuzz/findings.py), announced on stderr as

    FINDING <target> <signature> <file>

and the run goes on, so that one known bug does not hide the next.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable

import atheris

from fuzz.findings import PROJECT_PACKAGES, signature
from fuzz.targets import TARGETS

FINDING_PREFIX = "FINDING"


def _file_name(sig: str, data: bytes) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", sig)[:80]
    return f"finding-{safe}-{hashlib.sha1(data).hexdigest()[:12]}"


def keep_going(target: str, one: Callable[[bytes], None], out_dir: str) -> Callable[[bytes], None]:
    seen: set[str] = set()

    def test_one(data: bytes) -> None:
        try:
            one(data)
        except Exception as exc:  # every exception is a finding; the run goes on
            sig = signature(exc)
            if sig in seen:
                return
            seen.add(sig)
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, _file_name(sig, data))
            with open(path, "wb") as f:
                f.write(data)
            print(f"{FINDING_PREFIX} {target} {sig} {path}", file=sys.stderr, flush=True)
            traceback.print_exception(exc, file=sys.stderr)
            sys.stderr.flush()

    return test_one


def announce(target: str, one: Callable[[bytes], None]) -> Callable[[bytes], None]:
    """Name the finding, then let libFuzzer stop and save the input (crash-<sha1>)."""

    def test_one(data: bytes) -> None:
        try:
            one(data)
        except Exception as exc:
            sig = signature(exc)
            print(f"{FINDING_PREFIX} {target} {sig} crash-file", file=sys.stderr, flush=True)
            raise

    return test_one


def instrumented(module_name: str) -> tuple[str, ...]:
    """The target's INSTRUMENT packages, read from its source (importing it would load the
    project before the hook is in place)."""
    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "INSTRUMENT" for t in node.targets
        ):
            packages = ast.literal_eval(node.value)
            assert set(packages) <= set(PROJECT_PACKAGES), packages
            return tuple(packages)
    return PROJECT_PACKAGES


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fuzz.engine")
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--keep-going", action="store_true")
    parser.add_argument("--findings", default="build/fuzz/findings")
    args, libfuzzer_args = parser.parse_known_args(argv)
    # Only what the target exercises: the followers of an API target would otherwise run
    # instrumented too (every fuzzed append is dispatched to them), at a tenth of the speed.
    module_name = TARGETS[args.target]
    with atheris.instrument_imports(include=list(instrumented(module_name))):
        module = importlib.import_module(module_name)
    one: Callable[[bytes], None] = module.setup()
    if args.keep_going:
        one = keep_going(args.target, one, os.path.join(args.findings, args.target))
    else:
        one = announce(args.target, one)
    atheris.Setup([sys.argv[0], *libfuzzer_args], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
