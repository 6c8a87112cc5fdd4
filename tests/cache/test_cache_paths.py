"""What sits at the cache path: a symlink to a shared cache, a FIFO, a damaged file and its kept copies."""

from __future__ import annotations

import os
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from cache_helpers import NS, PYTHON, key, record

from unimatmul.cache import file_store as store_module
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.core import notices


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    notices.forget()


# --- a symlink to a shared cache -------------------------------------------------------


def test_a_symlinked_cache_is_written_through_the_link(tmp_path: Path) -> None:
    shared = tmp_path / "team" / "shared.msgpack"
    shared.parent.mkdir()
    MsgpackFileStore(shared).put(NS, key(0), record(key(0), writer="team"))
    mine = tmp_path / "home" / "cache.msgpack"
    mine.parent.mkdir()
    mine.symlink_to(shared)

    store = MsgpackFileStore(mine)
    assert store.get(NS, key(0)) is not None
    store.put(NS, key(1), record(key(1), writer="me"))
    # The link is still a link, and the shared target received the entry.
    assert mine.is_symlink() and os.readlink(mine) == str(shared)
    assert read_file(shared).count() == 2
    # The lock and temp files live beside the target, where every user of it looks.
    assert (shared.parent / "shared.msgpack.lock").exists()
    assert not (mine.parent / "cache.msgpack.lock").exists()
    assert not list(mine.parent.glob(".*.tmp")) and not list(shared.parent.glob(".*.tmp"))
    # A writer that uses the target directly sees the link's entries and vice versa.
    MsgpackFileStore(shared).put(NS, key(2), record(key(2), writer="team"))
    assert MsgpackFileStore(mine).count() == 3


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "c.msgpack"
    link = tmp_path / "c.msgpack"
    link.symlink_to(target)
    MsgpackFileStore(link).put(NS, key(0), record(key(0)))
    assert link.is_symlink() and target.is_file()
    assert read_file(target).count() == 1


# --- a FIFO (or anything that is not a regular file) -----------------------------------

_FIFO_PROGRAM = r"""
import sys, warnings
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from cache_helpers import NS, key, record
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cli import main
warnings.simplefilter("always")
store = MsgpackFileStore(sys.argv[1])
assert store.get(NS, key(0)) is None
store.put(NS, key(0), record(key(0)))
assert store.get(NS, key(0)) is not None and store.read_only
print("stats exit", main(["cache", "stats", "--cache", sys.argv[1]]))
print("verify exit", main(["cache", "verify", "--cache", sys.argv[1]]))
print("show exit", main(["cache", "show", "--cache", sys.argv[1]]))
"""


def test_a_fifo_at_the_cache_path_never_hangs_and_is_never_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "c.msgpack"
    os.mkfifo(fifo)
    started = time.monotonic()
    proc = subprocess.run(
        [PYTHON, "-c", _FIFO_PROGRAM, str(fifo), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=60,  # before the fix, opening the FIFO blocked for ever
    )
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started < 30
    assert "not a regular file" in proc.stderr
    assert "stats exit 0" in proc.stdout and "verify exit 3" in proc.stdout and "show exit 0" in proc.stdout
    assert fifo.is_fifo()  # never replaced by a regular file


def test_a_folder_at_the_cache_path_is_refused_and_left(tmp_path: Path) -> None:
    folder = tmp_path / "c.msgpack"
    folder.mkdir()
    store = MsgpackFileStore(folder)
    with pytest.warns(RuntimeWarning, match="not a regular file|cannot be read"):
        assert store.get(NS, key(0)) is None
        store.put(NS, key(0), record(key(0)))
    assert folder.is_dir() and store.get(NS, key(0)) is not None


# --- damaged files: a copy is kept, and the newest copies are the ones kept --------------


def test_a_newly_kept_copy_of_an_old_file_is_never_the_one_removed(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    for i in range(store_module.KEEP_CORRUPT):
        (tmp_path / f"c.msgpack.corrupt-2030010{i}T000000").write_bytes(b"an older copy %d" % i)
    path.write_bytes(b"garbage: a cache file that cannot be read")
    year_2001 = 1_000_000_000
    os.utime(path, (year_2001, year_2001))  # a file broken long ago, found only now
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    said = " ".join(str(w.message) for w in caught)
    kept = [p for p in tmp_path.glob("c.msgpack.corrupt-*") if p.read_bytes().startswith(b"garbage")]
    assert len(kept) == 1, said
    assert str(kept[0]) in said
    assert len(list(tmp_path.glob("c.msgpack.corrupt-*"))) == store_module.KEEP_CORRUPT
    assert read_file(path).count() == 1


def test_verify_of_a_folder_says_so_and_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from unimatmul.cli import main
    from unimatmul.cli.output import EXIT_UNAVAILABLE

    assert main(["cache", "verify", "--cache", str(tmp_path)]) == EXIT_UNAVAILABLE
    out = capsys.readouterr().out
    assert "a folder is at the cache path, not a regular file" in out
    assert "Errno" not in out


def test_a_store_opened_for_reading_never_blames_the_read_only_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNIMATMUL_CACHE_READONLY", raising=False)
    folder = tmp_path / "c.msgpack"
    folder.mkdir()
    notices.forget()
    reader = MsgpackFileStore(folder, read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader.put(NS, key(0), record(key(0)))
        assert reader.flush() is False
    said = " ".join(str(w.message) for w in caught)
    assert "read-only" in said and "not a regular file" in said
    assert "UNIMATMUL_CACHE_READONLY" not in said
    assert "UNIMATMUL_CACHE_READONLY" not in MsgpackFileStore(tmp_path / "d", read_only=True).read_only_reason
