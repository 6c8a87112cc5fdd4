"""Where the ROCm backends look for librocblas / libhipblaslt, and what they say when absent.

The search order is exercised with temporary folders holding files under the real
sonames (not loadable libraries: no ROCm is installed here), and the real
``ctypes`` loader then reports each place it tried.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unimatmul_backends.rocm.libraries import (
    DEFAULT_ROCM,
    ENV_HIPBLASLT,
    ENV_ROCBLAS,
    LibraryNotFound,
    hip_device_reason,
    hip_runtime_device_reason,
    load_library,
    loaded_paths,
    search_order,
    torch_lib_dir,
)
from unimatmul_backends.rocm.rocblas_abi import ROCBLAS_LIBRARY_NAMES

NAMES = ("libhipblaslt.so", "libhipblaslt.so.0")


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"not an ELF file")
    return folder


def test_explicit_variable_is_the_only_place_tried(tmp_path: Path) -> None:
    rocm = _touch(tmp_path / "rocm" / "lib", "libhipblaslt.so")
    lib = _touch(tmp_path / "mine", "libhipblaslt.so.0")
    env = {ENV_HIPBLASLT: str(lib / "libhipblaslt.so.0"), "ROCM_PATH": str(rocm.parent)}
    choices = search_order(NAMES, ENV_HIPBLASLT, environ=env, loaded=["/x/libhipblaslt.so"], torch_lib=False)
    assert [(c.path, c.origin) for c in choices] == [(str(lib / "libhipblaslt.so.0"), ENV_HIPBLASLT)]
    # A folder in the variable: each soname inside it, nothing else.
    env[ENV_HIPBLASLT] = str(lib)
    choices = search_order(NAMES, ENV_HIPBLASLT, environ=env, loaded=[], torch_lib=False)
    assert [c.path for c in choices] == [str(lib / n) for n in NAMES]


def test_order_without_the_variable(tmp_path: Path) -> None:
    rocm = _touch(tmp_path / "rocm" / "lib", "libhipblaslt.so", "libhipblaslt.so.0")
    torch_lib = _touch(tmp_path / "torch" / "lib", "libhipblaslt.so")
    env = {"ROCM_PATH": str(rocm.parent)}
    loaded = [str(tmp_path / "already" / "libhipblaslt.so.0")]
    choices = search_order(NAMES, ENV_HIPBLASLT, environ=env, loaded=loaded, torch_lib=str(torch_lib))
    got = [(c.path, c.origin) for c in choices]
    expected_head = [
        (loaded[0], "already loaded in this process"),
        (str(rocm / "libhipblaslt.so"), "ROCM_PATH"),
        (str(rocm / "libhipblaslt.so.0"), "ROCM_PATH"),
    ]
    assert got[:3] == expected_head
    # /opt/rocm only when it holds the library (it does not on this machine).
    opt = [g for g in got if g[1] == DEFAULT_ROCM]
    assert all(Path(p).exists() for p, _ in opt)
    rest = [g for g in got if g[1] != DEFAULT_ROCM][3:]
    assert rest == [
        (str(torch_lib / "libhipblaslt.so"), "torch/lib (ROCm build of torch)"),
        ("libhipblaslt.so", "dynamic loader search path"),
        ("libhipblaslt.so.0", "dynamic loader search path"),
    ]


def test_the_same_file_is_tried_once(tmp_path: Path) -> None:
    rocm = _touch(tmp_path / "rocm" / "lib", "librocblas.so")
    (tmp_path / "link").symlink_to(rocm.parent)
    choices = search_order(
        ROCBLAS_LIBRARY_NAMES,
        ENV_ROCBLAS,
        environ={"ROCM_PATH": str(tmp_path / "link")},
        loaded=[str(rocm / "librocblas.so")],
        torch_lib=False,
    )
    paths = [c.path for c in choices if c.origin != "dynamic loader search path"]
    assert paths == [str(rocm / "librocblas.so")]


def test_load_failure_names_every_place_tried(tmp_path: Path) -> None:
    lib = _touch(tmp_path / "lib", "librocblas.so")
    env_file = str(lib / "librocblas.so")
    choices = search_order(ROCBLAS_LIBRARY_NAMES, ENV_ROCBLAS, environ={ENV_ROCBLAS: env_file})
    with pytest.raises(LibraryNotFound) as info:
        load_library(ROCBLAS_LIBRARY_NAMES, ENV_ROCBLAS, "librocblas", choices=choices)
    text = str(info.value)
    assert env_file in text and ENV_ROCBLAS in text and "ROCM_PATH" in text


def test_loaded_paths_reads_the_process_map(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1   /usr/lib/librocblas.so.4.3.60300\n"
        "7f01-7f02 r--p 00000000 08:01 1   /usr/lib/librocblas.so.4.3.60300\n"
        "7f02-7f03 r-xp 00000000 08:01 2   /usr/lib/librocblas_ext.so\n"
        "7f03-7f04 rw-p 00000000 00:00 0   [heap]\n"
    )
    assert loaded_paths(ROCBLAS_LIBRARY_NAMES, str(maps)) == ["/usr/lib/librocblas.so.4.3.60300"]
    assert loaded_paths(ROCBLAS_LIBRARY_NAMES, str(tmp_path / "missing")) == []


def test_this_machine_has_no_rocm() -> None:
    """The real checks on the CI machine: a CPU build of torch and no ROCm install."""
    pytest.importorskip("torch")
    import torch

    if getattr(torch.version, "hip", None):
        pytest.skip("a ROCm build of torch is installed")
    assert torch_lib_dir() is None
    reason = hip_device_reason()
    assert reason is not None and "not a ROCm build" in reason


def test_without_a_hip_runtime_the_device_count_says_so() -> None:
    """This machine has no libamdhip64: the check explains instead of failing."""
    reason = hip_runtime_device_reason(("libamdhip64-absent.so.99",))
    assert reason is not None
    assert reason.startswith(
        "no HIP runtime (libamdhip64) could be loaded to count devices: libamdhip64-absent.so.99"
    )
