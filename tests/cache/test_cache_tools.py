"""The cache commands on read-only, broken and hostile files: clear messages, documented exit
codes, no traceback, and reading commands that never change a file."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cache_helpers import NS, PLATFORM, key, record

from unimatmul.cache import codec
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cli import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, main
from unimatmul.core import notices

TUNABLEOP_CSV = """Validator,PT_VERSION,2.6.0
Validator,ROCBLAS_VERSION,4.3.0-abc
Validator,HIPBLASLT_VERSION,800-def
Validator,ROCM_VERSION,6.3.0-x
Validator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-
GemmTunableOp_float_NT,nt_1024_2048_512,Gemm_Hipblaslt_1234,0.0254
GemmTunableOp_Half_TN,tn_4096_4096_4096,Gemm_Rocblas_55,1.3
"""


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    notices.forget()


def _fill(path: Path, n: int = 6) -> None:
    store = MsgpackFileStore(path, autoflush=0)
    store.note_platform(NS, PLATFORM)
    with store.batch():
        for i in range(n):
            store.put(NS, key(i), record(key(i), 1e-3 * (i + 1)))


def _folder_state(folder: Path) -> dict[str, str]:
    """Every file in a folder with its content hash: what "never changes a file" compares."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.iterdir())
    }


# --- writing commands on a read-only cache: a clear message and exit 1 -----------------


def test_prune_and_merge_respect_the_read_only_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.msgpack"
    other = tmp_path / "other.msgpack"
    _fill(path)
    _fill(other, 2)
    before = _folder_state(tmp_path)
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    capsys.readouterr()
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "0"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "UNIMATMUL_CACHE_READONLY" in err and str(path) in err
    assert main(["cache", "merge", str(other), "-o", str(path)]) == EXIT_ERROR
    assert "UNIMATMUL_CACHE_READONLY" in capsys.readouterr().err
    assert main(["cache", "recover", str(other), "--cache", str(path)]) == EXIT_ERROR
    assert "UNIMATMUL_CACHE_READONLY" in capsys.readouterr().err
    # A dry run changes nothing, so it may run.
    assert main(["cache", "prune", "--cache", str(path), "--older-than", "0", "--dry-run"]) == EXIT_OK
    assert "would remove 6 entries" in capsys.readouterr().out
    assert _folder_state(tmp_path) == before


def test_import_into_a_cache_that_cannot_be_written_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    csv = tmp_path / "tunableop.csv"
    csv.write_text(TUNABLEOP_CSV)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    cache = blocker / "c.msgpack"
    args = ["cache", "import", "tunableop", str(csv), "--cache", str(cache), "--namespace", NS]
    assert main(args) == EXIT_ERROR
    captured = capsys.readouterr()
    assert "imported" not in captured.out and "cannot write" in captured.err and str(cache) in captured.err

    path = tmp_path / "c.msgpack"
    _fill(path, 1)
    before = path.read_bytes()
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    args = ["cache", "import", "tunableop", str(csv), "--cache", str(path), "--namespace", NS]
    assert main(args) == EXIT_ERROR
    captured = capsys.readouterr()
    assert "imported" not in captured.out and "UNIMATMUL_CACHE_READONLY" in captured.err
    assert path.read_bytes() == before
    monkeypatch.delenv("UNIMATMUL_CACHE_READONLY")
    assert main(args) == EXIT_OK
    assert "imported 2 entries" in capsys.readouterr().out
    assert read_file(path).count() == 3


