"""What a rocBLAS solution index names, per rocBLAS version (its two numbering conventions).

``rocblas_gemm_ex_get_solutions`` lists the indices ``rocblas_gemm_ex`` runs with
``rocblas_gemm_algo_solution_index``; PyTorch TunableOp writes them as
``Gemm_Rocblas_<index>``. The numbering changed when rocBLAS gained its hipBLASLt backend:

* **Unbiased** (rocBLAS up to 4.x, ROCm <= 6.4; ROCm/rocBLAS ``library/src/tensile_host.cpp``
  ``getAllSolutions``: ``index + 1``): every index > 0 is a Tensile solution, numbered
  from 1; 0 is the default choice.
* **Biased** (the rocm-libraries rocBLAS, taken here as 5.0 / ROCm 7.0 on;
  ``projects/rocblas/library/src/include/tensile_host.hpp`` and ``definitions.hpp``):
  ``c_rocblas_solutions_reserved = 10``; an index > 0 is a hipBLASLt solution
  (``rocblas_hipblaslt_index``; ``hipblaslt_host.cpp`` runs hipBLASLt index ``i - 1``),
  an index < -10 a Tensile one (``rocblas_tensile_index``; Tensile's 1-based index is
  ``-index - 10``, ROCm/rocm-libraries #10766), and -9..0 are reserved (0 and -1 the
  default, -2 the source kernels, -3 "test all").

The first rocBLAS release with the biased numbering was not pinned down from a tag (the
headers of the installed package do not carry it: both constants are internal); 5.0 is
where the rocm-libraries sources have it, and a library that lists any index below -10
uses it whatever its version says (:func:`biased_listing`). So an index alone never says
which kernel it is: identities carry the ``source`` (``tensile`` or ``hipblaslt``) too,
and an index whose source differs under the rocBLAS now loaded is not run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: ``c_rocblas_solutions_reserved`` (rocBLAS ``definitions.hpp``): -9..0 name no solution.
RESERVED = 10
#: The first rocBLAS (major, minor) taken to number solutions the biased way.
BIASED_FROM = (5, 0)
TENSILE = "tensile"
HIPBLASLT = "hipblaslt"
SOURCES = (TENSILE, HIPBLASLT)

_VERSION = re.compile(r"\s*(\d+)\.(\d+)")


def rocblas_version_tuple(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a rocBLAS version string (``4.4.1.``, ``4.0.0-72e57364-dirty``)."""
    found = _VERSION.match(text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def biased(version: str | None) -> bool | None:
    """Whether rocBLAS ``version`` numbers solutions the biased way; None when unknown."""
    parsed = rocblas_version_tuple(version)
    return None if parsed is None else parsed >= BIASED_FROM


def biased_listing(version: str | None, listed: Iterable[int]) -> bool:
    """The numbering of a library that reports ``version`` and listed ``listed``."""
    return bool(biased(version)) or any(i < -RESERVED for i in listed)


def index_source(index: int, is_biased: bool) -> str | None:
    """``tensile``, ``hipblaslt``, or None (a reserved index: no solution)."""
    if is_biased:
        if index > 0:
            return HIPBLASLT
        return TENSILE if index < -RESERVED else None
    return TENSILE if index > 0 else None


def tensile_number(index: int, is_biased: bool) -> int | None:
    """The 1-based Tensile solution number an index names (as override files write it)."""
    if index_source(index, is_biased) != TENSILE:
        return None
    return -index - RESERVED if is_biased else index


def legacy_source(index: int) -> str | None:
    """The source of an index stored without one (written before identities carried it).

    Only the unbiased numbering existed then, so a positive index was Tensile's; an index
    below -10 can only be a biased Tensile one.
    """
    if index > 0 or index < -RESERVED:
        return TENSILE
    return None
