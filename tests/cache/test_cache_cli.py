"""``unimatmul cache stats | merge | verify | prune``."""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest
from cache_helpers import NS, PLATFORM, assert_same, key, record

from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cache.record import mark_from_elsewhere
from unimatmul.cli import EXIT_USAGE, main

OTHER = "nvidia/sm_90/NVIDIA H200/132/torch"


def _fill(
    path: Path, entries: dict[tuple[str, str], float], *, tuned_at: float = 1.7e9, writer: str = "w"
) -> None:
    store = MsgpackFileStore(path, autoflush=0)
    store.note_platform(NS, PLATFORM)
    with store.batch():
        for (ns, k), t in entries.items():
            store.put(ns, k, record(k, t, tuned_at=tuned_at, writer=writer))


def test_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    _fill(path, {(NS, key(i)): 1e-3 for i in range(5)} | {(OTHER, key(9)): 1e-3})
    (tmp_path / ".c.msgpack.abc.tmp").write_bytes(b"left by a killed writer")
    capsys.readouterr()
    assert main(["cache", "stats", "--cache", str(path)]) == 0
    text = capsys.readouterr().out
    assert "entries:  6 in 2 namespaces" in text
    assert f"[{NS}]" in text and "winners:   fake 5" in text
    assert "temp files of interrupted writers: 1" in text
    assert main(["cache", "stats", "--cache", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["entries"] == 6 and data["schema"] == 4 and data["file_bytes"] == path.stat().st_size
    by_name = {n["namespace"]: n for n in data["namespaces"]}
    assert by_name[NS]["platform"] == PLATFORM and by_name[OTHER]["platform"] == {}
    assert by_name[NS]["entries"] == 5 and data["temp_files"] == [".c.msgpack.abc.tmp"]
    assert main(["cache", "stats", "--cache", str(tmp_path / "none.msgpack")]) == 0
    assert "none yet" in capsys.readouterr().out


def test_verify_prints_a_checksum_to_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    _fill(path, {(NS, key(i)): 1e-3 * (i + 1) for i in range(8)})
    capsys.readouterr()
    assert main(["cache", "verify", "--cache", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("ok: 8 entries in 1 namespace,")
    digest = re.search(r"sha256 ([0-9a-f]{64})", text)
    assert digest is not None
    assert main(["cache", "verify", "--cache", str(path), "--expect", digest.group(1)]) == 0
    assert "matches" in capsys.readouterr().out
    # A rewrite that changes no entry keeps the checksum: it pins content, not bytes.
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "100000"]) == 0
    assert main(["cache", "verify", "--cache", str(path), "--expect", digest.group(1), "--json"]) == 0
    capsys.readouterr()
    MsgpackFileStore(path).put(NS, key(0), record(key(0), 0.5e-3))
    assert main(["cache", "verify", "--cache", str(path), "--expect", digest.group(1)]) == 1
    assert "MISMATCH" in capsys.readouterr().out
    assert main(["cache", "verify", "--cache", str(tmp_path / "missing")]) == 3


def test_merge_keeps_the_faster_record_and_every_platform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = tmp_path / "a.msgpack", tmp_path / "b.msgpack", tmp_path / "out" / "c.msgpack"
    _fill(a, {(NS, key(0)): 1e-3, (NS, key(1)): 3e-3}, writer="a")
    _fill(b, {(NS, key(1)): 2e-3, (OTHER, key(2)): 1e-3}, writer="b")
    capsys.readouterr()
    # The folder of -o must exist, as for every file a command writes: nothing is made.
    assert main(["cache", "merge", str(a), str(b), "-o", str(c)]) == EXIT_USAGE
    assert f"no directory {c.parent}" in capsys.readouterr().err and not c.parent.exists()
    c.parent.mkdir()
    assert main(["cache", "merge", str(a), str(b), "-o", str(c)]) == 0
    assert "3 entries, 1 key in several files" in capsys.readouterr().out
    merged = MsgpackFileStore(c)
    assert merged.count() == 3
    # Entries from the merged files are marked as come by merge (checked on first call).
    assert_same(merged.get(NS, key(1)), mark_from_elsewhere(record(key(1), 2e-3, writer="b"), "merge"))
    assert merged.get(OTHER, key(2)) is not None
    assert merged.namespaces()[NS] == PLATFORM
    # Merging in the other order gives the same content.
    assert main(["cache", "merge", str(b), str(a), "-o", str(tmp_path / "d.msgpack")]) == 0
    capsys.readouterr()
    assert main(["cache", "verify", "--cache", str(c)]) == 0
    first = capsys.readouterr().out.split("sha256 ")[1]
    assert main(["cache", "verify", "--cache", str(tmp_path / "d.msgpack")]) == 0
    assert capsys.readouterr().out.split("sha256 ")[1] == first
    assert main(["cache", "merge", str(a), str(tmp_path / "nope"), "-o", str(c)]) == 3


def test_prune_by_age_and_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    path = tmp_path / "c.msgpack"
    now = time.time()
    _fill(path, {(NS, key(i)): 1e-3 for i in range(4)}, tuned_at=now - 40 * 86400)
    store = MsgpackFileStore(path)
    for i in range(4, 7):
        store.put(NS, key(i), record(key(i), tuned_at=now))
    store.put(OTHER, key(9), record(key(9), tuned_at=now))
    capsys.readouterr()
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "30", "--dry-run"]) == 0
    assert "would remove 4 entries" in capsys.readouterr().out
    assert read_file(path).count() == 8
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "30"]) == 0
    assert "removed 4 entries" in capsys.readouterr().out
    assert main(["cache", "prune", "--cache", str(path), "--namespace", OTHER]) == 0
    assert sorted(read_file(path).namespaces[NS].sorted_keys()) == sorted(key(i) for i in range(4, 7))
    assert OTHER not in MsgpackFileStore(path).namespaces()
    assert main(["cache", "prune", "--cache", str(path)]) == 2  # nothing asked: usage error


def test_prune_compacts_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path, autoflush=0)
    with store.batch():
        for i in range(50):
            r = record(key(i))
            r.results[2].note = f"a note only entry {i} has: {secrets.token_hex(24)}"
            store.put(NS, key(i), r)
    before = path.stat().st_size
    for i in range(45):
        store.delete(NS, key(i))
    store.flush()
    assert path.stat().st_size > 0.5 * before  # deleting leaves the tables as they were
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "100000"]) == 0
    assert path.stat().st_size < 0.5 * before
    assert b"".join(read_file(path).namespaces[NS].tables.strings.raw()).count(b"a note only") == 5