def test_an_export_that_cannot_be_written_exits_like_every_failed_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.msgpack"
    _fill(path, 1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = str(blocker / "out.json")
    assert main(["cache", "export", "--cache", str(path), "--format", "json", "-o", out]) == EXIT_ERROR
    assert "cannot write" in capsys.readouterr().err


def test_flush_says_whether_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.cache.errors import CacheWriteError

    path = tmp_path / "c.msgpack"
    store = MsgpackFileStore(path, autoflush=0)
    assert store.flush(strict=True)  # nothing pending: nothing to say
    store.put(NS, key(0), record(key(0)))
    assert store.flush(strict=True) and read_file(path).count() == 1
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    ro = MsgpackFileStore(path, autoflush=0)
    ro.put(NS, key(1), record(key(1)))
    with pytest.raises(CacheWriteError, match="UNIMATMUL_CACHE_READONLY") as caught:
        ro.flush(strict=True)
    assert caught.value.path == str(path)
    assert ro.get(NS, key(1)) is not None  # kept in this process
    ro.put(NS, key(2), record(key(2)))
    with pytest.warns(RuntimeWarning, match="read-only"):
        assert ro.flush() is False
    assert read_file(path).count() == 1
    # A put of the default store (autoflush=1) is refused at once; a strict flush later
    # still says that something was not written: what `unimatmul tune` needs to know.
    notices.forget()
    tuned = MsgpackFileStore(path)
    with pytest.warns(RuntimeWarning, match="read-only"):
        tuned.put(NS, key(3), record(key(3)))
    assert tuned.pending == 0 and tuned.unwritten == 1
    with pytest.raises(CacheWriteError, match="1 changes kept in this process only"):
        tuned.flush(strict=True)


# --- reading commands never change a file ----------------------------------------------

READING_COMMANDS: list[list[str]] = [
    ["cache", "show"],
    ["cache", "show", "--json"],
    ["cache", "stats"],
    ["cache", "stats", "--json"],
    ["cache", "stats", "--validate"],
    ["cache", "verify"],
    ["cache", "verify", "--json"],
    ["cache", "export", "--format", "json", "-o", "-"],
    ["cache", "prune", "--older-than", "0", "--dry-run"],
    ["cache", "prune", "--bad", "--dry-run"],
    ["info"],
]


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x85garbage that is no cache file at all")


def _flipped(path: Path) -> None:
    """A file of three blocks of entries with one bit flipped in the middle one."""
    _fill(path, 3 * codec.ENTRY_BLOCK)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_garbage, _flipped], ids=["garbage", "flipped-bit"])
def test_reading_commands_never_change_a_broken_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    damage: Callable[[Path], None],
) -> None:
    path = tmp_path / "c.msgpack"
    damage(path)
    monkeypatch.setenv("UNIMATMUL_CACHE", str(path))
    before = _folder_state(tmp_path)
    for command in READING_COMMANDS:
        notices.forget()
        code = main([*command, *(["--cache", str(path)] if command[0] == "cache" else [])])
        assert code in (EXIT_OK, EXIT_ERROR, EXIT_UNAVAILABLE), command
        assert _folder_state(tmp_path) == before, command
    capsys.readouterr()


# --- hostile fields: every field read from a file is validated --------------------------


def _schema2(body: dict[str, Any], header: dict[str, Any] | None = None) -> bytes:
    packed = msgpack.packb(body, use_bin_type=True)
    doc = {
        "format": codec.FORMAT,
        "schema": 2,
        "header": header or {},
        "crc32": zlib.crc32(packed),
        "body": packed,
    }
    return msgpack.packb(doc, use_bin_type=True)


def _good_body() -> dict[str, Any]:
    legacy = Path(__file__).parent / "data" / "schema2.msgpack"
    return msgpack.unpackb(msgpack.unpackb(legacy.read_bytes())["body"])


def _hostile_files(tmp_path: Path) -> dict[str, bytes]:
    body = _good_body()
    ns_value = body[NS]
    files = {
        "created 1e300": _schema2(body, {"created": 1e300, "updated": float("nan"), "writer": 7}),
        "header not a map": _schema2(body, None).replace(b"\xa6header\x80", b"\xa6header\x01"),
        "bin namespace": _schema2({**body, b"bin-namespace": ns_value}),
        "libraries a string": _schema2(
            {**body, NS: {**ns_value, "platform": {**PLATFORM, "libraries": "x"}}}
        ),
        "cores a string": _schema2({**body, NS: {**ns_value, "platform": {**PLATFORM, "cores": "two"}}}),
        "schema 1 bin key": msgpack.packb(
            {
                "format": codec.FORMAT,
                "schema": 1,
                "header": {"created": -1e308},
                "namespaces": {NS: {key(0): record(key(0)).to_dict(), b"bin-key": record(key(1)).to_dict()}},
            },
            use_bin_type=True,
        ),
        "schema 1 bin namespace": msgpack.packb(
            {
                "format": codec.FORMAT,
                "schema": 1,
                "header": {},
                "namespaces": {
                    NS: {key(0): record(key(0)).to_dict()},
                    b"bin": {key(1): record(key(1)).to_dict()},
                },
            },
            use_bin_type=True,
        ),
        "schema 1 tuned in the year 1e300": msgpack.packb(
            {
                "format": codec.FORMAT,
                "schema": 1,
                "header": {},
                "namespaces": {NS: {key(0): {**record(key(0)).to_dict(), "tuned_at": 1e300}}},
            },
            use_bin_type=True,
        ),
    }
    return files


