"""`python -m fuzz`: run one fuzz target, or every one for a while, and report what was found.

    python -m fuzz list
    python -m fuzz TARGET [--stop] [libFuzzer flags: -runs=N -max_total_time=S ...] [FILES]
    python -m fuzz all --seconds S [--only a,b]

Each target runs in a child process (fuzz/engine.py) with its corpus in build/fuzz/corpus/TARGET
(seeded from the target's seeds() the first time) and its findings in build/fuzz/findings/
TARGET; files named on the command line are replayed instead of fuzzing. libFuzzer's single-
dash flags may also be given with two dashes (-runs N, --runs=N). A finding whose signature
fuzz/known.py lists is a known bug with a strict xfail test; `all` exits 1 only for new ones
(or a target that died).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from fuzz.engine import FINDING_PREFIX
from fuzz.known import KNOWN
from fuzz.targets import TARGETS

BUILD_DIR = os.path.join("build", "fuzz")
# One input taking longer than this is a hang: libFuzzer stops with a timeout finding.
INPUT_TIMEOUT_S = 60
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")
_REPLAYED = re.compile(r"^Executed \S+ in", re.MULTILINE)


@dataclass
class Outcome:
    target: str
    runs: int = -1
    seconds: float = 0.0
    returncode: int = 0
    findings: dict[str, str] = field(default_factory=dict)  # signature -> saved input
    log_path: str = ""

    @property
    def new_findings(self) -> list[str]:
        return [sig for sig in self.findings if sig not in KNOWN]

    @property
    def died(self) -> bool:
        """Ended without a finding to show for it (a crash of the engine, an import error)."""
        return (self.returncode != 0 or self.runs < 0) and not self.findings


def corpus_dir(target: str) -> str:
    """The target's corpus, seeded the first time."""
    path = os.path.join(BUILD_DIR, "corpus", target)
    if not os.path.isdir(path) or not os.listdir(path):
        os.makedirs(path, exist_ok=True)
        module = importlib.import_module(TARGETS[target])
        for i, seed in enumerate(module.seeds()):
            with open(os.path.join(path, f"seed-{i}"), "wb") as f:
                f.write(seed)
    return path


def libfuzzer_flags(args: list[str]) -> list[str]:
    """libFuzzer wants -name=value; accept -name value and --name=value too."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            arg = arg[1:]
        if arg.startswith("-") and "=" not in arg and i + 1 < len(args):
            out.append(f"{arg}={args[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def run_target(target: str, extra: list[str], *, keep_going: bool, log_path: str | None) -> Outcome:
    flags = libfuzzer_flags(extra)
    findings = os.path.join(BUILD_DIR, "findings")
    os.makedirs(os.path.join(findings, target), exist_ok=True)
    files = [a for a in flags if not a.startswith("-")]
    command = [
        sys.executable,
        "-m",
        "fuzz.engine",
        target,
        "--findings",
        findings,
        *(["--keep-going"] if keep_going else []),
        f"-timeout={INPUT_TIMEOUT_S}",
        f"-artifact_prefix={os.path.join(findings, target)}{os.sep}",
        *flags,
        *([] if files else [corpus_dir(target)]),
    ]
    outcome = Outcome(target, log_path=log_path or "")
    scratch = tempfile.mkdtemp(prefix=f"mqstore-fuzz-{target}-")
    env = {**os.environ, "TMPDIR": scratch}
    began = time.monotonic()
    try:
        if log_path is None:
            lines = []
            with subprocess.Popen(
                command, env=env, stderr=subprocess.PIPE, text=True, errors="replace"
            ) as proc:
                assert proc.stderr is not None
                for line in proc.stderr:  # shown as it comes: a long run is not silent
                    sys.stderr.write(line)
                    lines.append(line)
            returncode = proc.returncode
            output = "".join(lines)
        else:
            with open(log_path, "w") as log:
                returncode = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            with open(log_path, errors="replace") as log:
                output = log.read()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outcome.seconds = time.monotonic() - began
    outcome.returncode = returncode
    done = _DONE.findall(output)
    if done:
        outcome.runs = sum(int(runs) for runs, _ in done)
    elif files:
        outcome.runs = len(_REPLAYED.findall(output))
    artifacts = os.path.join(findings, target)
    for line in output.splitlines():
        if line.startswith(FINDING_PREFIX + " "):
            _, _, sig, path = line.split(" ", 3)
            outcome.findings[sig] = path if path != "crash-file" else artifacts
    return outcome


def print_table(outcomes: list[Outcome]) -> None:
    print(f"{'target':<15} {'executions':>11} {'seconds':>8}  findings")
    for o in outcomes:
        runs = str(o.runs) if o.runs >= 0 else "stopped" if o.findings else "died"
        sigs = ", ".join(f"{s} ({'known' if s in KNOWN else 'NEW'})" for s in o.findings)
        if o.died:
            sigs = (sigs + "; " if sigs else "") + f"exit {o.returncode}, see {o.log_path}"
        print(f"{o.target:<15} {runs:>11} {o.seconds:>8.1f}  {sigs or '-'}")
    for o in outcomes:
        for sig, path in o.findings.items():
            print(f"  {o.target}: {sig}\n      input: {path}\n      {KNOWN.get(sig, 'NEW')}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if importlib.util.find_spec("atheris") is None and argv[0] != "list":
        print(
            "atheris is not installed: pip install -e '.[fuzz]' (make fuzz does)", file=sys.stderr
        )
        return 2
    if argv[0] == "list":
        for name, module_name in TARGETS.items():
            print(f"{name:<15} {importlib.import_module(module_name).DESCRIPTION}")
        return 0
    if argv[0] == "all":
        parser = argparse.ArgumentParser(prog="python -m fuzz all")
        parser.add_argument("--seconds", type=int, default=60, help="per target")
        parser.add_argument("--only", default="", help="comma-separated target names")
        args = parser.parse_args(argv[1:])
        names = [n for n in args.only.split(",") if n] or list(TARGETS)
        unknown = sorted(set(names) - set(TARGETS))
        if unknown:
            parser.error(f"unknown targets {unknown}; see python -m fuzz list")
        logs = os.path.join(BUILD_DIR, "logs")
        os.makedirs(logs, exist_ok=True)
        outcomes = []
        for name in names:
            print(f"fuzzing {name} for {args.seconds} s ...", flush=True)
            outcomes.append(
                run_target(
                    name,
                    [f"-max_total_time={args.seconds}"],
                    keep_going=True,
                    log_path=os.path.join(logs, f"{name}.log"),
                )
            )
        print_table(outcomes)
        bad = any(o.new_findings or o.died for o in outcomes)
        return 1 if bad else 0
    target, extra = argv[0], argv[1:]
    if target not in TARGETS:
        print(f"unknown target {target!r}; one of: {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    stop = "--stop" in extra
    extra = [a for a in extra if a != "--stop"]
    outcome = run_target(target, extra, keep_going=not stop, log_path=None)
    print_table([outcome])
    return 1 if outcome.new_findings or outcome.died else 0


if __name__ == "__main__":
    sys.exit(main())
