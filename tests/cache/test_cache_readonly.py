"""Read-only caches: UNIMATMUL_CACHE_READONLY=1 or a file that cannot be written never change."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cache_helpers import NS, key, record

import unimatmul
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.core import notices


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    notices.forget()


def test_the_environment_makes_a_store_read_only_and_it_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    before = path.read_bytes()
    stat = path.stat()
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    store = MsgpackFileStore(path)
    assert store.read_only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, 5):
            store.put(NS, key(i), record(key(i)))
        store.delete(NS, key(0))
        store.flush()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "UNIMATMUL_CACHE_READONLY" in messages[0]
    assert store.get(NS, key(3)) is not None  # kept in this process
    assert store.get(NS, key(0)) is None
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert not store.lock_path.exists() or store.lock_path.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.msgpack", "c.msgpack.lock"]


def test_a_path_that_cannot_be_written_turns_the_store_read_only(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    store = MsgpackFileStore(blocker / "c.msgpack")
    with pytest.warns(RuntimeWarning, match="cannot be written") as caught:
        store.put(NS, key(0), record(key(0)))
        store.put(NS, key(1), record(key(1)))
    assert len([w for w in caught if "cannot be written" in str(w.message)]) == 1
    assert store.read_only
    assert store.get(NS, key(1)) is not None
    assert blocker.read_text().startswith("a file")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only files")
def test_a_file_without_write_permission_is_never_replaced(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    path.chmod(0o444)
    before = path.read_bytes()
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        store.put(NS, key(1), record(key(1)))
    assert path.read_bytes() == before


def test_a_read_only_selector_tunes_in_memory_and_leaves_the_file(
    isolated: Any, fake_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_backend("fa")
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    a = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((8, 12)).astype(np.float32)
    with unimatmul.mode("tune"), pytest.warns(RuntimeWarning, match="read-only"):
        out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert isolated.selector.stats.tuned == 1
    assert isolated.store_count() == 1
    assert not isolated.cache_path.exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only folders")
def test_writing_commands_in_a_read_only_folder_name_the_folder_not_a_lock_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from unimatmul.cli import main

    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "c.msgpack"
    other = tmp_path / "other.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    MsgpackFileStore(other).put(NS, key(1), record(key(1)))
    (folder / "c.msgpack.lock").unlink()
    csv = tmp_path / "results.csv"
    csv.write_text("Validator,PT_VERSION,2.6.0\nGemmTunableOp_float_NN,nn_8_8_8_ld_8_8_8,Default,0.01\n")
    folder.chmod(0o555)
    before = path.read_bytes()
    try:
        for command in (
            ["cache", "prune", "--older-than", "0", "--cache", str(path)],
            ["cache", "recover", str(other), "--cache", str(path)],
            ["cache", "merge", str(path), str(other), "-o", str(path)],
            ["cache", "import", "tunableop", str(csv), "--namespace", NS, "--cache", str(path)],
        ):
            assert main(command) == 1, command
            err = capsys.readouterr().err
            assert "the folder is not writable" in err and ".lock" not in err, (command, err)
    finally:
        folder.chmod(0o755)
    assert path.read_bytes() == before
