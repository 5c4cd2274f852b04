"""What every system's benchmark shares: the scale, the workloads, the results.

CPU accounting: the machine is a shared 2-core VM. Every measured call is wrapped in a
bench.meters.CpuMeter with tree=True, which reads the machine's busy time and the CPU time of
this process and all its descendants (the client worker processes and every server we started)
at both ends; what the machine spent beyond ours is "foreign" load, in cores over the call. A
run with more of it than FOREIGN_NOISY_CORES is suspect, and the table says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SIZES = (100, 1024)  # message payload bytes
BATCH = 1000  # messages per batch / fetch / page, for every system (reference §1-3)
# A run with more foreign load than this (cores) is flagged as noisy (the reference's limit).
FOREIGN_NOISY_CORES = 0.25
CALL_TIMEOUT_S = 60.0

SYSTEMS = ("mqstore", "nats", "redis", "ceiling")
SYSTEM_NAMES = {
    "mqstore": "mqstore",
    "nats": "NATS JetStream",
    "redis": "Redis Streams",
    "ceiling": "gRPC ceiling",
}


@dataclass(frozen=True)
class Scale:
    messages: int  # per produce run (and read back by each consume run)
    runs: int  # runs per cell: the median (min-max) is reported
    lookups: int  # time lookups per run
    visible_s: float  # length of one append-to-visible run
    # Before each measured call, wait up to this long for foreign load to drop below
    # FOREIGN_NOISY_CORES (the reference waited up to 90 s; a smoke run does not wait).
    settle_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


FULL = Scale(messages=200_000, runs=3, lookups=500, visible_s=5.0, settle_s=15.0)
QUICK = Scale(messages=5_000, runs=1, lookups=50, visible_s=1.0)


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    unit: str
    higher_better: bool
    per_size: bool = True


WORKLOADS = (
    Workload("produce", "produce (mqstore: flush async)", "msg/s", True),
    Workload("produce_sync", "produce (mqstore: flush sync)", "msg/s", True),
    Workload("consume", "consume by offset: pull API", "msg/s", True),
    Workload("consume_fast", "consume by offset: fastest read path", "msg/s", True),
    Workload(
        "plain_produce", "a plain SDK user: produce, timed from the first call", "msg/s", True
    ),
    Workload(
        "plain_consume", "a plain SDK user: consume, timed from the first call", "msg/s", True
    ),
    Workload("lookup_p50", "time lookup p50", "ms", False),
    Workload("lookup_p99", "time lookup p99", "ms", False),
    Workload("visible_p50", "append-to-visible p50 (½ mqstore's peak)", "ms", False),
    Workload("visible_p99", "append-to-visible p99 (½ mqstore's peak)", "ms", False),
    Workload(
        "memory", "resident memory after the run, page cache aside", "MiB", False, per_size=False
    ),
)
WORKLOAD_KEYS = tuple(w.key for w in WORKLOADS)


def sizes_of(workload: Workload) -> tuple[int, ...]:
    """Message sizes a workload has a row for (0: one row for the whole run)."""
    return SIZES if workload.per_size else (0,)


# -- results ----------------------------------------------------------------------------------


@dataclass
class Cell:
    """One system's figure for one workload and size: a value per run."""

    values: list[float] = field(default_factory=list)
    foreign: list[float] = field(default_factory=list)  # cores, per run
    detail: str = ""  # what exactly ran (variant, durability), for the notes and JSON
    runs: list[dict[str, Any]] = field(default_factory=list)  # raw per-run data


@dataclass
class Results:
    cells: dict[tuple[str, int, str], Cell] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    details: dict[str, list[str]] = field(default_factory=dict)  # per system
    extras: dict[str, Any] = field(default_factory=dict)  # variants kept for the JSON only
    _note_at: dict[str, int] = field(default_factory=dict, repr=False)  # set_note's keys

    def add(
        self,
        workload: str,
        size: int,
        system: str,
        value: float,
        foreign: float,
        detail: str = "",
        **raw: Any,
    ) -> None:
        if workload not in WORKLOAD_KEYS or system not in SYSTEMS:
            raise ValueError(f"unknown workload {workload!r} or system {system!r}")
        cell = self.cells.setdefault((workload, size, system), Cell())
        cell.values.append(value)
        cell.foreign.append(foreign)
        if detail:
            cell.detail = detail
        cell.runs.append({"value": value, "foreign_cores": foreign, **raw})

    def set_note(self, key: str, text: str) -> None:
        """A note that a later round of the same system rewrites (from figures it keeps in
        `extras` across rounds) instead of adding another."""
        at = self._note_at.get(key)
        if at is None:
            self._note_at[key] = len(self.notes)
            self.notes.append(text)
        else:
            self.notes[at] = text

    def get(self, workload: str, size: int, system: str) -> Cell | None:
        return self.cells.get((workload, size, system))

    def describe(self, system: str, text: str) -> None:
        """A line for the notes on how `system` was run (durability, variants)."""
        lines = self.details.setdefault(system, [])
        if text not in lines:
            lines.append(text)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Results:
        out = cls(
            notes=list(data.get("notes", [])),
            details={k: list(v) for k, v in data.get("details", {}).items()},
            extras=dict(data.get("extras", {})),
        )
        for c in data["cells"]:
            out.cells[(c["workload"], int(c["size"]), c["system"])] = Cell(
                values=list(c["values"]),
                foreign=list(c["foreign"]),
                detail=c.get("detail", ""),
                runs=list(c.get("runs", [])),
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "cells": [
                {"workload": w, "size": s, "system": sy, **asdict(c)}
                for (w, s, sy), c in sorted(self.cells.items())
            ],
            "notes": self.notes,
            "details": self.details,
            "extras": self.extras,
        }


# -- memory -----------------------------------------------------------------------------------


def anon_mib(memory: dict[str, float]) -> float:
    """What the memory row compares (the issue's "resident memory, page cache aside"): RSS less
    mapped file pages, which the page cache holds for whoever maps them (mqstore maps its log)."""
    return memory.get("anon", memory.get("rss", 0.0))
