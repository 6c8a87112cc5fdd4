"""The cuBLASLt backend's pieces that need no GPU: registration, loading, identities, timers."""

from __future__ import annotations

import pytest

from unimatmul.backend import Candidate
from unimatmul.core.plugins import PluginManager
from unimatmul.tuning.timers import MAX_BATCH_S, MIN_CALLS, batch_size
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
