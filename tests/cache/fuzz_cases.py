"""Mutated cache files, and what must hold for each: no traceback, no hang, and no entry lost
that was readable (imported by test_cache_fuzz.py; ``python tests/cache/fuzz_cases.py N``
runs N files and prints a summary).

Mutations are of two kinds: bytes changed as a disk or a copy would change them (bits
flipped, bytes set, zeroed, cut, inserted, deleted, duplicated), and crafted files that
stay valid past every checksum (a field of the header, a namespace's description, a row
or a table changed, the checksums computed again), as a hostile file would.
"""

from __future__ import annotations

import contextlib
import io
import random
import signal
import sys
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).parent))
from cache_helpers import NS, PLATFORM, join_file, key, record, split_file

from unimatmul.cache import codec, frames
from unimatmul.cache.codec import CacheFileError, decode_file, iter_records
from unimatmul.cache.columns import Tables
from unimatmul.cache.errors import BadEntry
from unimatmul.cache.file_store import MsgpackFileStore, kept_copies
from unimatmul.cache.record import TuningRecord
from unimatmul.cache.rows import decode_row, encode_row
from unimatmul.core import notices

OTHER = "nvidia/sm_90/NVIDIA H200/132/torch"
HOSTILE_VALUES: list[Any] = [
    1e300, -1e308, float("nan"), float("inf"), -1, 2**63, True, None, "", "x" * 5000, b"bin",
    [], {}, [1, [2, [3]]], {"a": {"b": 1}}, {b"k": 1}, 0,
]  # fmt: skip
SECONDS_PER_CASE = 20  # a case that takes longer has hung


def base_files(folder: Path) -> dict[str, bytes]:
    """The files the mutations start from: schema 3 of several blocks and two
    namespaces, the committed schema 2 file, and a schema 1 file."""
    path = folder / "base3.msgpack"
    store = MsgpackFileStore(path, autoflush=0)
    store.note_platform(NS, PLATFORM)
    # Small blocks (a reader takes the sizes from the file): many frames in a small file,
    # so that every kind of frame is hit often and a case costs milliseconds.
    sizes = codec.ENTRY_BLOCK, codec.TABLE_BLOCK
    codec.ENTRY_BLOCK, codec.TABLE_BLOCK = 8, 4
    try:
        with store.batch():
            for i in range(37):
                store.put(NS, key(i), record(key(i), 1e-3 * (1 + i % 7), tuned_at=1.7e9 + i))
            for i in range(5):
                store.put(OTHER, key(i), record(key(i), 2e-5, winner="default/default"))
    finally:
        codec.ENTRY_BLOCK, codec.TABLE_BLOCK = sizes
    v1 = {
        "format": codec.FORMAT,
        "schema": 1,
        "header": {"writer": "unimatmul 0.0.1", "created": 1.0, "updated": 2.0},
        "namespaces": {NS: {key(i): record(key(i)).to_dict() for i in range(6)}},
    }
    return {
        "schema3": path.read_bytes(),
        "schema2": (Path(__file__).parent / "data" / "schema2.msgpack").read_bytes(),
        "schema1": msgpack.packb(v1, use_bin_type=True),
    }


# --- mutations ------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    blob = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        if not blob:
            break
        at = rng.randrange(len(blob))
        kind = rng.choice(["flip", "flip", "set", "zero", "cut", "insert", "delete", "duplicate"])
        if kind == "flip":
            blob[at] ^= 1 << rng.randrange(8)
        elif kind == "set":
            blob[at] = rng.randrange(256)
        elif kind == "zero":  # what some file systems leave after a crash
            size = min(len(blob) - at, rng.choice([1, 8, 512, 4096]))
            blob[at : at + size] = bytes(size)
        elif kind == "cut":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = rng.randbytes(rng.randint(1, 32))
        elif kind == "delete":
            del blob[at : at + rng.randint(1, 64)]
        else:
            size = rng.randint(1, 256)
            blob[at:at] = blob[at : at + size]
    return bytes(blob)


