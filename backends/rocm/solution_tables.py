"""hipBLASLt's solution tables: which kernel a solution index names, on which GPU.

A hipBLASLt package ships its Tensile solutions as msgpack files beside the library,
in ``<libdir>/hipblaslt/library/``:

* ``TensileLibrary_<problem type>_<arch>.dat``: the solutions of one problem type for
  one architecture, ``{"solutions": [{"index", "name", "kernelName", "problemType",
  ...}, ...], "library": ...}``;
* ``TensileLiteLibrary_lazy_Mapping.dat``: ``{first index: table name}``, how hipBLASLt
  finds the table of an index when it loads tables on demand;
* ``TensileLibrary_lazy_<arch>.dat``: one per architecture the package was built for.

The solution index is what ``hipblaslt_ext::getIndexFromAlgo`` returns, what the
``hipblaslt`` backend keys its candidates on, and what PyTorch TunableOp writes as
``Gemm_Hipblaslt_<index>``. Read from Debian's hipBLASLt 7.1.1 (``tests/amd_real``):
one build numbers the solutions of all its architectures in one run (there 0 to 87425
over gfx908, gfx90a, gfx1100-1103, gfx1150/1151 and gfx1200/1201), every table holding
one contiguous range, so an index names one solution of one architecture *of that
build*. A TunableOp file written with another build of the same hipBLASLt version, with
other architectures, names other kernels by the same numbers: its ``GCN_ARCH_NAME``
validator and the table an index falls in must agree, and :func:`resolve` checks it.

Command line: ``python -m unimatmul_backends.rocm.solution_tables FILE.csv
[--library PATH] [--arch gfxNNN]`` prints the kernel each ``Gemm_Hipblaslt_<index>``
row of a TunableOp results file names, or why it names none; exit status 1 if any row
fails. ``--library`` is libhipblaslt (or its folder, or the tables' folder); by default
the one the ``hipblaslt`` backend would load.
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgpack

from unimatmul.interop.tunableop import TunableOpGemm, parse
from unimatmul_backends.rocm.libraries import ENV_HIPBLASLT, search_order

MAPPING = "TensileLiteLibrary_lazy_Mapping.dat"
LAZY_PREFIX = "TensileLibrary_lazy_"
TABLE_SUFFIX = ".dat"
#: torch dtype name (TunableOp op names, :mod:`unimatmul.interop.tunableop`) -> the
#: Tensile data type name in a solution's ``problemType``. The fp8 names differ between
#: FNUZ and OCP builds and are not compared.
TENSILE_TYPES = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16", "float64": "Double"}


class SolutionNotFound(LookupError):
    """No solution with that index in these tables, or not for that architecture."""


@dataclass(frozen=True)
class Solution:
    """One solution of one table: its index, names and the problem type it solves."""

    index: int
    name: str  # the solution's name (kernel parameters, GSU and the like included)
    kernel_name: str  # the code-object symbol that runs
    arch: str  # e.g. "gfx90a"
    table: str  # the .dat file's name without the suffix
    problem_type: Mapping[str, Any]

    def mismatches(self, gemm: TunableOpGemm) -> list[str]:
        """Why this solution cannot be the one TunableOp ran for ``gemm`` (empty: it can).

        TunableOp records the GEMM as the BLAS call sees it, and hipBLASLt's
        ``transA``/``transB`` are that call's, so the layout letters compare directly.
        """
        found = []
        problem = self.problem_type
        for letter, key in ((gemm.transa, "transA"), (gemm.transb, "transB")):
            if bool(problem.get(key)) != (letter not in "nN"):
                found.append(f"{key} is {problem.get(key)}, the row's layout letter is {letter!r}")
        for dtype, key in ((gemm.dtype_a, "aType"), (gemm.dtype_b, "bType"), (gemm.dtype_c, "dType")):
            wanted = TENSILE_TYPES.get(dtype)
            if wanted is not None and problem.get(key) != wanted:
                found.append(f"{key} is {problem.get(key)}, the row's {dtype} would be {wanted}")
        if gemm.kind == "gemm_and_bias" and not problem.get("useBias"):
            found.append("the solution has no bias epilogue (useBias is 0), the row is GemmAndBias")
        return found


def arch_name(gcn_arch_name: str) -> str:
    """``"gfx90a:sramecc+:xnack-"`` (TunableOp's ``GCN_ARCH_NAME``) -> ``"gfx90a"``."""
    return gcn_arch_name.split(":", 1)[0].strip()


def _unpack(path: Path) -> Any:
    with open(path, "rb") as handle:
        return msgpack.unpack(handle, raw=False, strict_map_key=False)


# Decoded on demand, and only a few kept: one table can hold thousands of solutions.
@lru_cache(maxsize=8)
def _read_table(folder: Path, table: str) -> tuple[Solution, ...]:
    arch = table.rsplit("_", 1)[-1]
    data = _unpack(folder / f"{table}{TABLE_SUFFIX}")
    return tuple(
        Solution(
            index=int(s["index"]),
            name=str(s.get("name", "")),
            kernel_name=str(s.get("kernelName", "")),
            arch=arch,
            table=table,
            problem_type=s.get("problemType", {}),
        )
        for s in data.get("solutions", ())
    )


class SolutionTables:
    """The solution tables in one folder (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        mapping_path = self.folder / MAPPING
        if not mapping_path.is_file():
            msg = f"{self.folder} holds no {MAPPING}: not a hipBLASLt solution-table folder"
            raise FileNotFoundError(msg)
        mapping = _unpack(mapping_path)
        self._starts = sorted(int(k) for k in mapping)
        self._tables = [str(mapping[k]) for k in self._starts]
        lazy = (
            p.name[len(LAZY_PREFIX) : -len(TABLE_SUFFIX)] for p in self.folder.glob(f"{LAZY_PREFIX}*.dat")
        )
        self._architectures = sorted(lazy)

    @classmethod
    def beside(cls, library: str | os.PathLike[str]) -> SolutionTables:
        """The tables of a ``libhipblaslt.so*`` (or of the folder holding it, or the tables' own)."""
        path = Path(library)
        if path.is_file() or path.is_symlink():
            path = path.resolve().parent
        for folder in (path, path / "hipblaslt" / "library"):
            if (folder / MAPPING).is_file():
                return cls(folder)
        msg = f"no hipBLASLt solution tables at {path} or {path / 'hipblaslt' / 'library'}"
        raise FileNotFoundError(msg)

    def architectures(self) -> list[str]:
        """The architectures the package was built for (one lazy table each)."""
        return list(self._architectures)

    def ranges(self) -> Iterator[tuple[str, int, int | None]]:
        """``(table, first index, next table's first index or None)`` as the mapping says."""
        for i, (start, table) in enumerate(zip(self._starts, self._tables, strict=True)):
            yield table, start, self._starts[i + 1] if i + 1 < len(self._starts) else None

    def table_of(self, index: int) -> str:
        """The table whose range holds ``index``."""
        position = bisect.bisect_right(self._starts, index) - 1
        if position < 0:
            msg = f"solution index {index} is below the first table's ({self._starts[0]})"
            raise SolutionNotFound(msg)
        return self._tables[position]

    def table(self, table: str) -> tuple[Solution, ...]:
        """Every solution of one table (a name from :meth:`ranges` or :meth:`table_of`)."""
        return _read_table(self.folder, table)

    def solution(self, index: int) -> Solution:
        """The solution numbered ``index``, from the one table that may hold it."""
        table = self.table_of(index)
        solutions = self.table(table)
        for solution in solutions:
            if solution.index == index:
                return solution
        if table == self._tables[-1] and solutions and index > solutions[-1].index:
            msg = f"solution index {index} is past the last one of these tables ({solutions[-1].index})"
        else:
            msg = f"solution index {index} falls in {table}, which does not hold it"
        raise SolutionNotFound(msg)


def resolve(tables: SolutionTables, gemm: TunableOpGemm, arch: str) -> Solution:
    """The solution a ``Gemm_Hipblaslt_<index>`` row names on ``arch``; raises if it names none.

    Raises :class:`SolutionNotFound` when the index is not there or belongs to another
    architecture, and ``ValueError`` when the solution solves another problem type.
    """
    source = gemm.solution
    if source is None or source.source != "hipblaslt" or source.index is None:
        name = None if source is None else source.name
        msg = f"{name!r} is not a hipBLASLt solution name (Gemm_Hipblaslt_<index>)"
        raise ValueError(msg)
    if arch not in tables.architectures():
        msg = f"these tables were built for {', '.join(tables.architectures())}: none is {arch}"
        raise SolutionNotFound(msg)
    solution = tables.solution(source.index)
    if solution.arch != arch:
        msg = (
            f"{source.name} is a {solution.arch} solution in these tables ({solution.table}), not {arch}: "
            f"the file was written with another hipBLASLt build"
        )
        raise SolutionNotFound(msg)
    wrong = solution.mismatches(gemm)
    if wrong:
        msg = f"{source.name} ({solution.kernel_name}) does not solve {gemm.op_name}: " + "; ".join(wrong)
        raise ValueError(msg)
    return solution


def resolve_file(
    tables: SolutionTables, path: str | os.PathLike[str], arch: str | None = None
) -> list[tuple[TunableOpGemm, Solution | str]]:
    """Each hipBLASLt row of a TunableOp results file with its solution, or why it has none.

    ``arch`` defaults to the file's ``GCN_ARCH_NAME`` validator.
    """
    results = parse(path)
    if arch is None:
        gcn = results.validators.entries.get("GCN_ARCH_NAME")
        if gcn is None:
            msg = f"{path} has no GCN_ARCH_NAME validator: say which architecture (--arch)"
            raise ValueError(msg)
        arch = arch_name(gcn)
    found: list[tuple[TunableOpGemm, Solution | str]] = []
    for gemm in results.gemms:
        if gemm.solution is None or gemm.solution.source != "hipblaslt":
            continue
        try:
            found.append((gemm, resolve(tables, gemm, arch)))
        except (LookupError, ValueError) as exc:
            found.append((gemm, str(exc)))
    return found


def default_library() -> str:
    """The libhipblaslt the backend's search order finds first (without loading it)."""
    for choice in search_order(("libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"), ENV_HIPBLASLT):
        if os.path.isabs(choice.path) and os.path.exists(choice.path):
            return choice.path
    msg = f"no libhipblaslt found (set {ENV_HIPBLASLT} or pass --library)"
    raise FileNotFoundError(msg)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m unimatmul_backends.rocm.solution_tables",
        description="Name the hipBLASLt kernel of each Gemm_Hipblaslt_<index> row of a TunableOp results file.",
    )
    parser.add_argument("file", help="a TunableOp results file (tunableop_results*.csv)")
    parser.add_argument("--library", help="libhipblaslt, its folder, or its hipblaslt/library folder")
    parser.add_argument("--arch", help="GPU architecture (default: the file's GCN_ARCH_NAME)")
    args = parser.parse_args(argv)
    try:
        tables = SolutionTables.beside(args.library or default_library())
        rows = resolve_file(tables, args.file, args.arch)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"solution_tables: error: {exc}\n")
        return 2
    failed = 0
    for gemm, solution in rows:
        where = f"line {gemm.line_no}: {gemm.op_name} {gemm.solution.name if gemm.solution else ''}"
        if isinstance(solution, Solution):
            sys.stdout.write(f"{where} -> {solution.arch} {solution.kernel_name}\n")
        else:
            failed += 1
            sys.stdout.write(f"{where} -> NOT FOUND: {solution}\n")
    sys.stdout.write(f"{len(rows) - failed} of {len(rows)} hipBLASLt rows name a kernel in {tables.folder}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
