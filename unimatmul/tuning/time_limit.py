"""The time limit of a candidate: its work runs on a worker thread the tuning thread can stop waiting for.

A kernel that hangs (or sleeps 30 s a call) would otherwise hold tuning as long as it
likes: Python cannot interrupt a call in progress. So on the CPU the harness hands each
step of a candidate's work (its checks, its timed block) to a worker thread of its own
and waits at most the candidate's limit; past it, the candidate is abandoned
(:class:`OverLimit`), the worker is left to finish the call alone (its buffers are the
harness's to replace, see ``Harness``) and a new worker serves the next call. One worker
per tuning thread, kept between steps: a kernel's thread pools (OpenMP) see one caller.

Per-thread state of the tuning thread that kernels depend on travels with each step: the
context variables (``unimatmul.mode()``, NumPy's error state) and what
:func:`carry_thread_state` registers (PyTorch routing's "busy" flag, without which a
candidate's own torch calls would be routed back into unimatmul).
"""

from __future__ import annotations

import contextvars
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TypeVar

T = TypeVar("T")

#: Functions called on the tuning thread before a step; each returns a context manager
#: that the worker enters around the step to re-create that thread's state.
_carriers: list[Callable[[], AbstractContextManager[Any]]] = []


class OverLimit(Exception):
    """A candidate's step did not end within its time limit; the candidate is abandoned."""

    def __init__(self, msg: str, *, limit_s: float) -> None:
        super().__init__(msg)
        self.limit_s = limit_s


def carry_thread_state(capture: Callable[[], AbstractContextManager[Any]]) -> None:
    """Register a per-thread state to carry onto the worker (see the module docstring)."""
    if capture not in _carriers:
        _carriers.append(capture)


class _Task:
    __slots__ = ("context", "done", "error", "fn", "states", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.context = contextvars.copy_context()
        self.states = [capture() for capture in _carriers]
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with ExitStack() as stack:
                for state in self.states:
                    stack.enter_context(state)
                self.value = self.context.run(self.fn)
        except BaseException as exc:  # the tuning thread re-raises it (KeyboardInterrupt included)
            self.error = exc
        finally:
            self.done.set()


def _serve(tasks: queue.SimpleQueue[_Task | None]) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        task.run()
        del task


class _Worker:
    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        thread = threading.Thread(
            target=_serve, args=(self.tasks,), name="unimatmul-tuning-worker", daemon=True
        )
        thread.start()

    def __del__(self) -> None:
        # The tuning thread that owned it is gone (or it was abandoned): the worker ends
        # once the call it may still be in returns.
        self.tasks.put(None)


class _PerThread(threading.local):
    worker: _Worker | None = None


_local = _PerThread()


def _forget_worker() -> None:
    # A forked child has no worker thread, only the parent's record of one.
    _local.worker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker)


def run_within(fn: Callable[[], T], limit_s: float) -> T:
    """``fn()`` on this thread's worker: its result or its exception if it ends within
    ``limit_s`` seconds, else :class:`OverLimit` (the worker is given up)."""
    worker = _local.worker
    if worker is None:
        worker = _local.worker = _Worker()
    task = _Task(fn)
    worker.tasks.put(task)
    try:
        finished = task.done.wait(None if math.isinf(limit_s) else max(limit_s, 0.0))
    except BaseException:  # Ctrl-C while waiting: the worker may still be in the call
        _local.worker = None
        raise
    if not finished:
        _local.worker = None
        msg = f"still running after {limit_s:.3g} s"
        raise OverLimit(msg, limit_s=limit_s)
    if task.error is not None:
        raise task.error
    return task.value


def run_inline(fn: Callable[[], T], limit_s: float) -> T:
    """``fn()`` on this thread; :class:`OverLimit` once it returns if it took over ``limit_s``
    (where the calls cannot be left to a worker: a GPU's, bound to this thread's stream)."""
    started = time.perf_counter()
    value = fn()
    spent = time.perf_counter() - started
    if spent > limit_s:
        msg = f"took {spent:.3g} s, over its {limit_s:.3g} s"
        raise OverLimit(msg, limit_s=limit_s)
    return value