def craft(data: bytes, rng: random.Random) -> bytes:
    """A file changed past its checksums (schema 3) or with its CRC recomputed (schema 2)."""
    doc = msgpack.unpackb(data, strict_map_key=False)
    if rng.random() < 0.3:
        header = dict(doc.get("header", {}))
        header[rng.choice(["created", "updated", "writer", "entries", "other"])] = rng.choice(HOSTILE_VALUES)
        doc["header"] = header if rng.random() < 0.9 else rng.choice(HOSTILE_VALUES)
        return msgpack.packb(doc, use_bin_type=True)
    if doc.get("schema") in (3, 4):
        _, parts = split_file(data)
        i = rng.randrange(len(parts))
        kind, ns, index, payload = parts[i]
        if kind == frames.META:
            meta = msgpack.unpackb(payload, strict_map_key=False)
            field = rng.choice(["name", "platform", "maps", "strings", "lists", "entries", "table_block",
                                "entry_block", "extra"])  # fmt: skip
            if field == "maps" and rng.random() < 0.05:
                # Honest growth past any fixed count (an earlier writer's map a record):
                # over 100,000 objects, within what the description's size allows.
                grown = [{"load": {"avg1": j / 100, "cpus": 2}, "noise": j / 1e4} for j in range(12_000)]
                meta["maps"] = list(meta["maps"]) + grown
            elif field == "platform" and rng.random() < 0.7:
                meta["platform"] = {
                    **meta["platform"],
                    rng.choice([*PLATFORM, "libraries"]): rng.choice(HOSTILE_VALUES),
                }
            else:
                meta[field] = rng.choice(HOSTILE_VALUES)
            payload = msgpack.packb(meta, use_bin_type=True)
        else:
            inflated = bytearray(zlib.decompress(payload))
            for _ in range(rng.randint(1, 4)):
                if inflated:
                    inflated[rng.randrange(len(inflated))] = rng.randrange(256)
            payload = zlib.compress(bytes(inflated))
        parts[i] = (kind, ns if rng.random() < 0.95 else rng.randrange(4), index, payload)
        return join_file(doc, parts)
    if doc.get("schema") == 2:
        body = msgpack.unpackb(doc["body"], strict_map_key=False)
        name = rng.choice(list(body))
        ns = dict(body[name])
        field = rng.choice([*ns, "platform"])
        if isinstance(ns.get(field), bytes) and rng.random() < 0.7:
            inflated = bytearray(zlib.decompress(ns[field]))
            if inflated:
                inflated[rng.randrange(len(inflated))] = rng.randrange(256)
            ns[field] = zlib.compress(bytes(inflated))
        else:
            ns[field] = rng.choice(HOSTILE_VALUES)
        body[name if rng.random() < 0.8 else name.encode()] = ns
        doc["body"] = msgpack.packb(body, use_bin_type=True)
        doc["crc32"] = zlib.crc32(doc["body"])
        return msgpack.packb(doc, use_bin_type=True)
    namespaces = doc["namespaces"]
    name = next(iter(namespaces))
    entries = namespaces[name]
    k = rng.choice(list(entries))
    entry = dict(entries[k])
    entry[rng.choice(list(entry))] = rng.choice(HOSTILE_VALUES)
    entries[k if rng.random() < 0.8 else k.encode()] = entry
    return msgpack.packb(doc, use_bin_type=True)


def cases(count: int, folder: Path, seed: int = 18) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    bases = base_files(folder)
    names = list(bases)
    for i in range(count):
        name = names[i % len(names)] if i % 4 else "schema3"
        kind = "crafted" if rng.random() < 0.35 else "bytes"
        data = craft(bases[name], rng) if kind == "crafted" else mutate_bytes(bases[name], rng)
        yield f"{name}/{kind}/{i}", data


# --- what must hold -------------------------------------------------------------------------


def readable(data: bytes) -> tuple[dict[tuple[str, str], TuningRecord], bool]:
    """Every entry a reader gets from ``data``, and whether anything of it was lost. Only a
    refusal may come out of the reader."""
    try:
        snapshot = decode_file(data)
    except CacheFileError:
        return {}, True
    found = {(ns, k): r for ns, k, r in iter_records(snapshot) if not isinstance(r, BadEntry)}
    return found, snapshot.damaged


