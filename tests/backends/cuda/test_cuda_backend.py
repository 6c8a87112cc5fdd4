"""The cuBLASLt backend's pieces that need no GPU: registration, loading, identities, timers."""

from __future__ import annotations

from typing import Any

import pytest

from unimatmul.backend import Candidate
from unimatmul.core.plugins import PluginManager
from unimatmul.tuning.timers import MAX_BATCH_S, MIN_CALLS, _named, batch_size
from unimatmul_backends.cuda import library
from unimatmul_backends.cuda.backend import CublasLtBackend

PARAMS = {
    "algo": 66,
    "tile": 20,
    "stages": 35,
    "splitk": 1,
    "reduction": 0,
    "swizzle": 0,
    "custom": 0,
    "inner": 12,
    "cluster": 2,
}


def test_registered_through_the_entry_point() -> None:
    plugins = PluginManager()
    backend = plugins.backends().get("cublaslt")
    assert isinstance(backend, CublasLtBackend), plugins.report
    assert backend.device_kinds == frozenset({"cuda"})
    assert backend.array_kinds == frozenset({"torch", "cupy"})


def test_unavailable_backend_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_CUBLASLT_PATH", "/nonexistent/libcublasLt.so.13")
    backend = CublasLtBackend(library="ctypes")
    reason = backend.availability()
    if reason is None:  # a machine with cuBLASLt: the loader found it elsewhere
        assert backend.library == "ctypes"
        return
    assert "cuBLASLt could not be loaded" in reason
    assert "/nonexistent/libcublasLt.so.13" in reason


def test_library_choice_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_LT_LIBRARY", "cublas")
    with pytest.raises(ValueError, match="UNIMATMUL_LT_LIBRARY='cublas' is not one of auto, nvmath, ctypes"):
        library.library_kind()
    monkeypatch.setenv("UNIMATMUL_LT_LIBRARY", "CTYPES")
    assert library.library_kind() == "ctypes"


def test_explicit_library_path_is_tried_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_CUBLASLT_PATH", "/opt/x/libcublasLt.so.13")
    paths = library.cublaslt_paths()
    assert paths[0] == "/opt/x/libcublasLt.so.13"
    assert "libcublasLt.so.13" in paths


def _package(root: Any, name: str) -> None:
    """A package shaped like nvmath: its ``__init__`` imports its ``bindings``, whose own
    ``__init__`` imports the binding; both count their runs in ``RUNS``."""
    top = root / name
    (top / "bindings").mkdir(parents=True)
    (top / "__init__.py").write_text(
        "import builtins\nbuiltins.RUNS.append('top')\nfrom NAME import bindings\n".replace("NAME", name)
    )
    (top / "bindings" / "__init__.py").write_text(
        "import builtins\nbuiltins.RUNS.append('bindings')\nfrom NAME.bindings import lt\n".replace(
            "NAME", name
        )
    )
    (top / "bindings" / "lt.py").write_text("import builtins\nbuiltins.RUNS.append('lt')\nVERSION = 13\n")


def test_one_binding_imports_without_its_packages_init(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cublasLt binding's way in: the binding's module loads, its packages' ``__init__``
    do not run; a later plain import of the package runs them, and it finds the same module."""
    import builtins
    import importlib
    import sys

    name = f"fake_nvmath_{tmp_path.name.replace('-', '_')}"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(builtins, "RUNS", [], raising=False)
    runs = builtins.RUNS  # type: ignore[attr-defined]
    try:
        lt = library.import_binding(name, "bindings", "lt")
        assert lt is not None and lt.VERSION == 13
        assert runs == ["lt"]
        assert name not in sys.modules and f"{name}.bindings" not in sys.modules
        package = importlib.import_module(name)
        assert runs == ["lt", "top", "bindings"]
        assert package.bindings.lt is lt
        # Imported already: nothing is held back any more, the caller imports the plain way.
        assert library.import_binding(name, "bindings", "lt") is None
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


def test_a_binding_that_is_not_there_is_left_to_the_plain_import(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins
    import sys

    name = f"fake_nvmath_{tmp_path.name.replace('-', '_')}"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(builtins, "RUNS", [], raising=False)
    assert library.import_binding("no_such_package_here", "bindings", "lt") is None
    assert library.import_binding(name, "bindings", "missing") is None
    assert name not in sys.modules and f"{name}.bindings" not in sys.modules
    assert builtins.RUNS == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["gemm", "pad"])
def test_identity_is_the_algo_configuration(name: str) -> None:
    candidate = Candidate.make("cublaslt", name, **PARAMS)
    assert candidate.identity == (
        f"cublaslt/{name}?algo=66&cluster=2&custom=0&inner=12&reduction=0&splitk=1&stages=35&swizzle=0&tile=20"
    )
    back = Candidate.from_identity(candidate.identity)
    assert back == candidate
    assert dict(back.params) == PARAMS


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = CublasLtBackend()
    assert (backend.heuristic_count, backend.pad_count, backend.exhaustive) == (16, 2, False)
    assert backend.workspace_limit == 32 << 20
    monkeypatch.setenv("UNIMATMUL_LT_HEURISTICS", "4")
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "1")
    assert (backend.heuristic_count, backend.exhaustive) == (4, True)
    monkeypatch.setenv("UNIMATMUL_LT_HEURISTICS", "many")
    with pytest.raises(ValueError, match="UNIMATMUL_LT_HEURISTICS='many' is not an integer"):
        _ = backend.heuristic_count


def test_timer_batch_size() -> None:
    # Small kernels: at least MIN_CALLS calls, and every rotated set at least once.
    assert batch_size(4, 5e-6) == MIN_CALLS
    assert batch_size(64, 5e-6) == 64
    # Long kernels: cut so that a batch stays near MAX_BATCH_S, never below one call.
    assert batch_size(4, MAX_BATCH_S / 4) == 4
    assert batch_size(4, 1.0) == 1
    assert batch_size(4, float("nan")) == MIN_CALLS


def test_a_timer_of_another_batch_size_says_so_in_its_name() -> None:
    assert _named("torch-cuda-graph", MIN_CALLS) == "torch-cuda-graph"
    assert _named("cupy-events", 7) == "cupy-events (7 calls a batch)"
