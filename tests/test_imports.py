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


def test_routing_without_torch_says_what_to_install() -> None:
    """As the CLI's ``--array torch`` says it: an ImportError naming torch and the extra."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # what an environment without torch gives
        "import unimatmul.torch as ut\n"
        "from unimatmul.core.errors import MissingDependency\n"
        "try:\n"
        "    ut.enable()\n"
        "except MissingDependency as exc:\n"
        "    assert isinstance(exc, ImportError) and exc.name == 'torch', exc\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "unimatmul.torch needs torch installed" in done.stdout
    assert "pip install torch" in done.stdout and "'.[torch]'" in done.stdout
    assert "Traceback" not in done.stderr


def test_the_backend_sdk_loads_each_name_from_its_module_on_first_use() -> None:
    """``unimatmul.backend`` imports what a name needs when it is used: a plugin's compile
    process that needs ``NotReady`` imports no array library."""
    loaded = _modules_after("from unimatmul.backend import NotReady, Problem")
    assert "unimatmul.core.errors" in loaded and "unimatmul.core.problem" in loaded
    assert [m for m in loaded if m in ("numpy", "torch", "msgpack")] == []
    assert "unimatmul.core.arrays" not in loaded


def test_every_backend_sdk_name_is_its_modules_own() -> None:
    import importlib

    import unimatmul.backend as sdk

    assert sorted(sdk._EXPORTS) == sorted(sdk.__all__) == dir(sdk)
    for name, module in sdk._EXPORTS.items():
        assert getattr(sdk, name) is getattr(importlib.import_module(module), name)
