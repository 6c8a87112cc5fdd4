"""The bound column: what a record's samples say of its choice, and records that do not say;
the bytes a problem's operands take."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from unimatmul.cache.protocol import open_store
from unimatmul.cli import main as cli_main
from unimatmul.cli import output
from unimatmul.cli.output import operand_bytes
from unimatmul.core.grouped import grouped_problem
from unimatmul.core.problem import Problem

LEGACY = Path(__file__).parent.parent / "cache" / "data" / "schema2.msgpack"


def test_records_written_before_the_bound_show_a_dash(tmp_path: Path) -> None:
    # A cache file of an older schema, as an older unimatmul wrote it: readable, no bound.
    cache = tmp_path / "old.msgpack"
    shutil.copy(LEGACY, cache)
    items = list(open_store(cache).items())
    assert items
    assert all("win" not in record.settings and output.bound(record) == "-" for _, _, record in items)
    out = io.StringIO()
    assert cli_main(["cache", "show", "--cache", str(cache)], out) == 0
    assert "bound" in out.getvalue()


def test_operand_bytes_of_a_grouped_problem_count_the_jagged_operand_once() -> None:
    # Qwen3-30B-A3B's gate/up at 8192 tokens: 65536 rows (top-8) over 128 experts
    problem = grouped_problem(128, 65536, 1536, 2048, "bf16")
    rows_in, weights, rows_out = 65536 * 2048 * 2, 128 * 2048 * 1536 * 2, 65536 * 1536 * 2
    assert rows_in + weights + rows_out <= operand_bytes(problem) < 1.01 * (rows_in + weights + rows_out)
    dense = Problem.from_shape(64, 32, 16, "f32", batch=4)
    assert operand_bytes(dense) == 4 * (64 * 16 + 16 * 32 + 64 * 32) * 4