def _carried(data: bytes) -> list[bytes]:
    """The intact frames a reader could not use, which every rewrite must keep as they are."""
    try:
        return [frame for _, frame in decode_file(data).carried]
    except CacheFileError:
        return []


def _deadline(seconds: int) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        def hung(*_: object) -> None:
            msg = f"no answer within {seconds} s"
            raise TimeoutError(msg)

        old = signal.signal(signal.SIGALRM, hung)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)

    return guard()


READING = [["stats"], ["stats", "--json"], ["show", "--json"], ["verify"], ["prune", "--bad", "--dry-run"]]


def check(name: str, data: bytes, folder: Path, *, commands: bool) -> str:
    """Run one mutated file through the reader, a store and (``commands``) the cache
    commands; raises AssertionError if anything readable was lost. Returns the outcome."""
    from unimatmul.cli import main

    path = folder / "c.msgpack"
    for leftover in folder.iterdir():
        leftover.unlink()
    path.write_bytes(data)
    with _deadline(SECONDS_PER_CASE), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        notices.forget()
        before, damaged = readable(data)
        carried = _carried(data)
        if commands:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                for command in READING:
                    code = main(["cache", *command, "--cache", str(path)])
                    assert code in (0, 1, 3), (name, command, code)
            assert path.read_bytes() == data, f"{name}: a reading command changed the file"
        store = MsgpackFileStore(path)
        store.count()
        store.get(NS, key(0))
        store.put(NS, key(10_000), record(key(10_000)))
        wrote = store.flush()
        after, _ = readable(path.read_bytes())
        if not wrote:
            assert path.read_bytes() == data, f"{name}: a store that did not write changed the file"
            return "left (read-only)"
        lost = [k for k, r in before.items() if not same(after.get(k), r)]
        assert not lost, f"{name}: {len(lost)} readable entries lost, e.g. {lost[0]}"
        assert (NS, key(10_000)) in after
        written = path.read_bytes()
        assert all(frame in written for frame in carried), f"{name}: a frame it could not read was dropped"
        if damaged:
            copies = kept_copies(path)
            assert copies and copies[-1].read_bytes() == data, f"{name}: no copy of the damaged file"
        if commands:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert main(["cache", "prune", "--bad", "--cache", str(path)]) in (0, 3)
            pruned, _ = readable(path.read_bytes())
            assert all(same(pruned.get(k), r) for k, r in before.items()), f"{name}: prune --bad lost entries"
        return "kept a copy" if damaged else "read whole"


def same(got: TuningRecord | None, want: TuningRecord) -> bool:
    """Equal to ``want`` as schema 3 stores it (an older file's exact candidate times are
    rounded when it is rewritten: docs/cache-format.md, "Precision"); NaN equals NaN."""
    if got is None:
        return False
    if got == want:
        return True
    tables = Tables()
    stored = decode_row(want.problem, encode_row(want.problem, want, tables), tables)
    return repr(got.to_dict()) == repr(stored.to_dict())


def fast_folder() -> str | None:
    """A memory file system where there is one: each case writes and fsyncs a file, which
    on a disk costs more than everything else the case does."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def run(
    count: int, folder: Path, *, commands_every: int = 25, report: Callable[[str], None] | None = None
) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    work = folder / "work"
    work.mkdir(exist_ok=True)
    for i, (name, data) in enumerate(cases(count, folder)):
        outcomes[check(name, data, work, commands=i % commands_every == 0)] += 1
        if report is not None and (i + 1) % 1000 == 0:
            report(f"{i + 1} files: {dict(outcomes)}")
    return outcomes


if __name__ == "__main__":
    import tempfile

    total = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=fast_folder()) as tmp:
        result = run(total, Path(tmp), report=print)
    print(f"{total} mutated files in {time.monotonic() - started:.1f} s: {dict(result)}")
