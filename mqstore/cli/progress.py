"""Progress of a long command, on stderr, out of the way of what it prints on stdout.

    on a terminal     a rich bar: done/total, percent, rate, elapsed and time left
    otherwise         one plain line every PROGRESS_LINE_EVERY_S seconds (a log, a CI job),
                      and none at all for a command that ends sooner

    with Reporter("consumed", total=1000, unit="messages") as progress:
        for ...:
            progress.advance(1)

`total` may be None (unknown: a count without a percent). Updates are cheap: the bar is
redrawn by rich's own refresh thread, and the plain line looks at the clock at most once every
PROGRESS_CHECK_EVERY updates.
"""

from __future__ import annotations

import sys
import time
from typing import Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

PROGRESS_LINE_EVERY_S: Final = 5.0
# The plain line checks the clock once every this many advances.
PROGRESS_CHECK_EVERY: Final = 64


class Reporter:
    def __init__(
        self,
        label: str,
        *,
        total: int | None,
        unit: str,
        console: Console | None = None,
        line_every_s: float = PROGRESS_LINE_EVERY_S,
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.done = 0
        self._console = console or Console(stderr=True, highlight=False)
        self._line_every_s = line_every_s
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._started = 0.0
        self._next_line = 0.0
        self._unchecked = 0

    @property
    def is_bar(self) -> bool:
        return self._console.is_terminal

    def __enter__(self) -> Reporter:
        self._started = time.monotonic()
        self._next_line = self._started + self._line_every_s
        if self.is_bar:
            self._bar = Progress(
                TextColumn(f"[bold]{self.label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self._console,
                transient=False,
                # Lines a command prints to a terminal go above the bar; into a pipe or a file
                # they go where they were going (never onto stderr).
                redirect_stdout=sys.stdout.isatty(),
                redirect_stderr=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, rate="")
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._unchecked += 1
        if self._unchecked < PROGRESS_CHECK_EVERY:
            return
        self._unchecked = 0
        self._update()

    def _update(self) -> None:
        now = time.monotonic()
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, rate=self._rate(now))
        elif now >= self._next_line:
            self._next_line = now + self._line_every_s
            self._console.print(self.line(now), markup=False, highlight=False, soft_wrap=True)

    def _rate(self, now: float) -> str:
        seconds = now - self._started
        return f"{self.done / seconds:,.0f} {self.unit}/s" if seconds > 0 else ""

    def line(self, now: float | None = None) -> str:
        """The plain progress line: what is done (of the total), rate, elapsed."""
        now = time.monotonic() if now is None else now
        of = f" of {self.total:,}" if self.total is not None else ""
        percent = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        elapsed = now - self._started
        return (
            f"{self.label}: {self.done:,}{of} {self.unit}{percent}, {self._rate(now)}, "
            f"{elapsed:.0f} s"
        )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, rate=self._rate(time.monotonic()))
            self._bar.__exit__(None, None, None)
