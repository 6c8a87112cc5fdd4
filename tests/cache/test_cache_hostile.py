"""Hostile and broken files: never a crash, a hang or a memory blow-up; broken files moved aside."""

from __future__ import annotations

import tracemalloc
import warnings
import zlib
from pathlib import Path

import msgpack
import pytest
from cache_helpers import NS, key, record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unimatmul.cache import codec, safe_msgpack
from unimatmul.cache import file_store as store_module
from unimatmul.cache.codec import BadEntry, CacheFileError, decode_file, iter_records
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cli import main
from unimatmul.core import notices


def _valid_file(tmp_path: Path, n: int = 12) -> bytes:
    path = tmp_path / "valid.msgpack"
    store = MsgpackFileStore(path, autoflush=0)
    with store.batch():
        for i in range(n):
            store.put(NS, key(i), record(key(i), 1e-3 * (i + 1)))
    return path.read_bytes()


def _read_all(data: bytes) -> int:
    """Decode a file and every entry; only CacheFileError / BadEntry may come out."""
    snapshot = decode_file(data)
    n = 0
    for _, _, r in iter_records(snapshot):
        assert isinstance(r, BadEntry) or r.winner is not None
        n += 1
    return n


# --- the pre-scan ----------------------------------------------------------------------


def test_deep_nesting_is_refused_before_unpacking() -> None:
    # msgpack's C unpacker stops at 1024 levels by itself, its pure-Python fallback
    # recurses; the pre-scan refuses far earlier whichever one is installed.
    for depth in (safe_msgpack.MAX_DEPTH, 1000, 200_000):
        with pytest.raises(CacheFileError, match="nesting deeper"):
            safe_msgpack.scan(b"\x91" * depth + b"\xc0")
    safe_msgpack.scan(b"\x91" * (safe_msgpack.MAX_DEPTH - 1) + b"\xc0")


def test_millions_of_tiny_objects_are_refused_without_building_them() -> None:
    # 4 MB of empty arrays would become hundreds of MB of Python lists.
    count = 4_000_000
    data = b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count
    tracemalloc.start()
    try:
        with pytest.raises(CacheFileError, match="msgpack objects"):
            decode_file(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xd4\x01\x00", "extension"),  # fixext 1
        (b"\xc7\x01\x05\x00", "extension"),  # ext 8
        (b"\xc1", "reserved"),
        (b"\x92\x01", "claims"),
        (b"\x92\x01\xcd\x01", "truncated"),
        (b"\x01\x02", "after the end"),
        (b"\xdd\xff\xff\xff\xff\x00", "claims"),
        (b"\xdb\xff\xff\xff\xffab", "truncated"),
        (b"", "empty"),
        (msgpack.packb([1, 2]), "not a unimatmul cache"),
        (msgpack.packb({"format": "unimatmul-cache", "schema": "2"}), "schema"),
        (msgpack.packb({"format": "unimatmul-cache", "schema": 2, "body": b"x", "crc32": 1}), "CRC"),
        (msgpack.packb({"format": "unimatmul-cache", "schema": 1, "namespaces": [], "header": {}}), "map"),
        (msgpack.packb({1: 2}), "not a valid msgpack"),  # non-string map key
        (b"\xa2\xff\xfe", "not a valid msgpack"),  # invalid UTF-8
    ],
)
def test_broken_documents_are_refused_with_a_reason(data: bytes, why: str) -> None:
    with pytest.raises(CacheFileError, match=why):
        decode_file(data)


def _file_with_namespace(ns: dict[str, object]) -> bytes:
    body = msgpack.packb({NS: ns}, use_bin_type=True)
    return msgpack.packb(
        {"format": codec.FORMAT, "schema": 2, "header": {}, "crc32": zlib.crc32(body), "body": body},
        use_bin_type=True,
    )


