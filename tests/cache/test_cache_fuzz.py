"""5,000 mutated cache files (fuzz_cases.py): no traceback, no hang, no entry lost that was
readable, a copy of every damaged file kept, and reading commands that change nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fuzz_cases import fast_folder, run

FILES = 5000  # about 45 s on the 2-core CI machine


def test_five_thousand_mutated_files() -> None:
    with tempfile.TemporaryDirectory(dir=fast_folder()) as folder:
        outcomes = run(FILES, Path(folder))
    assert sum(outcomes.values()) == FILES
    # Both kinds were met: files read whole and damaged files whose copy was kept.
    assert outcomes["read whole"] > 0.1 * FILES and outcomes["kept a copy"] > 0.5 * FILES
