"""How the benchmarks put figures on paper: percentiles, "median (min-max)" cells, size names,
text and Markdown tables, what a run's figures depend on (versions), the generated block of a
doc, and the stamped JSON file of a run's raw figures.

What a benchmark measures and which rows it prints stay in the benchmark; this module owns the
forms they share, so that two tables of the same kind read the same.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import __version__ as protobuf_version
from google.protobuf.internal import api_implementation

GIT_TIMEOUT_S = 10.0


def percentile(values: Sequence[float], q: float) -> float:
    """The value at rank q (0..1) of the sorted values, nearest rank; NaN when there is none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def whole(value: float) -> str:
    return f"{value:,.0f}"


def median_range(values: Sequence[float], number: Callable[[float], str] = whole) -> str:
    """ "median (min-max)" of runs, or the one value."""
    middle = number(statistics.median(values))
    if len(values) == 1:
        return middle
    return f"{middle} ({number(min(values))}-{number(max(values))})"


def size_name(size: int) -> str:
    """A message size as the tables name it: "100 B", "1 KiB"; 0 is "all" (a whole-run row)."""
    if size == 0:
        return "all"
    return "1 KiB" if size == 1024 else f"{size} B"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a dashed line under the headers."""
    cells = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(headers))).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines)


def _git_commit() -> str:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip() or "?"


def versions() -> list[tuple[str, str]]:
    """What a benchmark's figures depend on: the machine, Python, gRPC, protobuf, the commit."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [
        (
            "machine",
            f"{os.cpu_count()} cores shared with other work ({cpu}), "
            f"{platform.system()} {platform.release()}",
        ),
        ("Python", platform.python_version()),
        ("grpcio", grpc.__version__),
        ("protobuf", f"{protobuf_version} ({api_implementation.Type()})"),
        ("mqstore commit", _git_commit()),
    ]


def versions_markdown(pairs: Sequence[tuple[str, str]]) -> str:
    """The versions as a two-column Markdown table with empty headers."""
    return "\n".join(["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in pairs)])


def write_doc_block(path: Path, begin: str, end: str, body: str, heading: str = "") -> None:
    """Put `body` between the `begin` and `end` marker lines of a Markdown file, keeping the
    prose around them; without the markers the block is appended (a new file starts with
    `heading`)."""
    block = f"{begin}\n{body}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if begin in text and end in text:
        text = text.split(begin, 1)[0] + block + text.split(end, 1)[1]
    else:
        text = (text.rstrip() + "\n\n" if text else heading) + block + "\n"
    path.write_text(text, encoding="utf-8")


def write_stamped_json(directory: Path, prefix: str, payload: dict[str, Any]) -> Path:
    """A run's raw figures as DIRECTORY/PREFIX-<UTC date>-<HHMM>.json; returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d-%H%M")
    path = directory / f"{prefix}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path