def test_a_compression_bomb_is_stopped_at_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_INFLATED_BYTES", 1 << 20)
    bomb = zlib.compress(b"\0" * (64 << 20), 9)  # 64 MiB of zeros in ~64 kB
    data = _file_with_namespace(
        {"platform": {}, "string_count": 0, "strings": zlib.compress(b""), "maps": [], "list_count": 0,
         "count": 1, "keys": zlib.compress(b"k"), "lists": zlib.compress(b""), "rows": bomb}
    )  # fmt: skip
    tracemalloc.start()
    try:
        with pytest.raises(CacheFileError, match="limit"):
            decode_file(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_columns_that_lie_about_their_contents_are_refused() -> None:
    good = {"platform": {}, "string_count": 1, "strings": zlib.compress(b"\x02\0\0\0ab"), "maps": [],
            "list_count": 0, "count": 1, "keys": zlib.compress(b"k"), "lists": zlib.compress(b""),
            "rows": zlib.compress(b"\x05\0\0\0abcde")}  # fmt: skip
    decode_file(_file_with_namespace(good))
    cases = {
        "lengths add up": {"rows": zlib.compress(b"\x09\0\0\0abcde")},
        "shorter than its length": {"rows": zlib.compress(b"\x05\0")},
        "keys for": {"count": 2, "rows": zlib.compress(b"\0\0\0\0\0\0\0\0")},
        "appears twice": {"count": 2, "keys": zlib.compress(b"k\0k"), "rows": zlib.compress(b"\0" * 8)},
        "truncated or padded": {"keys": zlib.compress(b"k")[:-2]},
        "not binary": {"keys": "k"},
        "bad string count": {"string_count": "1"},
        "strings: the column is shorter": {"string_count": 2},
        "bad entry count": {"count": -1},
        "bad list count": {"list_count": True},
        "settings": {"maps": [{"a": {"b": {"c": {"d": {"e": 1}}}}}]},
    }
    for why, change in cases.items():
        with pytest.raises(CacheFileError, match=why):
            decode_file(_file_with_namespace({**good, **change}))


# --- quarantine ------------------------------------------------------------------------


def test_a_damaged_file_is_moved_aside_and_the_program_carries_on(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    data = bytearray(_valid_file(tmp_path))
    data[len(data) // 2] ^= 0x40  # one flipped bit in the body: the CRC catches it
    path.write_bytes(bytes(data))
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning) as caught:
        assert store.get(NS, key(0)) is None
    message = str(caught[0].message)
    assert str(path) in message and "CRC" in message and ".corrupt-" in message
    aside = list(tmp_path.glob("c.msgpack.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)
    store.put(NS, key(1), record(key(1)))
    assert MsgpackFileStore(path).count() == 1


def test_a_truncated_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    path.write_bytes(_valid_file(tmp_path)[:-100])
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert MsgpackFileStore(path).count() == 0
    assert not path.exists()


def test_only_a_few_broken_copies_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.msgpack"
    for i in range(6):
        path.write_bytes(b"garbage %d" % i)
        notices.forget()
        with pytest.warns(RuntimeWarning):
            MsgpackFileStore(path).count()
    assert len(list(tmp_path.glob("c.msgpack.corrupt-*"))) == store_module.KEEP_CORRUPT


def test_tools_and_read_only_stores_leave_a_broken_file_in_place(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    path.write_bytes(b"\x93garbage")
    with pytest.warns(RuntimeWarning, match="left in place"):
        assert MsgpackFileStore(path, read_only=True).count() == 0
    assert main(["cache", "verify", "--cache", str(path)]) == 1
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


def test_one_malformed_entry_costs_only_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    MsgpackFileStore(path).put(NS, key(0), record(key(0)))
    snapshot = read_file(path)
    ns = snapshot.namespaces[NS]
    good_row = ns.row(key(0))
    assert good_row is not None
    # A crafted row: its candidate list index points far outside the table.
    ns.put(key(1), record(key(1)))
    data = codec.encode_file(snapshot, {})
    raw = msgpack.unpackb(data)
    body = msgpack.unpackb(raw["body"])
    rows = zlib.decompress(body[NS]["rows"])
    keys = zlib.decompress(body[NS]["keys"]).split(b"\0")
    bad_index = keys.index(key(1).encode())
    lengths = [int.from_bytes(rows[4 * i : 4 * i + 4], "little") for i in range(2)]
    start = 8 + sum(lengths[:bad_index])
    rows = rows[: start + 21] + b"\xff\x7f" + rows[start + 23 :]
    body[NS]["rows"] = zlib.compress(rows[:8] + rows[8:])
    raw["body"] = msgpack.packb(body, use_bin_type=True)
    raw["crc32"] = zlib.crc32(raw["body"])
    path.write_bytes(msgpack.packb(raw, use_bin_type=True))
    store = MsgpackFileStore(path)
    assert store.get(NS, key(0)) is not None
    with pytest.warns(RuntimeWarning, match="malformed|outside"):
        assert store.get(NS, key(1)) is None
    assert main(["cache", "verify", "--cache", str(path)]) == 1
    assert "1 unreadable" in capsys.readouterr().out
    assert main(["cache", "prune", "--cache", str(path), "--bad"]) == 0
    assert main(["cache", "verify", "--cache", str(path)]) == 0
    assert MsgpackFileStore(path).count() == 1


# --- fuzzing -----------------------------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_never_escape_as_anything_but_a_refusal(data: bytes) -> None:
    try:
        _read_all(data)
    except CacheFileError:
        pass


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _valid_file(tmp_path_factory.mktemp("fuzz"))


@FUZZ
@given(st.data())
def test_mutated_files_never_escape_as_anything_but_a_refusal(
    valid_bytes: bytes, data: st.DataObject
) -> None:
    blob = bytearray(valid_bytes)
    for _ in range(data.draw(st.integers(1, 4))):
        if not blob:
            break
        kind = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(blob) - 1)))
        if kind == "flip":
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            blob[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            del blob[at : at + data.draw(st.integers(1, 16))]
    try:
        _read_all(bytes(blob))
    except CacheFileError:
        pass


@FUZZ
@given(st.data())
def test_mutated_rows_are_bad_entries_never_crashes(valid_bytes: bytes, data: st.DataObject) -> None:
    # Past the CRC: rows changed and the checksum recomputed, as a crafted file would.
    raw = msgpack.unpackb(valid_bytes)
    body = msgpack.unpackb(raw["body"])
    rows = bytearray(zlib.decompress(body[NS]["rows"]))
    head = 4 * body[NS]["count"]
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(head, len(rows) - 1))
        rows[at] = data.draw(st.integers(0, 255))
    body[NS]["rows"] = zlib.compress(bytes(rows))
    raw["body"] = msgpack.packb(body, use_bin_type=True)
    raw["crc32"] = zlib.crc32(raw["body"])
    assert _read_all(msgpack.packb(raw, use_bin_type=True)) == body[NS]["count"]


def test_a_store_over_fuzzed_files_always_answers(tmp_path: Path) -> None:
    import random

    rng = random.Random(5)
    valid = _valid_file(tmp_path)
    path = tmp_path / "c.msgpack"
    for i in range(40):
        blob = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        path.write_bytes(bytes(blob))
        notices.forget()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            store = MsgpackFileStore(path)
            store.count()
            store.get(NS, key(0))
            store.put(NS, key(100 + i), record(key(100 + i)))
        # Whatever was there, the file now loads and holds the new entry.
        assert MsgpackFileStore(path).get(NS, key(100 + i)) is not None
