"""Records and files for the cache tests (imported by the test modules of this folder)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from unimatmul.cache.record import FAILED, OK, PRUNED, CandidateResult, TuningRecord
from unimatmul.core.problem import Problem

NS = "cpu/x86_64:avx2/Test CPU/2/numpy"
PLATFORM = {"vendor": "cpu", "arch": "x86_64:avx2", "device": "Test CPU", "cores": 2, "array": "numpy"}

# Candidate times come back within half a step of 1/4096 on a log scale; errors to
# bfloat16 precision (see docs/cache-format.md).
TIME_RTOL = 1.3e-4
ERROR_RTOL = 4e-3


def key(i: int, dtype: str = "f32") -> str:
    return Problem.from_shape(1 + i % 97, 1 + i // 97, 8, dtype).key


def record(
    problem_key: str,
    winner_s: float = 1e-3,
    *,
    tuned_at: float = 1.7e9,
    writer: str = "unimatmul test",
    versions: dict[str, str] | None = None,
    winner: str = "fake/k0",
) -> TuningRecord:
    """A realistic record: Default, the winner, a pruned and a failed candidate."""
    results = [
        CandidateResult("default/default", OK, winner_s * 1.7, 12, 2.5e-7),
        CandidateResult("fake/k0", OK, winner_s, 20, 1.25e-7),
        CandidateResult("fake/k1", PRUNED, winner_s * 4.2, 5, 3e-7, "4.20x the best after 5 samples"),
        CandidateResult("fake/k2", FAILED, None, 0, None, "RuntimeError: no"),
    ]
    if winner == "default/default":
        winner_s = results[0].median_s or math.inf
    return TuningRecord(
        problem=problem_key,
        winner=winner,
        winner_s=winner_s,
        default_s=results[0].median_s,
        results=results,
        versions=dict(versions or {"fake": "1.0", "numpy": "2.0"}),
        tuned_at=tuned_at,
        tune_s=0.25,
        settings={"warmup": 2, "budget_s": 0.25, "timer": "cpu", "default_error": 2.5e-7},
        writer=writer,
        device_state={"cpu_mhz": 2600, "cpu_temp_c": 51, "governor": "performance"},
    )


def assert_same(got: TuningRecord | None, want: TuningRecord) -> None:
    """Equal up to the documented precision of candidate times and errors."""
    assert got is not None
    exact = ("problem", "winner", "winner_s", "versions", "tuned_at", "tune_s", "writer", "device_state")
    for name in exact:
        assert getattr(got, name) == getattr(want, name), name
    assert _close(got.default_s, want.default_s, TIME_RTOL)
    assert {k: v for k, v in got.settings.items() if k != "default_error"} == {
        k: v for k, v in want.settings.items() if k != "default_error"
    }
    assert _close(got.settings.get("default_error"), want.settings.get("default_error"), ERROR_RTOL)
    assert len(got.results) == len(want.results)
    for g, w in zip(got.results, want.results, strict=True):
        assert (g.identity, g.status, g.samples, g.note) == (w.identity, w.status, w.samples, w.note)
        assert _close(g.median_s, w.median_s, TIME_RTOL), (g, w)
        assert _close(g.error, w.error, ERROR_RTOL), (g, w)


def _close(a: Any, b: Any, rtol: float) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rtol * abs(b)


# A child process that writes records through the real put path.
WRITER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, {helpers!r})
from cache_helpers import NS, PLATFORM, key, record
from unimatmul.cache.file_store import MsgpackFileStore

path, worker, count, autoflush, loop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
store = MsgpackFileStore(path, autoflush=autoflush)
store.note_platform(NS, PLATFORM)
round_ = 0
while True:
    for i in range(count):
        n = worker * 1_000_000 + round_ * count + i
        store.put(NS, key(n), record(key(n), 1e-3 + n * 1e-9, writer=f"worker {{worker}}"))
    store.flush()
    round_ += 1
    if not loop:
        break
print("done", worker, flush=True)
"""


def writer_script() -> str:
    return WRITER.format(helpers=str(Path(__file__).parent))


PYTHON = sys.executable


# --- taking a schema 3 file apart, and putting it back with valid checksums --------------
# (what a crafted file does: every test of what lies past the checksums starts here)


def split_file(data: bytes) -> tuple[dict[str, Any], list[tuple[int, int, int, bytes]]]:
    """The top-level map and the body's frames as (kind, namespace, index, payload)."""
    import msgpack

    from unimatmul.cache import frames

    doc = msgpack.unpackb(data)
    found = [(f.kind, f.namespace, f.index, bytes(f.payload)) for f in frames.walk(doc["body"], [])]
    return doc, found


def join_file(doc: dict[str, Any], parts: list[tuple[int, int, int, bytes]]) -> bytes:
    import msgpack

    from unimatmul.cache import frames

    body = b"".join(frames.pack(kind, ns, index, payload) for kind, ns, index, payload in parts)
    packed: bytes = msgpack.packb({**doc, "body": body}, use_bin_type=True)
    return packed


def entry_block(payload: bytes, count: int) -> tuple[list[str], list[bytes]]:
    """The keys and rows of an entry block's payload."""
    import zlib

    from unimatmul.cache.columns import Column

    blob = zlib.decompress(payload)
    key_bytes = int.from_bytes(blob[:4], "little")
    keys = blob[4 : 4 + key_bytes].decode().split("\0")
    column = Column.parse(blob[4 + key_bytes :], count, "test")
    return keys, [column[i] for i in range(count)]


def entry_payload(keys: list[str], rows: list[bytes]) -> bytes:
    import zlib

    from unimatmul.cache.columns import Column

    key_bytes = "\0".join(keys).encode()
    return zlib.compress(len(key_bytes).to_bytes(4, "little") + key_bytes + Column.pack(rows))
