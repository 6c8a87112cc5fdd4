"""What importing unimatmul costs: PyTorch imports it at every ``import torch``."""

from __future__ import annotations

import json
import subprocess
import sys


def _modules_after(statement: str) -> list[str]:
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_the_torch_autoload_hook_imports_no_core_module_and_no_array_library() -> None:
    loaded = _modules_after("import unimatmul.torch.autoload")
    heavy = [m for m in loaded if m in ("numpy", "torch", "cupy", "msgpack", "pluggy")]
    core = [m for m in loaded if m.startswith("unimatmul.") and not m.startswith("unimatmul.torch")]
    assert heavy == []
    assert core == ["unimatmul._version", "unimatmul.settings"]  # the variables: no imports of its own


def test_public_names_load_on_first_use() -> None:
    loaded = _modules_after("import unimatmul; unimatmul.Problem; from unimatmul import hookimpl")
    assert "unimatmul.core.problem" in loaded and "unimatmul.core.hookspecs" in loaded
    assert "unimatmul.api" not in loaded  # matmul was never asked for
