"""The layout: a call from ``unimatmul.matmul`` down to a kernel crosses each module at
most twice (data flows one way), a cached call walks to its kernel in at most 12 stops, the
import contracts hold (``lint-imports``), and the tests mirror the package (``tests/<package path>/test_<module>.py``)."""

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
TESTS = REPO / "tests"
OURS = ("unimatmul", "unimatmul_backends")

#: The source folder of each top folder of tests/ that is not a subpackage of unimatmul/.
SOURCES = {
    "backends": REPO / "backends",
    "conformance": REPO / "conformance" / "unimatmul_conformance",
    "benchmarks": REPO / "benchmarks",
}
#: Test files (or folders, ending in "/") that mirror no one module, and why.
NOT_MIRRORED = {
    "amd_real/": "the tier .ci/amd-real runs: several backends against Debian's real AMD software",
    "plugins/test_triton_plugin.py": "runs the Triton plugin's own tests (plugins/unimatmul-triton/tests)",
    "test_docs_links.py": "checks docs/ and the README, not a module",
    "test_fleet.py": "the fleet flow of docs/distributed.md, end to end through the CLI",
    "test_imports.py": "what `import unimatmul` and torch's autoload hook cost",
    "test_layout.py": "this file: the layout of the whole tree",
}


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


def _walk(action: Any) -> tuple[list[str], Counter[str]]:
    """The modules (ours) a call passes through, in time order, from its entry into
    ``unimatmul.api`` to its return there (a stop for each change of module, calls and
    returns alike), and how many times each module was entered (called into from another)."""
    seen: list[str] = []
    entered: Counter[str] = Counter()
    depth = [0]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            here = _module(frame)
            if here == "unimatmul.api" and depth[0] == 0 and frame.f_code.co_name == "matmul":
                depth[0] = 1
            elif depth[0]:
                depth[0] += 1
            if depth[0] and here.startswith(OURS) and (not seen or seen[-1] != here):
                entered[here] += 1
        elif event == "return" and depth[0]:
            depth[0] -= 1
            back = frame.f_back
            here = _module(back) if back is not None and depth[0] else ""
        else:
            return
        if depth[0] and here.startswith(OURS) and (not seen or seen[-1] != here):
            seen.append(here)

    sys.setprofile(profile)
    try:
        action()
    finally:
        sys.setprofile(None)
    return seen, entered


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_cached_call_walks_to_its_kernel_in_twelve_stops(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, library: str
) -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((48, 40)).astype(np.float32)
    b = rng.standard_normal((40, 24)).astype(np.float32)
    if library == "torch":
        torch = pytest.importorskip("torch")
        a, b = torch.from_numpy(a), torch.from_numpy(b)
        # The Python door's walk, even where an earlier call loaded the native kernels
        # (which then serve a torch call in C, in one stop).
        monkeypatch.setenv("UNIMATMUL_TORCH_NATIVE", "0")
        monkeypatch.setattr(unimatmul.api._door, "native_types", frozenset())
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)  # tuned and stored: the cached call finds its plan
    monkeypatch.setenv("UNIMATMUL_MODE", "cached")
    unimatmul.matmul(a, b)  # the key's plan, in the environment's mode
    walk, entered = _walk(lambda: unimatmul.matmul(a, b))
    assert walk[0] == "unimatmul.api" and len(walk) <= 12, " > ".join(walk)
    assert max(entered.values()) <= 2, (entered, walk)


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        pytest.skip("import-linter is not installed (the test extra has it)")
    done = subprocess.run([lint], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]


def _source_folder(folder: Path) -> Path:
    """The package folder that the tests in ``folder`` (relative to tests/) test."""
    parts = folder.parts
    if parts and parts[0] in SOURCES:
        return SOURCES[parts[0]].joinpath(*parts[1:])
    return REPO.joinpath("unimatmul", *parts)


def _mirror_problem(path: Path) -> str | None:
    """Why ``path`` (a test file, relative to tests/) mirrors no module, or None if it does.

    ``tests/a/b/test_c.py`` tests ``a/b/c.py`` (``c`` may go on, as in ``test_c_errors.py``
    for one side of ``c``); a file testing several modules of ``a/b`` is named after its
    folder (``tests/cache/test_cache_paths.py``)."""
    source = _source_folder(path.parent)
    if not source.is_dir():
        return f"{source.relative_to(REPO)}/ is no package folder"
    name = path.stem.removeprefix("test_")
    modules = {p.stem.strip("_") for p in source.iterdir() if p.suffix in (".py", ".cpp")}
    modules.discard("init")
    if path.parent.parts:
        modules.add(path.parent.name)
    if any(name == m or name.startswith(m + "_") for m in modules):
        return None
    return f"names none of {sorted(modules)} in {source.relative_to(REPO)}/"


def _test_files() -> list[Path]:
    return sorted(p.relative_to(TESTS) for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _exempt(path: Path) -> bool:
    return any(
        path.as_posix() == e or (e.endswith("/") and path.as_posix().startswith(e)) for e in NOT_MIRRORED
    )


def test_every_test_file_mirrors_a_package_module() -> None:
    files = _test_files()
    assert len(files) > 50, "the walk found too few test files"
    wrong = {f.as_posix(): why for f in files if not _exempt(f) and (why := _mirror_problem(f))}
    assert not wrong, (
        "tests/<package path>/test_<module>.py, or add the file to NOT_MIRRORED with why: " + str(wrong)
    )
    for entry in NOT_MIRRORED:
        assert (TESTS / entry).exists(), f"NOT_MIRRORED names {entry}, which is gone: drop it"


def test_the_mirror_rule_refuses_what_does_not_mirror() -> None:
    assert _mirror_problem(Path("tuning/test_harness_checks.py")) is None
    assert _mirror_problem(Path("backends/lt/test_driver.py")) is None
    assert _mirror_problem(Path("backends/onednn/test_dnnl.py")) is None  # _dnnl.py
    assert _mirror_problem(Path("cache/test_cache_paths.py")) is None  # the folder's own name
    assert "no package folder" in str(_mirror_problem(Path("core/widgets/test_problem.py")))
    assert "names none of" in str(_mirror_problem(Path("core/test_harness.py")))  # harness is tuning's
    assert "names none of" in str(_mirror_problem(Path("test_selector.py")))  # not at the top either


def test_test_module_names_are_unique() -> None:
    """pytest imports test files by their bare names (no __init__.py under tests/)."""
    seen = Counter(f.name for f in _test_files())
    assert not [name for name, count in seen.items() if count > 1], seen.most_common(3)
