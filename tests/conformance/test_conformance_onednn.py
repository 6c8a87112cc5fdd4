"""The conformance suite on the real oneDNN backend, the way CI runs it.

The full matrix, through the documented pytest command in a subprocess, as a vendor
would run it from outside the repository (a few seconds on two cores). The command
line's own paths are tested on fakes in test_conformance_meta.py. Skipped when
libdnnl cannot be found.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from onednn_caps import missing

from unimatmul.core.plugins import PluginManager

_ONEDNN = PluginManager().backends().get("onednn")
_REASON = "no onednn backend registered" if _ONEDNN is None else _ONEDNN.availability()
if _REASON is not None:  # pragma: no cover - depends on the machine
    pytest.skip(f"oneDNN is not available: {_REASON}", allow_module_level=True)

HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_full_matrix_through_the_pytest_plugin(tmp_path: Path) -> None:
    report_path = tmp_path / "onednn.json"
    command = [
        sys.executable, "-m", "pytest", "-p", "unimatmul_conformance.plugin",
        "--pyargs", "unimatmul_conformance", "--unimatmul-backend", "onednn",
        "--unimatmul-json", str(report_path), "-q", "-p", "no:cacheprovider",
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "unimatmul conformance" in proc.stdout and "PASSED:" in proc.stdout
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["ok"] and report["mode"] == "full" and report["counts"]["failed"] == 0
    by_check = report["by_check"]
    for name in ("platform", "identity-stable", "cache-roundtrip"):
        assert by_check[name]["passed"] == 1, name
    # The matrix holds bf16 cases only where oneDNN has bf16 kernels (AVX-512-BF16, AMX).
    assert by_check["result"]["passed"] >= (150 if missing("bf16") is None else 100)
    assert by_check["guard"]["passed"] == by_check["result"]["passed"]
    assert by_check["threads"]["passed"] >= 2
    ran = {
        c["case"].split(":")[1]
        for c in report["checks"]
        if c["check"] == "result" and c["status"] == "passed"
    }
    assert "f32.f32.f32" in ran
    if HAS_TORCH and missing("bf16") is None:  # bf16 needs torch tensors and a bf16-capable CPU
        assert {"bf16.bf16.bf16", "bf16.bf16.f32"} <= ran
    # What oneDNN does not run (f16, f64, fp8) was answered "unsupported", never a crash.
    refused = [
        c for c in report["checks"] if c["check"] == "candidates" and c["why"].startswith("unsupported")
    ]
    assert any(":f64.f64.f64:" in c["id"] for c in refused)
