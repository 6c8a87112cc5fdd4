"""Schema 3: damage costs at most the entries it touches; older files are read; older readers
refuse a schema 3 file without moving or overwriting it."""

from __future__ import annotations

import random
import shutil
import warnings
from pathlib import Path

import msgpack
import pytest
from cache_helpers import NS, PLATFORM, key, record

from unimatmul.cache import codec, frames, safe_msgpack
from unimatmul.cache.codec import CacheFileError, decode_file, iter_records
from unimatmul.cache.errors import BadEntry
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cache.record import TuningRecord

LEGACY = Path(__file__).parent / "data" / "schema2.msgpack"
# What the schema 2 fixture held when it was written (cache verify printed it then).
LEGACY_DIGEST = "e3b239aaa763cbf1f13fb7fd7d4b680720fe47ba7644d1491c8a975f40213efc"


def _file(tmp_path: Path, n: int) -> tuple[bytes, dict[str, TuningRecord]]:
    path = tmp_path / "whole.msgpack"
    records = {key(i): record(key(i), 1e-3 * (1 + i % 17), tuned_at=1.7e9 + i) for i in range(n)}
    store = MsgpackFileStore(path, autoflush=0)
    store.note_platform(NS, PLATFORM)
    with store.batch():
        for k, r in records.items():
            store.put(NS, k, r)
    data = path.read_bytes()
    decoded = _readable(data)  # as the file holds them (candidate times rounded)
    assert len(decoded) == n
    return data, decoded


def _readable(data: bytes) -> dict[str, TuningRecord]:
    """Every entry that can be read from ``data`` (nothing if the file cannot be read)."""
    try:
        snapshot = decode_file(data)
    except CacheFileError:
        return {}
    return {k: r for ns, k, r in iter_records(snapshot) if ns == NS and not isinstance(r, BadEntry)}


