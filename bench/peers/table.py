"""The one table: for each workload and message size, each system's figure (median of the runs,
with min-max), mqstore's ratio to each peer and to the gRPC ceiling, and the most foreign CPU
load seen in the row's runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.peers.common import (
    FOREIGN_NOISY_CORES,
    SYSTEM_NAMES,
    WORKLOADS,
    Cell,
    Results,
    Workload,
    sizes_of,
)
from bench.report import markdown_table, median_range, size_name, text_table

PEERS = ("nats", "redis", "ceiling")
COLUMNS = ("mqstore", *PEERS)
# The ceiling stores and delivers nothing: no append-to-visible to measure. The plain user's
# rows set the SDK's defaults beside redis-py's: NATS's client is measured tuned only.
NOT_APPLICABLE = {
    ("visible_p50", "ceiling"),
    ("visible_p99", "ceiling"),
    *(
        (plain, system)
        for plain in ("plain_produce", "plain_consume")
        for system in ("nats", "ceiling")
    ),
}
# The peers have no "flush sync" mode in this run: their produce figures are repeated.
SAME_AS = {"produce_sync": "produce"}
REPEATED_MARK = " †"
SHORT_NAMES = {"nats": "NATS", "redis": "Redis", "ceiling": "ceiling"}
HEADERS = (
    "workload",
    "size",
    "unit",
    *(SYSTEM_NAMES[s] for s in COLUMNS),
    *(f"mqstore ÷ {SHORT_NAMES[s]}" for s in PEERS),
    "quiet runs (max foreign cores)",
)


@dataclass
class Row:
    workload: Workload
    size: int
    cells: dict[str, str]
    ratios: dict[str, str]
    foreign: list[float]  # of every run behind the row's own figures

    def quiet_text(self) -> str:
        if not self.foreign:
            return ""
        quiet = sum(1 for f in self.foreign if f <= FOREIGN_NOISY_CORES)
        return f"{quiet}/{len(self.foreign)} (max {max(self.foreign):.2f})"

    def texts(self) -> list[str]:
        arrow = "↑" if self.workload.higher_better else "↓"
        return [
            self.workload.label,
            size_name(self.size),
            f"{self.workload.unit} {arrow}",
            *(self.cells[s] for s in COLUMNS),
            *(self.ratios[s] for s in PEERS),
            self.quiet_text(),
        ]


def _number(value: float, unit: str) -> str:
    if unit == "msg/s" or value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def used(cell: Cell) -> list[float]:
    """The runs a figure is made of: the quiet ones (foreign load at most the noisy limit)
    when at least half the runs were quiet, else all of them (the reference's rule)."""
    quiet = [v for v, f in zip(cell.values, cell.foreign, strict=True) if f <= FOREIGN_NOISY_CORES]
    return quiet if quiet and 2 * len(quiet) >= len(cell.values) else list(cell.values)


def median(cell: Cell) -> float:
    return statistics.median(used(cell))


def cell_text(cell: Cell, unit: str) -> str:
    return median_range(used(cell), lambda value: _number(value, unit))


def _cell_for(results: Results, workload: str, size: int, system: str) -> tuple[Cell | None, bool]:
    """The cell shown for a system, and whether it is borrowed from another row."""
    cell = results.get(workload, size, system)
    if cell is None and system != "mqstore" and workload in SAME_AS:
        return results.get(SAME_AS[workload], size, system), True
    return cell, False


def rows(results: Results, ran: tuple[str, ...]) -> list[Row]:
    out = []
    for workload in WORKLOADS:
        for size in sizes_of(workload):
            cells: dict[str, str] = {}
            found: dict[str, Cell] = {}
            foreign: list[float] = []
            for system in COLUMNS:
                cell, borrowed = _cell_for(results, workload.key, size, system)
                if (workload.key, system) in NOT_APPLICABLE:
                    cells[system] = "-"
                elif cell is None or not cell.values:
                    cells[system] = "not run" if system not in ran else "missing"
                else:
                    found[system] = cell
                    cells[system] = cell_text(cell, workload.unit) + (
                        REPEATED_MARK if borrowed else ""
                    )
                    if not borrowed and workload.per_size:  # memory: read after the runs
                        foreign.extend(cell.foreign)
            ratios = {}
            for peer in PEERS:
                ours, theirs = found.get("mqstore"), found.get(peer)
                if (
                    ours is None
                    or theirs is None
                    or (workload.key == "memory" and peer == "ceiling")
                ):
                    ratios[peer] = "-"
                    continue
                denominator = median(theirs)
                ratio = median(ours) / denominator if denominator else 0.0
                ratios[peer] = f"{_number(ratio, 'x')}x"
            out.append(Row(workload, size, cells, ratios, foreign))
    return out


def render_text(table: list[Row]) -> str:
    return text_table(HEADERS, [r.texts() for r in table])


def render_markdown(table: list[Row]) -> str:
    return markdown_table(HEADERS, [r.texts() for r in table])


READING = (
    "Each figure is the median (min-max) of its quiet runs, those during which processes not "
    f"ours used at most {FOREIGN_NOISY_CORES} cores of the 2, when at least half the runs were "
    "quiet, else of all its runs; the last column counts the row's quiet runs and gives the "
    "most foreign load seen in one. A ratio is mqstore's figure ÷ the other's: for msg/s (↑) "
    "above 1 means mqstore is faster; for ms and MiB (↓) below 1 means mqstore is better. "
    "† the peers have no per-message fsync mode in this run: their produce figures are "
    "repeated next to mqstore's flush sync one."
)


def notes(results: Results) -> list[str]:
    """The lines under the table: how each system was run, the append-to-visible loads, and
    what mqstore's memory is made of."""
    out = []
    for system in COLUMNS:
        lines = results.details.get(system)
        if lines:
            out.append(f"**{SYSTEM_NAMES[system]}**: " + "; ".join(lines) + ".")
    for system in COLUMNS:
        variants = []
        for workload in WORKLOADS:
            cell = results.get(workload.key, sizes_of(workload)[0], system)
            if (
                cell is not None
                and cell.detail
                and workload.key not in ("lookup_p99", "visible_p99")
            ):
                variants.append(f"{workload.label.split(' (')[0]}: {cell.detail}")
        if variants:
            out.append(f"{SYSTEM_NAMES[system]} workloads: " + "; ".join(variants) + ".")
    out.extend(_visible_notes(results))
    memory = results.get("memory", 0, "mqstore")
    if memory is not None and memory.runs:
        parts = []
        for name, m in memory.runs[-1].items():
            if isinstance(m, dict) and "rss" in m:
                parts.append(
                    f"{name} {m['rss']:,.0f} MiB (anon {m.get('anon', 0):,.0f}, mapped files "
                    f"{m.get('file', 0):,.0f}, peak {m.get('hwm', 0):,.0f})"
                )
        out.append(
            "mqstore memory after the run: " + "; ".join(parts) + ". Mapped files are "
            "commit-log, consume-queue and index pages in the page cache, counted in RSS."
        )
    out.extend(results.notes)
    return out


def _visible_notes(results: Results) -> list[str]:
    out = []
    for size in sizes_of(WORKLOADS[0]):
        parts, offered = [], 0.0
        for system in COLUMNS:
            cell = results.get("visible_p50", size, system)
            if cell is None:
                continue
            offered = statistics.median(r["offered"] for r in cell.runs)
            achieved = statistics.median(r["achieved"] for r in cell.runs)
            part = f"{SYSTEM_NAMES[system]} achieved {achieved:,.0f}"
            saturated = sum(1 for r in cell.runs if r.get("saturated"))
            if saturated:
                part += f" (latency grew through {saturated} of {len(cell.runs)} runs: SATURATED)"
            parts.append(part)
        if parts:
            out.append(
                f"Append-to-visible, {size_name(size)}: offered {offered:,.0f} msg/s; "
                + ", ".join(parts)
                + "."
            )
    return out
