"""The layout: a call from ``unimatmul.matmul`` down to a kernel crosses each module at
most twice (data flows one way), and the import contracts hold (``lint-imports``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import unimatmul

REPO = Path(__file__).resolve().parents[1]
OURS = ("unimatmul", "unimatmul_backends")


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _chains(action: Any) -> list[list[str]]:
    """Every call chain (modules from the outermost ``unimatmul.api`` frame down) seen
    while ``action`` runs, consecutive frames of one module counted once."""
    chains: list[list[str]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not _module(frame).startswith(OURS):
            return
        stack: list[str] = []
        f: FrameType | None = frame
        while f is not None:
            stack.append(_module(f))
            f = f.f_back
        stack.reverse()
        if "unimatmul.api" not in stack:
            return
        walk = [m for m in stack[stack.index("unimatmul.api") :] if m.startswith(OURS)]
        runs = [m for i, m in enumerate(walk) if i == 0 or walk[i - 1] != m]
        chains.append(runs)

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return chains


@pytest.mark.parametrize("mode", ["tune", "cached"])
def test_a_call_enters_each_module_at_most_twice(isolated: Any, mode: str) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((48, 40)).astype(np.float32)
    b = rng.standard_normal((40, 24)).astype(np.float32)

    def call() -> None:
        with unimatmul.mode(mode):
            unimatmul.matmul(a, b)

    if mode == "cached":
        with unimatmul.mode("tune"):
            unimatmul.matmul(a, b)  # tuned and stored first: the cached call finds it
    chains = _chains(call)
    assert chains, "the profile saw no call below unimatmul.api"
    worst = max((Counter(chain).most_common(1)[0] for chain in chains), key=lambda item: item[1])
    assert worst[1] <= 2, f"{worst[0]} entered {worst[1]} times in one walk: {max(chains, key=len)}"


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (the test extra has it)")
    done = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