def test_a_schema_2_file_is_read_and_rewritten_with_the_same_content(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    shutil.copy(LEGACY, path)
    old = read_file(path)
    assert old.schema == 2 and old.count() == 41
    assert codec.content_digest(old) == LEGACY_DIGEST
    store = MsgpackFileStore(path)
    store.put(NS, key(41), record(key(41)))
    store.delete(NS, key(41))
    new = read_file(path)
    assert new.schema == codec.SCHEMA == 4
    # The checksum that pins a deployed cache survives the format change.
    assert codec.content_digest(new) == LEGACY_DIGEST
    assert new.namespaces[NS].platform == PLATFORM


def test_a_schema_2_reader_refuses_a_schema_3_file_and_never_touches_it(tmp_path: Path) -> None:
    # The checks a schema 2 reader (unimatmul before this format) makes, in its order:
    # pre-scan and unpack the whole document with its limits, then the format marker,
    # then "schema > 2 and compat > 2" -> NewerSchemaError: read-only, never moved aside.
    data, _ = _file(tmp_path, 3 * codec.ENTRY_BLOCK)
    doc = safe_msgpack.unpack(data, max_objects=100_000)
    assert doc["format"] == "unimatmul-cache" and isinstance(doc["header"], dict)
    assert doc["schema"] == 4 and doc["compat"] == 3


def test_every_single_bit_flip_costs_at_most_one_block_and_never_a_wrong_entry(tmp_path: Path) -> None:
    n = 3 * codec.ENTRY_BLOCK + 17
    data, want = _file(tmp_path, n)
    rng = random.Random(3)
    positions = sorted(rng.sample(range(len(data)), 600))
    worst = 0
    for pos in positions:
        damaged = bytearray(data)
        damaged[pos] ^= 1 << rng.randrange(8)
        got = _readable(bytes(damaged))
        worst = max(worst, n - len(got))
        for k, r in got.items():
            assert r == want[k], (pos, k)  # an entry is read right or not at all
    assert worst <= codec.ENTRY_BLOCK


def test_a_lost_table_block_costs_only_the_entries_that_use_it(tmp_path: Path) -> None:
    from cache_helpers import join_file, split_file

    from unimatmul.cache import frames

    data, want = _file(tmp_path, 40)
    doc, parts = split_file(data)
    # Both copies of the strings block gone: every entry uses a string of it.
    without = [p for p in parts if p[0] != frames.STRINGS]
    snapshot = decode_file(join_file(doc, without))
    assert any("strings block 0 is lost" in line for line in snapshot.damage)
    assert all(isinstance(r, BadEntry) for _, _, r in iter_records(snapshot))
    # One copy is enough.
    first_copy_only = [p for i, p in enumerate(parts) if p[0] != frames.STRINGS or i < len(parts) // 2]
    assert _readable(join_file(doc, first_copy_only)) == want


def test_writing_over_lost_tables_reencodes_what_can_be_read(tmp_path: Path) -> None:
    from cache_helpers import join_file, split_file

    from unimatmul.cache import frames

    data, _ = _file(tmp_path, 10)
    doc, parts = split_file(data)
    path = tmp_path / "c.msgpack"
    path.write_bytes(join_file(doc, [p for p in parts if p[0] != frames.LISTS]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = MsgpackFileStore(path)
        store.put(NS, key(99), record(key(99)))
    # The rows whose lists were lost are not copied into the new tables (their indices
    # would point at other lists): the new file holds the new entry, right.
    snapshot = read_file(path)
    assert not snapshot.damage
    assert [k for _, k, r in iter_records(snapshot) if not isinstance(r, BadEntry)] == [key(99)]
    assert len(list(tmp_path.glob("c.msgpack.corrupt-*"))) == 1


def test_frames_of_an_unknown_kind_are_skipped(tmp_path: Path) -> None:
    from cache_helpers import join_file, split_file

    data, _ = _file(tmp_path, 20)
    doc, parts = split_file(data)
    parts.insert(1, (77, 0, 0, b"what a later writer adds"))
    snapshot = decode_file(join_file({**doc, "schema": 5}, parts))
    assert not snapshot.damage and snapshot.count() == 20


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_a_truncated_file_keeps_what_lies_before_the_cut(tmp_path: Path, cut: float) -> None:
    data, want = _file(tmp_path, 4 * codec.ENTRY_BLOCK)
    got = _readable(data[: int(len(data) * cut)])
    assert all(got[k] == want[k] for k in got)
    assert len(got) >= int(cut * 4) * codec.ENTRY_BLOCK - codec.ENTRY_BLOCK


def test_the_top_level_damaged_into_another_schema_still_finds_the_blocks(tmp_path: Path) -> None:
    data, want = _file(tmp_path, 30)
    for schema in (1, 2, 0):
        doc = msgpack.unpackb(data)
        changed = msgpack.packb({**doc, "schema": schema}, use_bin_type=True)
        snapshot = decode_file(changed)
        assert snapshot.damage and "outer structure" in snapshot.damage[0]
        assert _readable(changed) == want


# --- what honest growth makes, and what this reader cannot describe ----------------------


def test_a_description_of_over_100000_objects_reads_whole_and_keeps_every_entry(tmp_path: Path) -> None:
    # What an earlier writer made of records whose load and noise figures differed: one
    # settings map each in the description. The reader's limit follows the description's
    # own size, so the file is read whole; a write keeps everything, and the maps are
    # re-interned as shapes (the values go into the rows).
    from cache_helpers import join_file, split_file

    data, want = _file(tmp_path, 40)
    doc, parts = split_file(data)
    for i, (kind, ns, index, payload) in enumerate(parts):
        if kind == frames.META:
            meta = msgpack.unpackb(payload)
            meta["maps"] += [
                {"load": {"avg1": 1.0 + j / 100, "cpus": 2}, "noise": j / 1e4} for j in range(20_000)
            ]
            parts[i] = (kind, ns, index, msgpack.packb(meta, use_bin_type=True))
    big = join_file(doc, parts)
    assert _readable(big) == want
    path = tmp_path / "grown.msgpack"
    path.write_bytes(big)
    # Such a file kept aside by an earlier writer: recover reads back every entry.
    from unimatmul.cli import main

    fresh = tmp_path / "fresh.msgpack"
    assert main(["cache", "recover", str(path), "--cache", str(fresh)]) == 0
    assert _readable(fresh.read_bytes()) == want
    store = MsgpackFileStore(path)
    store.put(NS, key(99), record(key(99)))
    assert store.flush()
    again = read_file(path)
    assert not again.damage and again.count() == 41
    assert len(again.namespaces[NS].tables.maps) < 10  # rewritten once: shapes
    assert {k: r for k, r in _readable(path.read_bytes()).items() if k != key(99)} == want
    assert not list(tmp_path.glob("grown.msgpack.corrupt-*"))


def test_a_namespace_this_reader_cannot_describe_is_carried_byte_for_byte(tmp_path: Path) -> None:
    from cache_helpers import join_file, split_file

    data, want = _file(tmp_path, 20)
    doc, parts = split_file(data)
    # A second namespace whose description (both copies) this reader refuses, intact
    # past its checksums: a newer writer's, or one over a limit.
    foreign = [(kind, 7, index, payload) for kind, ns, index, payload in parts]
    for i, (kind, ns, index, payload) in enumerate(foreign):
        if kind == frames.META:
            meta = msgpack.unpackb(payload)
            meta["entries"] = "twenty"
            foreign[i] = (kind, ns, index, msgpack.packb(meta, use_bin_type=True))
    path = tmp_path / "c.msgpack"
    path.write_bytes(join_file(doc, parts + foreign))
    carried = {frames.pack(*part) for part in foreign}
    snapshot = read_file(path)
    assert snapshot.unread and not snapshot.damaged and snapshot.count() == 20
    store = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning, match="cannot be read"):
        store.put(NS, key(50), record(key(50)))
    assert store.flush()
    body = msgpack.unpackb(path.read_bytes())["body"]
    assert all(frame in body for frame in carried)  # every one of its frames, as it was
    assert _readable(path.read_bytes()) == want | {key(50): _readable(path.read_bytes())[key(50)]}
    # Prune and merge keep them too.
    from unimatmul.cli import main

    assert main(["cache", "verify", "--cache", str(path)]) == 1  # what it cannot read, it says
    assert main(["cache", "prune", "--older-than", "1e9", "--cache", str(path)]) == 0
    assert main(["cache", "merge", str(path), "-o", str(path)]) == 0
    body = msgpack.unpackb(path.read_bytes())["body"]
    assert all(frame in body for frame in carried)
    assert not list(tmp_path.glob("c.msgpack.corrupt-*"))
