"""Many processes and threads on one cache file: nothing lost, crashes harmless, one tuning per key."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cache_helpers import NS, PLATFORM, PYTHON, key, record, writer_script

from unimatmul.cache import lock as lock_module
from unimatmul.cache.codec import content_digest
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cache.lock import FileLock


def _spawn(path: Path, worker: int, count: int, *, autoflush: int, loop: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, "-c", writer_script(), str(path), str(worker), str(count), str(autoflush), str(int(loop))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_processes_writing_500_entries_each_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    # Every put goes through the real put path; a process writes every 25 puts, so
    # the 8 processes make 160 locked read-merge-writes that overlap.
    workers = [_spawn(path, w, 500, autoflush=25, loop=False) for w in range(8)]
    for proc in workers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "done" in out
    snapshot = read_file(path)
    ns = snapshot.namespaces[NS]
    assert len(ns) == 4000
    expected = {key(w * 1_000_000 + i) for w in range(8) for i in range(500)}
    assert set(ns.sorted_keys()) == expected
    got = MsgpackFileStore(path).get(NS, key(3 * 1_000_000 + 7))
    assert got is not None and got.writer == "worker 3"
    assert ns.platform == PLATFORM
    content_digest(snapshot)  # every row decodes
    assert not list(tmp_path.glob(".c.msgpack.*.tmp"))


def test_writers_killed_at_random_moments_leave_a_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    seed = MsgpackFileStore(path, autoflush=0)
    with seed.batch():  # a file big enough that every write takes a while
        for i in range(3000):
            seed.put(NS, key(900_000_000 + i), record(key(900_000_000 + i)))
    rng = random.Random(11)
    worker = 0
    running: list[subprocess.Popen[str]] = []
    seen = 3000
    try:
        for _ in range(2):
            running.append(_spawn(path, worker, 5, autoflush=1, loop=True))
            worker += 1
        for _ in range(12):
            time.sleep(rng.uniform(0.3, 0.9))
            victim = running.pop(rng.randrange(len(running)))
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            snapshot = read_file(path)  # raises if the file is not valid
            assert snapshot.count() >= seen  # nothing written before was lost
            seen = snapshot.count()
            running.append(_spawn(path, worker, 5, autoflush=1, loop=True))
            worker += 1
    finally:
        for proc in running:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert seen > 3000  # the writers did write between kills
    content_digest(read_file(path))
    # Temp files of killed writers are removed by the next writer.
    MsgpackFileStore(path).put(NS, key(777_777_777), record(key(777_777_777)))
    assert not list(tmp_path.glob(".c.msgpack.*.tmp"))
    assert read_file(path).count() >= seen + 1


def test_the_faster_record_wins_whatever_the_order(tmp_path: Path) -> None:
    fast = record(key(0), 1e-3, writer="a")
    slow = record(key(0), 2e-3, writer="b")
    tie_old = record(key(0), 1e-3, writer="c", tuned_at=1.0)
    for order in ([fast, slow], [slow, fast], [tie_old, fast], [fast, tie_old]):
        path = tmp_path / f"c{random.random()}.msgpack"
        stores = [MsgpackFileStore(path) for _ in order]
        for s in stores:
            s.count()  # both loaded the empty file: neither saw the other's record
        for s, r in zip(stores, order, strict=True):
            s.put(NS, key(0), r)
        got = MsgpackFileStore(path).get(NS, key(0))
        assert got is not None
        assert got.writer == "a", [r.writer for r in order]  # faster; on a tie, the newer


def test_a_deliberate_replacement_is_kept_even_when_slower(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.put(NS, key(0), record(key(0), 1e-3))
    store.put(NS, key(0), record(key(0), 5e-3, writer="retuned"))  # e.g. tune --force
    got = MsgpackFileStore(path).get(NS, key(0))
    assert got is not None and got.writer == "retuned"


def test_a_delete_does_not_remove_what_another_process_stored_since(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0), writer="old"))
    a, b = MsgpackFileStore(path), MsgpackFileStore(path)
    assert a.get(NS, key(0)) is not None
    b.put(NS, key(0), record(key(0), 0.5e-3, writer="new"))
    assert a.delete(NS, key(0))  # a decided the old record is invalid
    got = MsgpackFileStore(path).get(NS, key(0))
    assert got is not None and got.writer == "new"


def test_another_process_entries_are_seen_after_a_miss(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    reader = MsgpackFileStore(path, refresh_s=0.0)
    assert reader.get(NS, key(0)) is None
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    assert reader.get(NS, key(0)) is not None


def test_many_threads_asking_for_one_new_key_tune_it_once(isolated: Any, fake_backend: Any) -> None:
    import unimatmul

    backend = fake_backend("fa", kernels=("k0", "k1"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 24)).astype(np.float32)
    b = rng.standard_normal((24, 32)).astype(np.float32)
    outs: list[np.ndarray] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait()
            with unimatmul.mode("tune"):
                outs.append(unimatmul.matmul(a, b))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert backend.candidate_calls == 1
    assert isolated.selector.stats.tuned == 1
    assert isolated.store_count() == 1
    for out in outs:
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


# --- locking on file systems that refuse it --------------------------------------------


def _concurrent_puts(path: Path, threads: int = 4, each: int = 15) -> None:
    def work(t: int) -> None:
        store = MsgpackFileStore(path)  # one store per thread: each its own view
        for i in range(each):
            store.put(NS, key(t * 100 + i), record(key(t * 100 + i)))
        # What a process's exit does: a put that met another writer left its record pending.
        assert store.flush()

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def _refuse(exc_errno: int) -> Any:
    def call(*args: Any) -> None:
        raise OSError(exc_errno, os.strerror(exc_errno))

    return call


def test_without_flock_the_lock_falls_back_to_lockf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(errno.ENOLCK))  # as some NFS mounts answer
    with FileLock(tmp_path / "x.lock") as lock:
        assert lock.method == "lockf"
    _concurrent_puts(tmp_path / "c.msgpack")
    assert read_file(tmp_path / "c.msgpack").count() == 60


def test_without_any_fcntl_lock_a_lock_directory_serialises_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(errno.EOPNOTSUPP))
    monkeypatch.setattr(fcntl, "lockf", _refuse(errno.ENOLCK))
    with FileLock(tmp_path / "x.lock") as lock:
        assert lock.method == "mkdir"
        assert Path(f"{tmp_path / 'x.lock'}.d").is_dir()
    assert not Path(f"{tmp_path / 'x.lock'}.d").exists()
    _concurrent_puts(tmp_path / "c.msgpack")
    assert read_file(tmp_path / "c.msgpack").count() == 60


def test_a_lock_directory_left_by_a_dead_process_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    monkeypatch.setattr(fcntl, "flock", _refuse(errno.EOPNOTSUPP))
    monkeypatch.setattr(fcntl, "lockf", _refuse(errno.EOPNOTSUPP))
    stale = Path(f"{tmp_path / 'x.lock'}.d")
    stale.mkdir()
    old = time.time() - lock_module.STALE_LOCKDIR_S - 5
    os.utime(stale, (old, old))
    with FileLock(tmp_path / "x.lock", timeout_s=5.0) as lock:
        assert lock.method == "mkdir"


def test_a_held_lock_never_makes_a_put_wait_and_a_flush_waits_at_most_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path, lock_timeout_s=1.0)
    with FileLock(store.lock_path), warnings.catch_warnings():
        warnings.simplefilter("error")  # another process writing is no news
        started = time.monotonic()
        store.put(NS, key(0), record(key(0)))  # returns at once, the record pending
        assert time.monotonic() - started < 0.9
        assert store.pending == 1 and not path.exists()
        assert store.get(NS, key(0)) is not None  # this process uses it already
        with pytest.warns(RuntimeWarning, match="held for more than"):
            assert store.flush() is False  # an explicit flush waits, then says so
    # The next put writes both.
    store.put(NS, key(1), record(key(1)))
    assert store.pending == 0
    assert MsgpackFileStore(path).count() == 2


def test_a_record_left_pending_is_written_by_the_next_miss(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path, refresh_s=0.0)
    with FileLock(store.lock_path):
        store.put(NS, key(0), record(key(0)))
    assert store.pending == 1
    assert store.get(NS, key(5)) is None  # a miss looks at the file, and writes what waits
    assert store.pending == 0 and MsgpackFileStore(path).count() == 1


def test_pending_records_are_written_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from cache_helpers import NS, key, record
from unimatmul.cache.file_store import MsgpackFileStore
s = MsgpackFileStore({str(path)!r}, autoflush=0)
for i in range(10):
    s.put(NS, key(i), record(key(i)))
"""
    subprocess.run([PYTHON, "-c", script], check=True, timeout=60)
    assert read_file(path).count() == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MsgpackFileStore(path).count() == 10


