"""Where the real ROCm packages were unpacked, and how to run a process against them.

``scripts/fetch_debian_rocm.py`` (run by ``.ci/amd-real``) unpacks Debian unstable's
hipBLASLt, rocBLAS and HIP packages, with unstable's loader and libc, into a folder of
the CI cache. The libraries need that libc (glibc >= 2.38) and this machine's is older,
so every call into them happens in a child process started by unstable's own loader::

    ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path LIBDIR python -c CODE

The Python is this one (the project's virtual environment); its extension modules only
need a libc at least as new as the one they were built for, which unstable's is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENV_ROOT = "UNIMATMUL_AMD_REAL_ROOT"
#: Set by the CI tier: the packages must be there, and their absence is a failure.
ENV_REQUIRED = "UNIMATMUL_AMD_REAL_REQUIRED"
COMPLETE = ".complete"  # written by scripts/fetch_debian_rocm.py after a whole unpack
MULTIARCH = "usr/lib/x86_64-linux-gnu"


def default_root() -> Path:
    """The folder scripts/fetch_debian_rocm.py unpacks into (same rule as there)."""
    base = os.environ.get("UNIMATMUL_CI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "unimatmul-ci"
    )
    return Path(base) / "debian-unstable" / "root"


def required() -> bool:
    return os.environ.get(ENV_REQUIRED, "").strip() not in ("", "0")


@dataclass(frozen=True)
class AmdRoot:
    """The unpacked packages: paths of what the tests use."""

    root: Path

    @property
    def libdir(self) -> Path:
        return self.root / MULTIARCH

    @property
    def include(self) -> Path:
        return self.root / "usr" / "include"

    @property
    def loader(self) -> Path:
        return self.libdir / "ld-linux-x86-64.so.2"

    @property
    def hipblaslt(self) -> Path:
        return self.libdir / "libhipblaslt.so.1"

    @property
    def rocblas(self) -> Path:
        return self.libdir / "librocblas.so.4"

    @property
    def amdhip(self) -> Path:
        return self.libdir / "libamdhip64.so.6"

    @property
    def solution_tables(self) -> Path:
        return self.libdir / "hipblaslt" / "library"

    def missing(self) -> list[str]:
        """What a whole unpack has that this folder lacks (empty when all is there)."""
        wanted = [
            self.root / COMPLETE,
            self.loader,
            self.hipblaslt,
            self.rocblas,
            self.amdhip,
            self.include / "hipblaslt" / "hipblaslt.h",
            self.include / "rocblas" / "rocblas.h",
            self.solution_tables,
        ]
        return [str(p) for p in wanted if not p.exists()]

    def header_version(self, library: str) -> tuple[int, int, int]:
        """``(MAJOR, MINOR, PATCH)`` of ``hipblaslt`` or ``rocblas`` as its version header defines."""
        header = {
            "hipblaslt": self.include / "hipblaslt" / "hipblaslt-version.h",
            "rocblas": self.include / "rocblas" / "internal" / "rocblas-version.h",
        }[library]
        text = header.read_text()
        parts = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            found = re.search(rf"#define\s+{library.upper()}_VERSION_{part}\s+(\d+)", text)
            if found is None:
                msg = f"{header} defines no {library.upper()}_VERSION_{part}"
                raise LookupError(msg)
            parts.append(int(found.group(1)))
        return parts[0], parts[1], parts[2]

    def run_python(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``python ARGS...`` under the archive's loader and libraries; output captured.

        ``args`` are Python's own: ``"-c", code`` or ``script, arg...``.
        """
        cmd = [str(self.loader), "--library-path", str(self.libdir), sys.executable, *args]
        full_env = {**os.environ, **(env or {})}
        # The child must not pick the system's ROCm (if any) before the archive's copy.
        full_env.pop("LD_LIBRARY_PATH", None)
        full_env.pop("ROCM_PATH", None)
        return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
