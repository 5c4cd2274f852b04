"""StopRequest: a stop asked by signals arriving while the main thread waits on it, or sets it
itself, ends the wait; it never hangs (a threading.Event set from the handler did, in 20 of 20
runs of the script below: the handler waited for the Event's lock its own thread held)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mqstore.stop_request import SIGNAL_POLL_S, StopRequest

PROCESSES = 6
SIGNALS_PER_PROCESS = 30
EXIT_BOUND_S = 10.0
ROOT = Path(__file__).resolve().parents[1]

# A service's main loop: wait for the request, then set it again as shutdown does, over and
# over, so that signals keep landing while this thread holds the request's lock.
SERVICE = """
from mqstore.stop_request import StopRequest
stop = StopRequest()
stop.install()
print("ready", flush=True)
while not stop.wait(0.5):
    pass
for _ in range(200_000):
    stop.set()
print("stopped by", stop.signal, flush=True)
"""


def test_signals_landing_while_the_main_thread_holds_the_lock_never_hang() -> None:
    rng = random.Random(7)
    for _ in range(PROCESSES):
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVICE],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        for _ in range(SIGNALS_PER_PROCESS):  # as a launcher's threads die, ms apart
            if proc.poll() is not None:
                break
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(rng.random() * 0.002)
        try:
            out, _ = proc.communicate(timeout=EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"hung {EXIT_BOUND_S} s after SIGTERM") from None
        assert proc.returncode == 0
        assert out == f"stopped by {int(signal.SIGTERM)}\n"


def test_wait_times_out_unasked_and_returns_at_once_when_set_by_another_thread() -> None:
    stop = StopRequest()
    started = time.monotonic()
    assert stop.wait(0.2) is False
    assert time.monotonic() - started >= 0.2
    assert not stop.is_set() and stop.signal is None
    threading.Timer(0.05, stop.set).start()
    started = time.monotonic()
    assert stop.wait(30) is True
    assert time.monotonic() - started < SIGNAL_POLL_S  # set() wakes it, no poll
    assert stop.is_set() and stop.signal is None
