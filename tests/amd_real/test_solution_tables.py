"""hipBLASLt's real solution tables: a TunableOp ``Gemm_Hipblaslt_<index>`` names one kernel.

Read with :mod:`unimatmul_backends.rocm.solution_tables` from the tables Debian's
hipBLASLt 7.1.1 ships, for every architecture Debian builds. No library is loaded:
the tables are msgpack files, read in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from amd_archive import AmdRoot

from unimatmul.interop.tunableop import TunableOpGemm, TunableOpSolution, TunableOpValidators, write
from unimatmul_backends.rocm.solution_tables import (
    TENSILE_TYPES,
    Solution,
    SolutionNotFound,
    SolutionTables,
    main,
    resolve,
    resolve_file,
)

DATA = Path(__file__).parents[1] / "interop" / "data"
DTYPES = {tensile: torch for torch, tensile in TENSILE_TYPES.items()}


@pytest.fixture(scope="module")
def tables(amd: AmdRoot) -> SolutionTables:
    return SolutionTables.beside(amd.hipblaslt)


def validators(arch: str) -> TunableOpValidators:
    return TunableOpValidators.rocm(
        "2.9.0",
        gcn_arch_name=f"{arch}:sramecc+:xnack-",
        rocblas_version="4.4.1",
        hipblaslt_version="100100-dfsg",
        hip_version="604",
    )


def sample(tables: SolutionTables, arch: str) -> Solution:
    """A plain one-dtype GEMM solution of ``arch``, from the middle of its table."""
    for table, _start, _end in tables.ranges():
        if table.endswith(f"_{arch}") and "_Type_" in table:
            solutions = tables.table(table)
            middle = solutions[len(solutions) // 2]
            problem = middle.problem_type
            if problem["aType"] == problem["bType"] == problem["dType"] and problem["aType"] in DTYPES:
                return middle
    raise AssertionError(f"no plain GEMM table for {arch}")


def row_for(solution: Solution, index: int | None = None, *, flip: bool = False) -> TunableOpGemm:
    """The TunableOp row a torch on that GPU would write for this solution (BLAS view)."""
    problem = solution.problem_type
    trans_a, trans_b = bool(problem["transA"]), bool(problem["transB"])
    if flip:
        trans_a = not trans_a
    m, n, k = 256, 128, 64
    return TunableOpGemm(
        kind="gemm",
        dtype_a=DTYPES[problem["aType"]],
        transa="t" if trans_a else "n",
        transb="t" if trans_b else "n",
        m=m,
        n=n,
        k=k,
        lda=k if trans_a else m,
        ldb=n if trans_b else k,
        ldc=m,
        solution=TunableOpSolution.hipblaslt(solution.index if index is None else index),
        time_ms=0.01,
    )


def test_every_table_holds_the_range_the_mapping_gives(tables: SolutionTables) -> None:
    """How hipBLASLt finds an index's table, checked on every table of every architecture."""
    seen: set[int] = set()
    for table, start, end in tables.ranges():
        indices = [s.index for s in tables.table(table)]
        assert indices, table
        assert min(indices) == start, table
        assert end is None or max(indices) < end, table
        assert len(set(indices)) == len(indices), f"{table} repeats an index"
        assert seen.isdisjoint(indices), f"{table} shares indices with another table"
        seen.update(indices)
    print(f"{len(seen)} solutions, indices {min(seen)}..{max(seen)}, architectures {tables.architectures()}")
    assert len(seen) == max(seen) - min(seen) + 1, "the indices of one build are one contiguous run"


def test_debian_builds_these_architectures(tables: SolutionTables) -> None:
    archs = tables.architectures()
    assert {"gfx908", "gfx90a", "gfx1100", "gfx1201"} <= set(archs)
    assert {table.rsplit("_", 1)[-1] for table, _s, _e in tables.ranges()} == set(archs)


def test_a_tunableop_index_names_a_real_kernel_on_each_architecture(
    tables: SolutionTables, tmp_path: Path
) -> None:
    for arch in tables.architectures():
        solution = sample(tables, arch)
        path = tmp_path / f"tunableop_results_{arch}.csv"
        write(path, validators(arch), [row_for(solution)])
        ((gemm, found),) = resolve_file(tables, path)
        assert found == solution, (arch, found)
        assert isinstance(found, Solution) and found.kernel_name.startswith("Cijk_")
        assert found.arch == arch and found.table.endswith(arch)
        assert gemm.solution == TunableOpSolution(f"Gemm_Hipblaslt_{solution.index}")


def test_an_index_of_another_architecture_is_refused(tables: SolutionTables) -> None:
    gfx90a, gfx1100 = sample(tables, "gfx90a"), sample(tables, "gfx1100")
    with pytest.raises(SolutionNotFound, match=r"is a gfx1100 solution in these tables .*, not gfx90a"):
        resolve(tables, row_for(gfx90a, index=gfx1100.index), "gfx90a")


def test_a_solution_of_another_layout_is_refused(tables: SolutionTables) -> None:
    solution = sample(tables, "gfx90a")
    with pytest.raises(ValueError, match=r"does not solve .*: transA is"):
        resolve(tables, row_for(solution, flip=True), "gfx90a")


def test_an_index_past_the_last_table_is_not_found(tables: SolutionTables) -> None:
    last_table, _start, _end = list(tables.ranges())[-1]
    past = max(s.index for s in tables.table(last_table)) + 1
    with pytest.raises(SolutionNotFound, match=f"{past} is past the last one of these tables"):
        tables.solution(past)


def test_a_file_from_amds_own_gfx942_build_names_nothing_here(
    tables: SolutionTables, capsys: pytest.CaptureFixture[str], amd: AmdRoot
) -> None:
    """The repository's TunableOp file from an MI300 (gfx942, AMD's build): Debian built
    no gfx942 tables (and its numbers mean other kernels), so every row is refused."""
    path = DATA / "rocm_2.7_ld.csv"
    rows = resolve_file(tables, path)
    assert rows and all(isinstance(found, str) for _gemm, found in rows)
    assert all("none is gfx942" in found for _gemm, found in rows if isinstance(found, str))
    # The same numbers read as gfx90a: each is another build's kernel or none at all.
    for _gemm, found in resolve_file(tables, path, arch="gfx90a"):
        assert isinstance(found, str) and ("not gfx90a" in found or "past the last" in found), found
    assert main([str(path), "--library", str(amd.hipblaslt)]) == 1
    out = capsys.readouterr().out
    assert f"0 of {len(rows)} hipBLASLt rows name a kernel" in out


def test_the_command_line_names_the_kernels(
    tables: SolutionTables, tmp_path: Path, capsys: pytest.CaptureFixture[str], amd: AmdRoot
) -> None:
    solution = sample(tables, "gfx1100")
    path = tmp_path / "tunableop_results0.csv"
    write(path, validators("gfx1100"), [row_for(solution)])
    assert main([str(path), "--library", str(amd.hipblaslt)]) == 0
    out = capsys.readouterr().out
    assert f"Gemm_Hipblaslt_{solution.index} -> gfx1100 {solution.kernel_name}" in out
    assert "1 of 1 hipBLASLt rows name a kernel" in out
