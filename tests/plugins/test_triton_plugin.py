"""The Triton plugin (plugins/unimatmul-triton): its own tests, kernels run in the interpreter.

Install-free, like the example plugin's test: a child process gets the plugin's source
on its path and ``UNIMATMUL_TRITON_INTERPRET=1`` / ``TRITON_INTERPRET=1`` in its
environment before anything imports triton (the interpreter is chosen at import time,
which is why this runs in a fresh process), and runs the plugin's tests, a quick
conformance run among them: the real kernel code, on the CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "unimatmul-triton"


def test_the_triton_plugin_tests_pass_in_the_interpreter() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN / "src"), *sys.path[1:], env.get("PYTHONPATH", "")])
    env.update(UNIMATMUL_TRITON_INTERPRET="1", TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(PLUGIN / "tests"), "-q", "-p", "no:cacheprovider", "-rs"],
        capture_output=True,
        text=True,
        env=env,
        cwd=PLUGIN,
        timeout=900,
        check=False,
    )
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
    assert proc.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