@pytest.mark.parametrize(
    "name",
    [
        "created 1e300",
        "header not a map",
        "bin namespace",
        "libraries a string",
        "cores a string",
        "schema 1 bin key",
        "schema 1 bin namespace",
        "schema 1 tuned in the year 1e300",
    ],
)
def test_hostile_fields_never_crash_a_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "c.msgpack"
    path.write_bytes(_hostile_files(tmp_path)[name])
    monkeypatch.setenv("UNIMATMUL_CACHE", str(path))
    for command in [*READING_COMMANDS, ["cache", "prune", "--bad"], ["cache", "prune", "--older-than", "0"]]:
        notices.forget()
        code = main([*command, *(["--cache", str(path)] if command[0] == "cache" else [])])
        assert code in (EXIT_OK, EXIT_ERROR, EXIT_UNAVAILABLE), command
    capsys.readouterr()


def test_a_hostile_header_is_cleaned_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "c.msgpack"
    path.write_bytes(_hostile_files(tmp_path)["created 1e300"])
    snapshot = read_file(path)
    assert snapshot.header == {}
    assert any("header" in p for p in snapshot.problems)
    assert snapshot.count() == 41  # the entries themselves are fine
    path.write_bytes(_hostile_files(tmp_path)["libraries a string"])
    store = MsgpackFileStore(path)
    assert "libraries" not in store.namespaces()[NS]
    assert store.namespaces()[NS]["vendor"] == "cpu"


# --- prune --bad and recover on damaged files --------------------------------------------


def test_prune_bad_on_an_unreadable_file_leaves_it_and_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.msgpack"
    _garbage(path)
    before = _folder_state(tmp_path)
    capsys.readouterr()
    assert main(["cache", "prune", "--cache", str(path), "--bad", "--dry-run"]) == EXIT_UNAVAILABLE
    assert "cannot be read" in capsys.readouterr().err
    assert main(["cache", "prune", "--cache", str(path), "--bad"]) == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "cannot be read" in err and "left in place" in err and "cache recover" in err
    assert _folder_state(tmp_path) == before


def test_prune_bad_on_a_damaged_file_keeps_a_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.msgpack"
    _flipped(path)
    damaged = path.read_bytes()
    readable = read_file(path).count()
    capsys.readouterr()
    assert main(["cache", "prune", "--cache", str(path), "--bad"]) == EXIT_OK
    out = capsys.readouterr().out
    copies = list(tmp_path.glob("c.msgpack.corrupt-*"))
    assert len(copies) == 1 and copies[0].read_bytes() == damaged
    assert str(copies[0]) in out
    assert read_file(path).count() == readable


def test_recover_salvages_the_readable_entries_of_a_damaged_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "old.msgpack"
    _flipped(damaged)
    salvageable = read_file(damaged).count()
    assert 2 * codec.ENTRY_BLOCK <= salvageable < 3 * codec.ENTRY_BLOCK
    cache = tmp_path / "c.msgpack"
    MsgpackFileStore(cache).put(NS, key(500), record(key(500)))
    capsys.readouterr()
    assert main(["cache", "recover", str(damaged), "--cache", str(cache)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"recovered {salvageable} entries" in out
    assert read_file(cache).count() == salvageable + 1
    assert damaged.exists()  # the damaged copy is left as it is
    assert main(["cache", "recover", str(tmp_path / "missing"), "--cache", str(cache)]) == EXIT_UNAVAILABLE


def test_recover_unverified_reads_a_schema_2_file_whose_checksum_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    legacy = Path(__file__).parent / "data" / "schema2.msgpack"
    doc = msgpack.unpackb(legacy.read_bytes())
    damaged = tmp_path / "old.msgpack"
    damaged.write_bytes(msgpack.packb({**doc, "crc32": doc["crc32"] ^ 1}, use_bin_type=True))
    cache = tmp_path / "c.msgpack"
    assert main(["cache", "recover", str(damaged), "--cache", str(cache)]) == EXIT_UNAVAILABLE
    assert "CRC-32" in capsys.readouterr().err and not cache.exists()
    assert main(["cache", "recover", str(damaged), "--cache", str(cache), "--unverified"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "recovered 41 entries" in out and "could not be verified" in out
    assert read_file(cache).count() == 41
