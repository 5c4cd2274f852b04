"""The benchmarks' meters: CPU and memory read from /proc, and a client's own clock.

Owns every reading of /proc/PID/stat, /proc/stat and /proc/PID/status in bench/ (Linux only):

- `CpuMeter`: over one window (a `with` block), the CPU seconds of each named process (a
  service, a server, a client worker), of this process, optionally of this process and all its
  descendants ("ours"), and of the whole machine (busy: not idle, iowait or stolen). From
  those: cores each named process used, and cores used by nobody we know of ("other", or
  "foreign" with `tree=True`): a noisy neighbour on a shared machine shows there.
- `Stopwatch`: a client's wall time and its own process's CPU time over what it measures (a
  client in a worker process reports its CPU itself; the orchestrator adds it to the window).
- `wait_for_quiet`: sample foreign load until it drops under a limit.
- `status_kib` / `rss_mib`: resident memory of a process (/proc/PID/status).

The machine is a shared 2-core VM: a saturated process shows at ~1.0 core.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
QUIET_SAMPLE_S = 0.5


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (field 3 on), None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_s(pid: int | str) -> float:
    """utime + stime of a process (all its threads, not its children), in seconds; 0 once it
    is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy since boot (not idle, iowait or
    stolen: /proc/stat's cpu line)."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = values[:7]
    return (user + nice + system + irq + softirq) * TICK_S


def descendants(root: int) -> set[int]:
    """Every living process below `root` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def tree_cpu_s() -> dict[int, float]:
    """CPU seconds of this process (with its reaped children) and of each living descendant."""
    me = os.getpid()
    fields = _stat_fields(me)
    reaped = (int(fields[13]) + int(fields[14])) * TICK_S if fields else 0.0
    out = {pid: proc_cpu_s(pid) for pid in descendants(me)}
    out[me] = proc_cpu_s(me) + reaped
    return out


class CpuMeter:
    """CPU used over one window: `with CpuMeter({"cq_svc": pid, ...}) as meter: ...`.

    After the block: `wall_s`, `busy_s` (the machine), `self_s` (this process), `process_s`
    (each named process), and with `tree=True` `ours_s` (this process and every descendant:
    client workers and servers we started; one born during the window counts in full, one that
    died is lost unless reaped)."""

    def __init__(self, processes: Mapping[str, int] | None = None, *, tree: bool = False) -> None:
        self.pids = dict(processes or {})
        self.tree = tree
        self.wall_s = 0.0
        self.busy_s = 0.0
        self.self_s = 0.0
        self.ours_s = 0.0
        self.process_s: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self._tree0 = tree_cpu_s() if self.tree else {}
        self._began = time.perf_counter()
        self._busy0 = machine_busy_s()
        self._self0 = time.process_time()
        self._process0 = {name: proc_cpu_s(pid) for name, pid in self.pids.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        self.process_s = {
            name: proc_cpu_s(pid) - self._process0[name] for name, pid in self.pids.items()
        }
        self.self_s = time.process_time() - self._self0
        self.busy_s = machine_busy_s() - self._busy0
        self.wall_s = max(time.perf_counter() - self._began, 1e-9)
        if self.tree:
            tree1 = tree_cpu_s()
            self.ours_s = sum(cpu - self._tree0.get(pid, 0.0) for pid, cpu in tree1.items())

    @property
    def process_cores(self) -> dict[str, float]:
        """Cores each named process used over the window."""
        return {name: s / self.wall_s for name, s in self.process_s.items()}

    def other_cores(self, clients_cpu_s: float = 0.0) -> float:
        """Cores the machine was busy with neither the named processes, this one, nor the
        clients (`clients_cpu_s`: CPU seconds they reported themselves, see Stopwatch)."""
        ours = clients_cpu_s + self.self_s + sum(self.process_s.values())
        return max(0.0, self.busy_s - ours) / self.wall_s

    def cores(self, clients_cpu_s: float) -> dict[str, float]:
        """ "client", each named process, "other": the whole machine over the window."""
        return {
            "client": clients_cpu_s / self.wall_s,
            **self.process_cores,
            "other": self.other_cores(clients_cpu_s),
        }

    @property
    def foreign_cores(self) -> float:
        """With tree=True: cores the machine was busy beyond this process and its descendants."""
        return max(0.0, self.busy_s - self.ours_s) / self.wall_s

    @property
    def ours_cores(self) -> float:
        return self.ours_s / self.wall_s


class Stopwatch:
    """Wall time and this process's CPU time (every thread) from `start()` or `with` entry to
    `stop()` or exit: what a client reports of its measured window."""

    def __init__(self) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self._began = self._cpu0 = 0.0

    def start(self) -> Stopwatch:
        self._began, self._cpu0 = time.perf_counter(), time.process_time()
        return self

    def stop(self) -> Stopwatch:
        self.wall_s = time.perf_counter() - self._began
        self.cpu_s = time.process_time() - self._cpu0
        return self

    def __enter__(self) -> Stopwatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for_quiet(limit_s: float, max_cores: float, sample_s: float = QUIET_SAMPLE_S) -> float:
    """Sample foreign load until a sample is at most `max_cores` or `limit_s` has passed;
    returns the seconds waited."""
    began = time.perf_counter()
    while time.perf_counter() - began < limit_s:
        with CpuMeter(tree=True) as meter:
            time.sleep(sample_s)
        if meter.foreign_cores <= max_cores:
            break
    return time.perf_counter() - began


def status_kib(pid: int | str) -> dict[str, int]:
    """The kB fields of /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile, RssShmem, ...) in
    KiB; {} once the process is gone. `pid` may be "self"."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                value = rest.split()
                if len(value) == 2 and value[1] == "kB":
                    out[key] = int(value[0])
    except OSError:
        pass
    return out


def rss_mib(pid: int | str) -> dict[str, float]:
    """Resident memory of a process, MiB: rss (anon + file + shmem), anon, file (mapped file
    pages, e.g. an mmap'd log) and hwm (peak rss); {} once it is gone."""
    wanted = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "hwm"}
    status = status_kib(pid)
    return {name: status[key] / 1024 for key, name in wanted.items() if key in status}


def proc_split_s(pid: int | str) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all its threads; (0, 0) once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0, 0.0
    return int(fields[11]) * TICK_S, int(fields[12]) * TICK_S


def context_switches(pid: int | str) -> int:
    """Voluntary and involuntary context switches of every living thread of a process."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii") as f:
                for line in f:
                    if line.endswith("ctxt_switches:", 0, line.find(":") + 1):
                        total += int(line.split()[1])
        except OSError:
            continue  # the thread ended
    return total
