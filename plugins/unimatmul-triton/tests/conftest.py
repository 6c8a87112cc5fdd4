"""Where there is no GPU, the tests run the real kernels in Triton's interpreter.

The mode must be chosen before the plugin is first loaded (``triton.jit`` decides at
import time whether a kernel is compiled or interpreted), so it is set here, before
any test module imports unimatmul's plugin manager. unimatmul's folder (where the backend
keeps Triton's key: ``triton_key.py``) is a temporary one, not the user's.
"""

from __future__ import annotations

import os
import tempfile


def _gpu_present() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


if not _gpu_present():
    os.environ.setdefault("UNIMATMUL_TRITON_INTERPRET", "1")
    # Triton decides when it is imported whether its own library functions are interpreted.
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="unimatmul-triton-tests-")
