"""Compile processes: Triton compiles a plan's kernel in a process of its own, into
Triton's on-disk cache, so that the compiling process's load of it is a cache read.

Threads overlap most of a compile (Triton releases the GIL in its MLIR and LLVM passes),
but its Python front end, the launcher bookkeeping and the harness measuring beside
them share one interpreter: with many compiles at once (a model's configs, compiled
ahead), that lock is the limit. A :class:`Workers` pool of plain child processes
(``python -m unimatmul_triton.compile_worker``, not ``multiprocessing``, so that no
user's ``__main__`` is imported again) takes one plan at a time each; a worker shares the
caller's Triton cache directory and environment and touches no GPU. What comes back is
only whether the compile succeeded (and Triton's error, in one line); the caller then
compiles the plan itself, which finds the binary in the cache. A worker that dies, or
a cache the caller cannot read, costs time, never a result: the caller's own compile is
the one that counts.

The protocol on the worker's stdin and stdout: length-prefixed pickles, (plan, target)
in, (ok, error text) out; end of input ends the worker.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from typing import IO, Any

_LENGTH = struct.Struct("<Q")


def _send(stream: IO[bytes], item: Any) -> None:
    data = pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the compile worker closed its pipe")
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the compile worker closed its pipe mid-message")
    return pickle.loads(data)


class WorkerLost(RuntimeError):
    """A worker died or broke the protocol (the caller compiles the plan itself)."""


class _Worker:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "unimatmul_triton.compile_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )

    def compile(self, plan: Any, target: Any) -> tuple[bool, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            _send(self.proc.stdin, (plan, target))
            ok, error = _receive(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
            raise WorkerLost(f"{type(exc).__name__}: {exc}") from exc
        return bool(ok), str(error)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Workers:
    """Up to ``count`` compile processes, started as they are first needed; ``compile``
    blocks the calling thread until a worker is free and its compile ends."""

    def __init__(self, count: int, cache_dir: str | None = None) -> None:
        self.count = max(1, count)
        self.env = dict(os.environ)
        self.env.pop("TRITON_INTERPRET", None)
        if cache_dir:
            self.env["TRITON_CACHE_DIR"] = cache_dir
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(self.count):
            self._idle.put(None)  # a place for a worker not started yet
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0

    def compile(self, plan: Any, target: Any) -> tuple[bool, str]:
        """(True, "") once ``plan``'s kernel is in the cache; (False, Triton's error in one
        line) when it does not compile; WorkerLost when the worker could not say."""
        worker = self._idle.get()
        try:
            if worker is None or not worker.alive():
                worker = self._start()
            result = worker.compile(plan, target)
        except WorkerLost:
            if worker is not None:
                worker.stop()
            worker = None
            raise
        finally:
            self._idle.put(worker)
        return result

    def _start(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise WorkerLost("the compile workers are shut down")
            worker = _Worker(self.env)
            self._all.append(worker)
            self.started += 1
        return worker

    def shutdown(self) -> None:
        """Stop every worker now (a compile in flight is abandoned: its caller compiles)."""
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        for worker in workers:
            worker.stop()


def cache_dir() -> str | None:
    """Triton's cache directory in this process (where its knobs put it), for the workers."""
    try:
        from triton import knobs

        found = knobs.cache.dir
    except Exception:
        return os.environ.get("TRITON_CACHE_DIR")
    return str(found) if found else None


def main() -> None:
    from unimatmul_triton.compiler import compile_plan, reason
    from unimatmul_triton.triton_key import install

    install()  # Triton's key read from the kept file, not hashed again in every worker

    # The protocol keeps the real stdout to itself; anything printed goes to stderr.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        try:
            plan, target = _receive(stdin)
        except EOFError:
            return
        try:
            compile_plan(plan, target)
            reply: tuple[bool, str] = (True, "")
        except Exception as exc:
            reply = (False, reason(exc))
        _send(stdout, reply)


if __name__ == "__main__":
    main()
