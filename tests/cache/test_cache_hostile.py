"""Hostile and broken files: never a crash, a hang or a memory blow-up; broken files moved aside."""

from __future__ import annotations

import tracemalloc
import warnings
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cache_helpers import NS, key, record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unimatmul.cache import codec, safe_msgpack
from unimatmul.cache import file_store as store_module
from unimatmul.cache.codec import BadEntry, CacheFileError, decode_file, iter_records
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cli import main
from unimatmul.core import notices


def _valid_file_of(n: int) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return _valid_file(Path(folder), n)


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


def _peak(call: Any) -> int:
    """The most memory Python held while ``call`` ran (it must refuse the file)."""
    tracemalloc.start()
    try:
        with pytest.raises(CacheFileError, match=r"limit|more than"):
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


def _bomb_namespace(**columns: bytes | int) -> dict[str, Any]:
    empty = zlib.compress(b"")
    return {"platform": {}, "string_count": 0, "strings": empty, "maps": [], "list_count": 0, "count": 1,
            "keys": zlib.compress(b"k"), "lists": empty, "rows": zlib.compress(b"\1\0\0\0x"), **columns}  # fmt: skip


def test_a_compression_bomb_costs_at_most_the_budget_of_its_size() -> None:
    # 200 MiB of zeros in 200 kB: the budget is 64 x the file, at least 16 MiB.
    bomb = zlib.compress(b"\0" * (200 << 20), 9)
    data = _file_with_namespace(_bomb_namespace(rows=bomb))
    limit = safe_msgpack.inflate_budget(len(data)).limit
    assert limit == max(safe_msgpack.MIN_INFLATE_BUDGET, 64 * len(data)) < 20 << 20
    # zlib joins its output blocks at the end: twice the budget at the peak, for a moment.
    assert _peak(lambda: decode_file(data)) < 2 * limit + (4 << 20)


def test_two_columns_share_one_budget() -> None:
    # Each column alone fits the budget; together they do not, and never both inflate.
    limit = safe_msgpack.MIN_INFLATE_BUDGET
    half_bomb = zlib.compress(b"\0" * int(0.9 * limit), 9)
    data = _file_with_namespace(_bomb_namespace(rows=half_bomb, strings=half_bomb))
    assert safe_msgpack.inflate_budget(len(data)).limit == limit
    assert _peak(lambda: decode_file(data)) < 2.1 * limit  # one column's 0.9, twice at its peak


def test_a_bomb_of_short_keys_is_refused_before_they_are_made() -> None:
    # 4 million one-letter keys inflate from 8 MB to 8 kB; as Python strings in a dict
    # they would take hundreds of MB. A count beyond what the file's size allows is refused.
    count = 4_000_000
    keys = zlib.compress(b"\0".join(b"%d" % (i % 10) for i in range(count)), 9)
    data = _file_with_namespace(_bomb_namespace(count=count, keys=keys))
    assert _peak(lambda: decode_file(data)) < 24 << 20


def test_a_bomb_in_one_block_costs_that_block_and_the_budget() -> None:
    from cache_helpers import join_file, split_file

    from unimatmul.cache import frames

    store_bytes = _valid_file_of(3 * codec.ENTRY_BLOCK)
    doc, parts = split_file(store_bytes)
    bomb = zlib.compress(b"\0" * (64 << 20), 9)
    k = next(i for i, p in enumerate(parts) if p[0] == frames.ENTRIES and p[2] == 2)
    parts[k] = (*parts[k][:3], bomb)  # the last entry block: what came before is read
    snapshot = decode_file(join_file(doc, parts))
    assert snapshot.count() == 2 * codec.ENTRY_BLOCK and snapshot.lost == codec.ENTRY_BLOCK
    assert any("limit" in line for line in snapshot.damage)


_OUT_OF_MEMORY = r"""
import resource, sys, warnings, zlib
sys.path.insert(0, sys.argv[2])
from cache_helpers import NS, key
from unimatmul.cache import file_store
reads = []
real = file_store.decode_file
file_store.decode_file = lambda *a, **k: reads.append(1) or real(*a, **k)
store = file_store.MsgpackFileStore(sys.argv[1], refresh_s=0.0)
def vm() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm() + (10 << 20), resource.RLIM_INFINITY))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = store.get(NS, key(0))
    again = [store.get(NS, key(i)) for i in range(1, 20)]  # every new shape is a miss
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(first, set(again), len(reads), [str(w.message) for w in caught])
"""


