"""Waiting until this process's other threads stop running: the CPU harness's settling pause.

A BLAS library's worker threads spin after their last call before they sleep: OpenBLAS's
for about 2^28 cycles (~0.1 s), GNU OpenMP's (oneDNN's) for 10-100 ms (measured on a
2-core virtual machine). A kernel
of another library started meanwhile shares its cores with them and runs up to twice as
slowly on a two-core machine. A fixed pause long enough for every library wastes most of
itself after the libraries that stop early, so the harness waits instead until the other
threads of this process have used almost no CPU over a short window, at most ``max_s``.

Linux reports each thread's time on a CPU in ``/proc/self/task/<tid>/schedstat``
(nanoseconds); where that cannot be read the pause is ``max_s``, as before.
"""

from __future__ import annotations

import os
import threading
import time

#: The window over which the other threads must have been (almost) idle.
WINDOW_S = 0.005
#: ... using at most this share of one CPU over it (a spinning thread uses all of one).
IDLE_SHARE = 0.1

_TASKS = "/proc/self/task"


def _cpu_ns(skip: int) -> dict[str, int] | None:
    """Nanoseconds on a CPU of each thread of this process but ``skip``; None if unreadable."""
    found: dict[str, int] = {}
    try:
        names = os.listdir(_TASKS)
    except OSError:
        return None
    for name in names:
        if name == str(skip):
            continue
        try:
            with open(f"{_TASKS}/{name}/schedstat") as f:
                found[name] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile, or a kernel without schedstat
    return found or None


def wait_quiet(max_s: float, *, window_s: float = WINDOW_S, idle_share: float = IDLE_SHARE) -> float:
    """Sleep until the process's other threads have used less than ``idle_share`` of one
    CPU over ``window_s`` (at least one window), or ``max_s`` has passed; returns the
    seconds waited. Without per-thread CPU times it sleeps ``max_s``."""
    if max_s <= 0:
        return 0.0
    start = time.perf_counter()
    me = threading.get_native_id()
    before = _cpu_ns(me)
    if before is None:
        time.sleep(max_s)
        return time.perf_counter() - start
    window = min(window_s, max_s)
    while True:
        t0 = time.perf_counter()
        time.sleep(window)
        after = _cpu_ns(me)
        elapsed = time.perf_counter() - t0
        if after is None:
            break
        # Threads present in both readings only: one that ended took its count with it.
        used = sum(max(0, ns - before[tid]) for tid, ns in after.items() if tid in before)
        before = after
        waited = time.perf_counter() - start
        if used < idle_share * elapsed * 1e9 or waited >= max_s:
            return waited
    left = max_s - (time.perf_counter() - start)
    if left > 0:
        time.sleep(left)
    return time.perf_counter() - start
