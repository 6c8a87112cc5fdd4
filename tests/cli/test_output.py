"""The bound column: what a record's samples say of its choice, and records that do not say."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from unimatmul.cache.protocol import open_store
from unimatmul.cli import main as cli_main
from unimatmul.cli import output

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