def test_a_record_left_pending_by_a_dropped_store_is_written_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    holder = f"""
import sys, time
from pathlib import Path
from unimatmul.cache.lock import FileLock
with FileLock(Path({str(path)!r} + ".lock")):
    print("held", flush=True)
    time.sleep(1.5)
"""
    writer = f"""
import gc, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from cache_helpers import NS, key, record
from unimatmul.cache.file_store import MsgpackFileStore
store = MsgpackFileStore({str(path)!r})
store.put(NS, key(0), record(key(0)))  # another process is writing: left pending
assert store.pending == 1, "the lock should have been busy"
del store
gc.collect()
"""
    held = subprocess.Popen([PYTHON, "-c", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        subprocess.run([PYTHON, "-c", writer], check=True, timeout=60)
    finally:
        held.wait(timeout=60)
    assert MsgpackFileStore(path).get(NS, key(0)) is not None


@pytest.mark.slow
def test_merge_onto_a_live_file_while_two_writers_write_loses_nothing(tmp_path: Path) -> None:
    from unimatmul.cli import main

    lost = 0
    for trial in range(20):
        live, other = tmp_path / f"live{trial}.msgpack", tmp_path / f"other{trial}.msgpack"
        extra = MsgpackFileStore(other, autoflush=0)
        with extra.batch():
            for i in range(50):
                extra.put(NS, key(500_000_000 + trial * 1000 + i), record(key(500_000_000 + i)))
        # Every put of the writers is written when it returns (autoflush=1), under the
        # lock; the merges re-read the live file under it too.
        writers = [_spawn(live, 10 * trial + w, 40, autoflush=1, loop=False) for w in range(2)]
        merges = 0
        while any(p.poll() is None for p in writers) or merges < 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert main(["cache", "merge", str(live), str(other), "-o", str(live)]) == 0
            merges += 1
        for proc in writers:
            out, err = proc.communicate(timeout=120)
            assert "done" in out
            assert proc.returncode == 0, err
        found = set(read_file(live).namespaces[NS].sorted_keys())
        want = {key((10 * trial + w) * 1_000_000 + i) for w in range(2) for i in range(40)}
        want |= {key(500_000_000 + trial * 1000 + i) for i in range(50)}
        lost += len(want - found)
    assert lost == 0
