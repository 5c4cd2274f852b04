"""What a job is doing while Spark runs it: its steps, named in Spark and shown on stderr.

    with progress.step("reading the log"):        Spark's job group and description of the
        df.count()                                step's jobs ("mqstore audit: reading the log")

On a terminal, a rich progress bar per step: tasks done of those known, tasks a second, time
spent and left. Otherwise (a pipe, a log file) plain lines: one when a step starts, one every
LINE_INTERVAL_S while it runs, one when it ends:

    mqstore audit [2/3] checking consume queues: started
    mqstore audit [2/3] checking consume queues: 5/12 tasks, 10 s
    mqstore audit [2/3] checking consume queues: done, 12 tasks in 14 s

Counts come from Spark's status tracker (the jobs of the step's group, their stages' tasks): a
stage Spark skips (its shuffle output reused) counts as done when its job ends, and stages that
adaptive execution adds appear when they start, so the total may grow while a step runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any, Final

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from mqstore.cli.progress import PROGRESS_LINE_EVERY_S

# How often the status tracker is asked: often enough for a bar that moves, cheap (a py4j call
# per job and stage of the step).
POLL_INTERVAL_S: Final = 0.5
# How often a plain line is written when stderr is not a terminal: the CLI's one interval.
LINE_INTERVAL_S: Final = PROGRESS_LINE_EVERY_S
# What SparkContext.setJobGroup sets on the calling thread (restored after a step).
_JOB_PROPERTIES: Final = ("spark.jobGroup.id", "spark.job.description")


@dataclass(frozen=True, slots=True)
class TaskCounts:
    done: int = 0
    total: int = 0


def step_counts(spark: Any, group: str) -> TaskCounts:
    """Tasks done and known of the jobs Spark ran, or runs, in job group `group`."""
    tracker = spark.sparkContext.statusTracker()
    done = total = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        if job is None:
            continue
        for stage_id in job.stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is None:
                continue
            total += stage.numTasks
            done += stage.numTasks if job.status == "SUCCEEDED" else stage.numCompletedTasks
    return TaskCounts(done, total)


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.speed
        return Text(f"{speed:.1f} tasks/s" if speed else "- tasks/s")


class JobProgress:
    """The steps of one job run: Spark job groups with descriptions, shown on `stream`."""

    def __init__(
        self,
        spark: Any,
        job: str,
        steps: int,
        *,
        stream: IO[str] | None = None,
        show: bool = True,
    ) -> None:
        """`show=False`: the steps are named in Spark, nothing is printed (a job called as a
        function, from a program of its own)."""
        self.spark = spark
        self.show = show
        self.job = job
        self.steps = steps
        self.number = 0
        self.console = Console(file=stream, stderr=stream is None, highlight=False)

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        self.number += 1
        label = f"mqstore {self.job} [{self.number}/{self.steps}] {description}"
        group = f"mqstore-{self.job}-{self.number}"
        sc = self.spark.sparkContext
        before = {key: sc.getLocalProperty(key) for key in _JOB_PROPERTIES}
        sc.setJobGroup(group, f"mqstore {self.job}: {description}")
        try:
            if not self.show:
                yield
                return
            with self._shown(label, group):
                yield
        finally:
            for key, value in before.items():  # this thread's next jobs are not the step's
                sc._jsc.setLocalProperty(key, value)  # None removes it

    @contextmanager
    def _shown(self, label: str, group: str) -> Iterator[None]:
        stop = threading.Event()
        show = self._bar if self.console.is_terminal else self._lines
        shower = threading.Thread(
            target=show, args=(label, group, stop), name=f"progress {group}", daemon=True
        )
        shower.start()
        try:
            yield
        finally:
            stop.set()
            shower.join()

    def _lines(self, label: str, group: str, stop: threading.Event) -> None:
        started = time.monotonic()
        self._say(f"{label}: started")
        while not stop.wait(LINE_INTERVAL_S):
            counts = self._counts(group)
            self._say(f"{label}: {counts.done}/{counts.total} tasks, {_seconds(started)}")
        counts = self._counts(group)
        self._say(f"{label}: done, {counts.done} tasks in {_seconds(started)}")

    def _bar(self, label: str, group: str, stop: threading.Event) -> None:
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        with progress:
            task = progress.add_task(label, total=None)
            while not stop.wait(POLL_INTERVAL_S):
                counts = self._counts(group)
                progress.update(task, completed=counts.done, total=counts.total or None)
            counts = self._counts(group)
            progress.update(task, completed=counts.done, total=counts.total)

    def _counts(self, group: str) -> TaskCounts:
        try:
            return step_counts(self.spark, group)
        except Exception:  # the session stopped under us (a failed job): nothing more to show
            return TaskCounts()

    def _say(self, line: str) -> None:
        self.console.print(line, markup=False, soft_wrap=True)


def _seconds(started: float) -> str:
    return f"{time.monotonic() - started:.0f} s"