def test_running_out_of_memory_while_reading_is_a_broken_file_read_once(tmp_path: Path) -> None:
    import subprocess

    from cache_helpers import PYTHON

    path = tmp_path / "c.msgpack"
    # Under a tight address limit even the bounded inflation runs out of memory.
    path.write_bytes(_file_with_namespace(_bomb_namespace(rows=zlib.compress(b"\0" * (200 << 20), 9))))
    proc = subprocess.run(
        [PYTHON, "-c", _OUT_OF_MEMORY, str(path), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    first, again, reads, messages = proc.stdout.rsplit("\n", 2)[0].split(" ", 3)
    assert (first, again, reads) == ("None", "{None}", "1"), proc.stdout
    assert "out of memory" in messages or "limit" in messages


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


# --- damage: contained to a block, and kept aside before a write replaces it ---------------


def _entry_block_span(data: bytes, index: int) -> tuple[int, int]:
    """Where entry block ``index`` of the first namespace lies in a file's bytes."""
    from unimatmul.cache import frames

    body = msgpack.unpackb(data)["body"]
    body_at = data.index(body)
    pos = 0
    while True:
        _, kind, _, k, length = frames.HEAD.unpack_from(body, pos)
        end = pos + frames.HEAD_BYTES + length
        if kind == frames.ENTRIES and k == index:
            return body_at + pos, body_at + end
        pos = end


def test_a_flipped_bit_costs_one_block_and_the_damaged_file_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    n = 3 * codec.ENTRY_BLOCK
    data = bytearray(_valid_file(tmp_path, n))
    start, end = _entry_block_span(bytes(data), 1)
    data[(start + end) // 2] ^= 0x40  # one flipped bit in the middle block
    path.write_bytes(bytes(data))
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning) as caught:
        assert store.get(NS, key(0)) is not None  # first block: intact
        assert store.get(NS, key(n - 1)) is not None  # last block: intact
    message = str(caught[0].message)
    assert str(path) in message and "damaged" in message and f"{codec.ENTRY_BLOCK} entries lost" in message
    assert store.count() == n - codec.ENTRY_BLOCK
    assert path.read_bytes() == bytes(data) and not list(tmp_path.glob("c.msgpack.corrupt-*"))  # read only
    with pytest.warns(RuntimeWarning, match="kept as"):
        store.put(NS, key(10_000), record(key(10_000)))
    aside = list(tmp_path.glob("c.msgpack.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)
    assert MsgpackFileStore(path).count() == n - codec.ENTRY_BLOCK + 1


def test_a_truncated_file_keeps_its_intact_blocks(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    n = 3 * codec.ENTRY_BLOCK
    full = _valid_file(tmp_path, n)
    start, _ = _entry_block_span(full, 2)
    path.write_bytes(full[: start + 50])  # cut inside the last block: the copies at the end are gone
    with pytest.warns(RuntimeWarning, match="damaged"):
        assert MsgpackFileStore(path).count() == 2 * codec.ENTRY_BLOCK
    assert path.exists()


def test_an_unreadable_file_is_kept_aside_by_the_next_write_and_copies_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    for i in range(6):
        path.write_bytes(b"garbage %d" % i)
        notices.forget()
        with pytest.warns(RuntimeWarning):
            store = MsgpackFileStore(path)
            assert store.count() == 0
        assert path.read_bytes() == b"garbage %d" % i  # reading never moves it
        with pytest.warns(RuntimeWarning, match="kept as"):
            store.put(NS, key(i), record(key(i)))
        assert MsgpackFileStore(path).count() == 1
    kept = sorted(p.read_bytes() for p in tmp_path.glob("c.msgpack.corrupt-*"))
    assert kept == [b"garbage 3", b"garbage 4", b"garbage 5"]  # the newest, KEEP_CORRUPT of them
    assert store_module.KEEP_CORRUPT == 3


def test_tools_and_read_only_stores_leave_a_broken_file_in_place(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    path.write_bytes(b"\x93garbage")
    with pytest.warns(RuntimeWarning, match="left in place"):
        store = MsgpackFileStore(path, read_only=True)
        assert store.count() == 0
        store.put(NS, key(0), record(key(0)))
    assert main(["cache", "verify", "--cache", str(path)]) == 1
    assert path.read_bytes() == b"\x93garbage" and not list(tmp_path.glob("*.corrupt-*"))


def _rewrite_rows(data: bytes, edit: Any) -> bytes:
    """``data`` with the rows of each entry block passed through ``edit(keys, rows)``, the
    checksums made right again: a crafted file."""
    from cache_helpers import entry_block, entry_payload, join_file, split_file

    from unimatmul.cache import frames

    doc, parts = split_file(data)
    meta = msgpack.unpackb(next(p for k, _, _, p in parts if k == frames.META))
    out = []
    for kind, ns, index, payload in parts:
        if kind == frames.ENTRIES:
            n = min(meta["entry_block"], meta["entries"] - index * meta["entry_block"])
            keys, rows = entry_block(payload, n)
            payload = entry_payload(keys, edit(keys, rows))
        out.append((kind, ns, index, payload))
    return join_file(doc, out)


def test_one_malformed_entry_costs_only_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path)
    store.put(NS, key(0), record(key(0)))
    store.put(NS, key(1), record(key(1)))

    def crafted(keys: list[str], rows: list[bytes]) -> list[bytes]:
        # key(1)'s candidate list index points far outside the table.
        i = keys.index(key(1))
        rows[i] = rows[i][:21] + b"\xff\x7f" + rows[i][23:]
        return rows

    path.write_bytes(_rewrite_rows(path.read_bytes(), crafted))
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
    # Past the checksums: rows changed and the CRC recomputed, as a crafted file would.
    def mutate(keys: list[str], rows: list[bytes]) -> list[bytes]:
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, len(rows) - 1))
            row = bytearray(rows[i])
            row[data.draw(st.integers(0, len(row) - 1))] = data.draw(st.integers(0, 255))
            rows[i] = bytes(row)
        return rows

    assert _read_all(_rewrite_rows(valid_bytes, mutate)) == 12


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
