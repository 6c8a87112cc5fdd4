"""A store that writes at most once every few seconds (``MsgpackFileStore.autoflush_s``,
what ``unimatmul tune`` sets for its run): the puts in between stay pending and are used
at once, and the next write, the flush or the exit writes them; nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cache_helpers import NS, key, record

from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.settings import REGISTRY


def test_puts_between_writes_stay_pending_and_are_used(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.autoflush_s = 3600.0
    for i in range(5):
        store.put(NS, key(i), record(key(i)))
        assert store.get(NS, key(i)) is not None  # used at once
    assert read_file(path).count() == 1  # the first put wrote; the others wait
    assert store.pending == 4
    assert store.flush(strict=True)
    assert read_file(path).count() == 5 and store.pending == 0


def test_a_write_is_made_once_the_interval_is_over(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.autoflush_s = 0.0  # every put: as without it
    for i in range(3):
        store.put(NS, key(i), record(key(i)))
        assert read_file(path).count() == i + 1
    store.autoflush_s = None
    store.put(NS, key(3), record(key(3)))
    assert read_file(path).count() == 4


def test_the_exit_writes_what_is_pending(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from cache_helpers import NS, key, record
        from unimatmul.cache.file_store import MsgpackFileStore
        store = MsgpackFileStore({str(path)!r})
        store.autoflush_s = 3600.0
        for i in range(4):
            store.put(NS, key(i), record(key(i)))
        assert store.pending == 3
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert read_file(path).count() == 4


def test_a_miss_within_the_interval_does_not_write(tmp_path: Path) -> None:
    # A miss gives a store the chance to write what another process's write left pending;
    # within the interval it waits as a put does.
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path, refresh_s=0.0)
    store.autoflush_s = 3600.0
    store.put(NS, key(0), record(key(0)))
    store.put(NS, key(1), record(key(1)))
    assert store.get(NS, key(99)) is None  # a miss
    assert read_file(path).count() == 1 and store.pending == 1
    store.autoflush_s = None
    assert store.get(NS, key(98)) is None  # a miss, the interval gone: written
    assert read_file(path).count() == 2 and store.pending == 0


def test_two_tune_runs_at_once_lose_nothing(tmp_path: Path) -> None:
    # Real tune mode in two processes writing one file, each at most once a second and
    # at its end: every problem of both is in the file.
    path = tmp_path / "c.msgpack"
    env = {k: v for k, v in os.environ.items() if k not in REGISTRY}
    env["UNIMATMUL_CACHE"] = str(path)
    runs = []
    for first in (8, 40):
        shapes = [x for i in range(8) for x in ("--shape", f"{first + i}x{24 + i}x16")]
        command = [sys.executable, "-m", "unimatmul", "tune", *shapes, "--budget-ms", "1", "--quiet"]
        runs.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    assert read_file(path).count() == 16
