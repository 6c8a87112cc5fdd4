"""``python -m unimatmul.torch script.py [args]``: run a script with routing on.

Also ``python -m unimatmul.torch -m package.module [args]``. The script's own code is
not changed; combine with ``UNIMATMUL_MODE=record`` (then ``unimatmul tune --from``),
``tune`` or ``cached``.
"""

from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m unimatmul.torch (script.py | -m module) [args ...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(USAGE + "\n")
        return 0 if argv else 2
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
