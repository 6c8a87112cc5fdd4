"""``python -m unimatmul.torch script.py [args]``: run a script with routing on.

Also ``python -m unimatmul.torch -m package.module [args]``. The script's own code is
not changed; combine with ``UNIMATMUL_MODE=record`` (then ``unimatmul tune --from``),
``tune`` or ``cached``.

``python -m unimatmul.torch --build-native [cpu|gpu]`` builds the native routing kernels
now (by default for the GPU if PyTorch sees one) into PyTorch's extension folder, so that
the first ``enable()`` of a later process loads them at once (a container image, say);
exit 1 with the reason when the build fails. ``enable()`` runs it in the background where
no build exists (``UNIMATMUL_TORCH_NATIVE_BUILD``).
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m unimatmul.torch (script.py | -m module) [args ...] | --build-native [cpu|gpu]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        return 0 if argv else 2
    if argv[0] == "--build-native":
        if argv[1:] not in ([], ["cpu"], ["gpu"]):
            sys.stderr.write(USAGE + "\n")
            return 2
        return build_native(None if len(argv) == 1 else argv[1] == "gpu")
    import unimatmul.torch

    unimatmul.torch.enable()
    if argv[0] == "-m":
        if len(argv) < 2:
            sys.stderr.write(USAGE + "\n")
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script.py` does
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def build_native(gpu: bool | None = None) -> int:
    import time

    import torch

    from unimatmul.torch import native

    if gpu is None:
        gpu = torch.cuda.is_available()
    started = time.perf_counter()
    if not native.load(gpu):
        sys.stderr.write(f"unimatmul: the native routing kernels did not build: {native.failure(gpu)}\n")
        return 1
    what = "GPU (Lt calls from C++)" if native.has_lt() else "CPU"
    print(f"native routing kernels built for the {what} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
