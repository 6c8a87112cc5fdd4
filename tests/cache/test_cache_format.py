"""The file format: round trips, header, platform facts, old and newer schemas, checksums."""

from __future__ import annotations

import json
import math
import time
import warnings
import zlib
from pathlib import Path

import msgpack
import pytest
from cache_helpers import NS, PLATFORM, assert_same, key, record, split_file

from unimatmul.cache import codec, frames
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cache.record import CandidateResult, TuningRecord
from unimatmul.cli import main


def test_a_record_comes_back_from_another_store(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.note_platform(NS, PLATFORM)
    want = {key(i): record(key(i), 1e-3 * (1 + i)) for i in range(20)}
    for k, r in want.items():
        store.put(NS, k, r)
    other = MsgpackFileStore(path)
    assert other.count() == 20
    for k, r in want.items():
        assert_same(other.get(NS, k), r)
    assert other.namespaces() == {NS: PLATFORM}
    # The platform facts are written once for the namespace (and its copy), not per entry.
    _, parts = split_file(path.read_bytes())
    metas = [msgpack.unpackb(payload) for kind, _, _, payload in parts if kind == frames.META]
    assert len(metas) == 2 and metas[0] == metas[1]
    assert metas[0]["platform"] == PLATFORM and metas[0]["entries"] == 20
    assert path.read_bytes().count(b"x86_64:avx2") == 4  # the name and the arch, in each copy


def test_unusual_records_round_trip(tmp_path: Path) -> None:
    k = key(1)
    odd = TuningRecord(
        problem="not-the-key",  # a record may describe its problem differently
        winner="elsewhere/k9",  # a winner that is not among the results
        winner_s=math.inf,  # nothing ran
        default_s=3.0,  # differs from the Default result: written exactly
        results=[
            CandidateResult("default/default", "ok", 1e-300, 1, 0.0),  # beyond the time scale
            CandidateResult("x/y", "timeout", math.inf, 0, math.nan, "a status of another tool"),
            CandidateResult("x/z", "ok", -1.0, 3, -2.0),
        ],
        versions={},
        tuned_at=0.0,
        tune_s=0.0,
        settings={"nested": {"list": [1, 2.5, None, "s", True]}, "default_error": 0.125},
        writer="",
        device_state={"neg": -40, "f": 1.5, "none": None, "b": False, "s": "text", "big": 2**62},
    )
    store = MsgpackFileStore(tmp_path / "c.msgpack")
    store.put(NS, k, odd)
    got = MsgpackFileStore(tmp_path / "c.msgpack").get(NS, k)
    assert got is not None
    assert (got.problem, got.winner, got.winner_s, got.default_s) == (
        "not-the-key",
        "elsewhere/k9",
        math.inf,
        3.0,
    )
    assert got.settings == odd.settings
    assert got.device_state == odd.device_state
    assert got.results[0].median_s == 1e-300
    assert got.results[1].status == "timeout" and got.results[1].median_s == math.inf
    assert math.isnan(got.results[1].error or 0.0)
    assert got.results[2].median_s == -1.0 and got.results[2].error == -2.0


def test_header_keeps_created_and_moves_updated(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.put(NS, key(0), record(key(0)))
    first = read_file(path).header
    time.sleep(0.01)
    store.put(NS, key(1), record(key(1)))
    second = read_file(path).header
    assert first["writer"].startswith("unimatmul ")
    assert second["created"] == first["created"]
    assert second["updated"] > first["updated"]
    assert second["entries"] == 2


def test_schema_1_files_are_read_and_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    old = record(key(0))
    doc = {
        "format": codec.FORMAT,
        "schema": 1,
        "header": {"writer": "unimatmul 0.0.1", "created": 1.0, "updated": 2.0},
        "namespaces": {NS: {key(0): old.to_dict(), key(1): {"winner": 3}}},
    }
    path.write_bytes(msgpack.packb(doc))
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning, match="skipped 1 unreadable"):
        assert store.get(NS, key(0)) == old
    store.put(NS, key(2), record(key(2)))
    upgraded = read_file(path)
    assert upgraded.schema == codec.SCHEMA
    assert upgraded.header["created"] == 1.0
    assert sorted(upgraded.namespaces[NS].sorted_keys()) == sorted([key(0), key(2)])


def _newer(path: Path, compat: int) -> bytes:
    body = msgpack.packb({})
    data = msgpack.packb(
        {
            "format": codec.FORMAT,
            "schema": 9,
            "compat": compat,
            "header": {},
            "crc32": zlib.crc32(body),
            "body": body,
        }
    )
    path.write_bytes(data)
    return data


def test_a_newer_schema_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    data = _newer(path, compat=9)
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning) as caught:
        assert store.get(NS, key(0)) is None
        store.put(NS, key(0), record(key(0)))
        store.put(NS, key(1), record(key(1)))
    text = " ".join(str(w.message) for w in caught)
    assert "newer" in text and "never overwritten" in text
    assert path.read_bytes() == data
    assert store.get(NS, key(0)) is not None  # kept in this process
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_newer_schema_that_declares_compatibility_is_read_but_not_written(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    doc = msgpack.unpackb(path.read_bytes())
    doc.update(schema=5, compat=3, future_field=[1, 2])
    data = msgpack.packb(doc)
    path.write_bytes(data)
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning, match="newer"):
        assert_same(store.get(NS, key(0)), record(key(0)))
        store.put(NS, key(1), record(key(1)))
    assert path.read_bytes() == data


def test_the_checksum_depends_on_entries_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a.msgpack", tmp_path / "b.msgpack"
    records = {key(i): record(key(i), 1e-3 + i * 1e-6) for i in range(30)}
    sa = MsgpackFileStore(a)
    for k, r in records.items():
        sa.put(NS, k, r)
    sa.delete(NS, key(3))
    sa.put(NS, key(3), records[key(3)])
    sb = MsgpackFileStore(b, autoflush=0, compression=1)
    with sb.batch():
        for k in reversed(list(records)):
            sb.put(NS, k, records[k])
    assert a.read_bytes() != b.read_bytes()
    digest = codec.content_digest(read_file(a))
    assert digest == codec.content_digest(read_file(b))
    sb.put(NS, key(4), record(key(4), 2e-3))
    assert codec.content_digest(read_file(b)) == digest  # autoflush=0: not written yet
    sb.flush()
    assert codec.content_digest(read_file(b)) != digest


def test_json_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.note_platform(NS, PLATFORM)
    store.put(NS, key(0), record(key(0)))
    inf = record(key(1))
    inf.winner_s = math.inf
    store.put(NS, key(1), inf)
    out = tmp_path / "c.json"
    assert main(["cache", "export", "--cache", str(path), "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "unimatmul-cache-json"
    entries = doc["namespaces"][NS]["entries"]
    assert doc["namespaces"][NS]["platform"] == PLATFORM
    assert entries[key(1)]["winner_s"] == "inf"
    assert entries[key(0)]["winner"] == "fake/k0"
    assert entries[key(0)]["device_state"] == {"cpu_mhz": 2600, "cpu_temp_c": 51, "governor": "performance"}
    assert "exported 2 entries" in capsys.readouterr().out


def test_put_refuses_what_cannot_be_written(tmp_path: Path) -> None:
    store = MsgpackFileStore(tmp_path / "c.msgpack")
    bad = record(key(0))
    bad.settings = {"obj": object()}
    with pytest.raises(TypeError, match="settings"):
        store.put(NS, key(0), bad)
    with pytest.raises(ValueError, match="NUL"):
        store.put(NS, "a\0b", record("a"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.count() == 0
