"""The Platform of a HIP device, and how its versions meet TunableOp's validators.

No AMD GPU and no ROCm build of torch exist here, so torch's answers for a ROCm
device (``torch.version.hip``, ``get_device_properties`` with ``gcnArchName``) are
stood in for, with the values an MI300X reports, and the two ROCm backends run on
the fake libraries of their contract tests. What is tested is our code around
them: which facts the Platform takes, its namespace, and that versions imported
from a TunableOp file written on that machine equal what the backends report (so
the selector's per-entry check accepts them without re-validating).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from unimatmul.backend import Target
from unimatmul.cache.protocol import open_store
from unimatmul.cli import interop as cli_interop
from unimatmul.core.arrays import Device, adapter_for_kind
from unimatmul.core.platform import detect_platform

torch = pytest.importorskip("torch")

from test_hipblaslt import FakeHipblaslt, make_backend  # noqa: E402  (sibling test module)
from test_rocblas import FakeRocblas  # noqa: E402
from test_rocblas import make_backend as make_rocblas  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "interop" / "data"
ARCH = "gfx942:sramecc+:xnack-"


@pytest.fixture
def mi300(monkeypatch: pytest.MonkeyPatch) -> Target:
    props = SimpleNamespace(gcnArchName=ARCH, name="AMD Instinct MI300X", multi_processor_count=304)
    monkeypatch.setattr(torch.version, "hip", "6.3.42131-fa1d09cbd")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    return Target(adapter_for_kind("torch"), Device("hip", 0))


def test_platform_of_a_hip_device(mi300: Target) -> None:
    hipblaslt = FakeHipblaslt(900, [])
    hipblaslt.revision = b"0c1a3dfa"
    rocblas = FakeRocblas(listed=[], valid=set(), version=b"4.3.0.ef408db7-dirty")
    platform = detect_platform(mi300, [make_backend(hipblaslt), make_rocblas(rocblas)])
    assert (platform.vendor, platform.arch, platform.device, platform.cores) == (
        "amd",
        ARCH,
        "AMD Instinct MI300X",
        304,
    )
    assert platform.namespace.startswith(f"amd/{ARCH}/AMD Instinct MI300X/304")
    versions = platform.versions
    assert versions["hip"] == "6.3.42131-fa1d09cbd"
    assert versions["hipblaslt"] == "900-0c1a3dfa"
    assert versions["rocblas"] == "4.3.0.ef408db7-dirty"
    assert versions["torch"] == str(torch.__version__)


def test_tunableop_file_of_the_same_machine_imports_into_its_namespace(
    mi300: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hipblaslt = FakeHipblaslt(900, [])
    hipblaslt.revision = b"0c1a3dfa"
    rocblas = FakeRocblas(listed=[], valid=set(), version=b"4.3.0.ef408db7-dirty")
    platform = detect_platform(mi300, [make_backend(hipblaslt), make_rocblas(rocblas)])
    monkeypatch.setattr(cli_interop, "current_gpu_platform", lambda: platform)
    cache = tmp_path / "c.msgpack"
    args = argparse.Namespace(
        file=str(DATA / "rocm_2.7_ld.csv"), cache=str(cache), namespace=None, replace=False
    )
    assert cli_interop.import_tunableop(args, io.StringIO()) == 0
    records = [r for _, _, r in open_store(cache).items(platform.namespace)]
    assert len(records) == 7  # 5 GEMM rows and 2 ScaledGemm (fp8) rows
    current = platform.versions
    # Every version an imported entry pins is the one the backends report here.
    assert all(current[key] == value for r in records for key, value in r.versions.items())
