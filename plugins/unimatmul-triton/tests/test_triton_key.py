"""Triton's key kept between processes: the same value as Triton's, hashed once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unimatmul_triton import triton_key as tk

pytest.importorskip("triton")


def _fake_triton(root: Path) -> Path:
    (root / "runtime").mkdir(parents=True)
    (root / "runtime" / "cache.py").write_text("x = 1\n")
    for folder in tk.HASHED_FOLDERS:
        (root / folder).mkdir()
        (root / folder / "a.py").write_text(f"# {folder}\n")
    (root / "_C" / "libtriton.so").write_bytes(b"\x7fELF" + bytes(range(256)) * 8)
    (root / "tools").mkdir()
    (root / "tools" / "other.py").write_text("y = 2\n")
    return root


def test_fingerprint_follows_the_hashed_files_only(tmp_path: Path) -> None:
    root = _fake_triton(tmp_path / "triton")
    first = tk.fingerprint(root)
    assert tk.fingerprint(root) == first
    (root / "tools" / "other.py").write_text("y = 3\n")  # not a file triton_key hashes
    assert tk.fingerprint(root) == first
    lib = root / "_C" / "libtriton.so"
    st = lib.stat()
    lib.write_bytes(lib.read_bytes()[:-1] + b"\x00")  # same size: the change time moves
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime put back
    second = tk.fingerprint(root)
    assert second != first
    (root / "language" / "b.py").write_text("z = 1\n")  # a new module
    assert tk.fingerprint(root) != second


def test_kept_key_is_computed_once_and_checked_by_version(tmp_path: Path) -> None:
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return "3.6.0" + "ab" * 40

    path = tmp_path / "keys" / "k.key"
    assert tk.kept_key(compute, path, "3.6.0") == "3.6.0" + "ab" * 40
    assert path.read_text() == "3.6.0" + "ab" * 40 + "\n"
    assert tk.kept_key(compute, path, "3.6.0") == "3.6.0" + "ab" * 40
    assert len(calls) == 1
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]
    # a file of another version, or cut short, is not trusted: Triton's key is computed again
    path.write_text("3.5.1" + "cd" * 40 + "\n")
    assert tk.kept_key(compute, path, "3.6.0") == "3.6.0" + "ab" * 40
    path.write_text("3.6.0" + "ab" * 10)
    assert tk.kept_key(compute, path, "3.6.0") == "3.6.0" + "ab" * 40
    assert len(calls) == 3
    assert path.read_text().endswith("\n")


def test_kept_key_where_nothing_can_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert tk.kept_key(lambda: "3.6.0key", blocker / "k.key", "3.6.0") == "3.6.0key"


_PROBE = """
import json, sys
from triton.runtime import cache
original = cache.triton_key
from unimatmul_triton import triton_key as tk
installed = tk.install()
key = cache.triton_key()
same = key == (original() if sys.argv[1] == "compare" else key)
print(json.dumps({"installed": installed, "same": same, "len": len(key), "replaced": cache.triton_key is not original}))
"""


def _probe(tmp_path: Path, mode: str, **env: str) -> dict[str, object]:
    run_env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), **env}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_installed_key_is_tritons_own_and_kept_for_the_next_process(tmp_path: Path) -> None:
    first = _probe(tmp_path, "compare")
    assert first == {"installed": True, "same": True, "len": first["len"], "replaced": True}
    kept = list((tmp_path / "unimatmul" / "triton-key").glob("*.key"))
    assert len(kept) == 1
    # the next process reads the kept key, and it is still Triton's own
    assert _probe(tmp_path, "compare")["same"] is True
    assert list((tmp_path / "unimatmul" / "triton-key").glob("*.key")) == kept


def test_memo_off_leaves_tritons_function(tmp_path: Path) -> None:
    off = _probe(tmp_path, "plain", UNIMATMUL_TRITON_KEY_MEMO="0")
    assert off["installed"] is False and off["replaced"] is False
    assert not (tmp_path / "unimatmul" / "triton-key").exists()


def test_a_compile_process_imports_neither_the_backends_nor_an_array_library() -> None:
    """A compile worker imports what compiles (the package's backends and the SDK's array
    adapters load on first use): its start-up is on a first problem's path."""
    code = (
        "import sys, json\n"
        "from unimatmul_triton.compile_worker import main\n"
        "from unimatmul_triton.compiler import compile_plan, reason\n"
        "from unimatmul_triton.triton_key import install\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(done.stdout)
    assert [m for m in loaded if m in ("numpy", "torch", "msgpack")] == []
    assert "unimatmul_triton.backend" not in loaded and "unimatmul_triton.grouped" not in loaded


def test_the_package_names_load_on_first_use() -> None:
    import unimatmul_triton

    assert unimatmul_triton.TritonBackend.__name__ == "TritonBackend"
    assert unimatmul_triton.make_backend.__module__ == "unimatmul_triton.backend"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        unimatmul_triton.nothing  # noqa: B018
