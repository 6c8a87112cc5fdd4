"""A TunableOp ROCm results file with real solution indices imports with every Hipblaslt row kept.

The file is written in TunableOp's public format (``unimatmul.interop.tunableop.write``)
for a gfx90a (an architecture Debian builds), one row per solution taken from the real
hipBLASLt 7.1.1 solution tables, each row's layout and dtype those of its solution (what
a torch on that GPU would have written). Imported through ``unimatmul cache import
tunableop``, every ``Gemm_Hipblaslt_<index>`` row must become an entry whose winner is that
hipBLASLt solution (none turned to Default), and the tables must name the kernel of each.
Before the extension shim such an index, outside the heuristic's answer, fell back to
Default when it was prepared; now it is rebuilt by ``getAlgosFromIndex`` (which needs a
GPU to run, so here only the import and the naming are checked).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from amd_archive import AmdRoot
from test_solution_tables import DTYPES, row_for, validators

from unimatmul.cache.protocol import open_store
from unimatmul.cli import main
from unimatmul.interop.tunableop import TunableOpGemm, write
from unimatmul_backends.rocm.hipblaslt import name_fingerprint, solution_candidate
from unimatmul_backends.rocm.solution_tables import Solution, SolutionTables, resolve_file

ARCH = "gfx90a"
NAMESPACE = "amd/gfx90a:sramecc+:xnack-/AMD Instinct MI210/104/torch"
TABLES_USED = 8  # plain-GEMM tables of gfx90a read (each a msgpack file)


def real_solutions(tables: SolutionTables) -> list[Solution]:
    """The first and last solution of each plain one-dtype GEMM table of ARCH."""
    found: list[Solution] = []
    used = 0
    for table, _start, _end in tables.ranges():
        if not table.endswith(f"_{ARCH}") or "_Type_" not in table:
            continue
        solutions = tables.table(table)
        problem = solutions[0].problem_type
        if not (problem["aType"] == problem["bType"] == problem["dType"] and problem["aType"] in DTYPES):
            continue
        if problem.get("useBias"):
            continue
        found += [solutions[0], solutions[-1]] if len(solutions) > 1 else [solutions[0]]
        used += 1
        if used == TABLES_USED:
            break
    return found


def distinct_rows(solutions: list[Solution]) -> list[TunableOpGemm]:
    """One row per solution, each its own problem (TunableOp keys rows by op and params)."""
    rows = []
    for i, solution in enumerate(solutions):
        row = row_for(solution)
        m = 64 * (i + 1)
        rows.append(
            TunableOpGemm(
                kind=row.kind,
                dtype_a=row.dtype_a,
                transa=row.transa,
                transb=row.transb,
                m=m,
                n=row.n,
                k=row.k,
                lda=row.k if row.transa == "t" else m,
                ldb=row.ldb,
                ldc=m,
                solution=row.solution,
                time_ms=row.time_ms,
            )
        )
    return rows


@pytest.fixture(scope="module")
def tables(amd: AmdRoot) -> SolutionTables:
    return SolutionTables.beside(amd.hipblaslt)


@pytest.fixture(scope="module")
def solutions(tables: SolutionTables) -> list[Solution]:
    return real_solutions(tables)


def test_every_hipblaslt_row_of_a_real_file_imports_as_its_solution(
    tables: SolutionTables, solutions: list[Solution], tmp_path: Path
) -> None:
    assert len(solutions) >= 2 * 4, "too few gfx90a GEMM tables to make the point"
    path = tmp_path / "tunableop_results0.csv"
    rows = distinct_rows(solutions)
    write(path, validators(ARCH), rows)
    assert path.read_text().count("Gemm_Hipblaslt_") == len(rows)
    # Every row names a real kernel of that build and architecture, of the row's own type.
    named = resolve_file(tables, path)
    assert [found for _gemm, found in named] == solutions
    cache = tmp_path / "cache.msgpack"
    out = io.StringIO()
    code = main(
        ["cache", "import", "tunableop", str(path), "--cache", str(cache), "--namespace", NAMESPACE], out
    )
    assert code == 0, out.getvalue()
    assert f"imported {len(rows)} entries" in out.getvalue()
    winners = sorted(record.winner for _ns, _key, record in open_store(cache).items(NAMESPACE))
    assert winners == sorted(solution_candidate(s.index).identity for s in solutions)
    assert not any(w.startswith("default/") for w in winners)
    print(f"{len(rows)} real gfx90a solutions from {len({s.table for s in solutions})} tables: all imported")


def test_kernel_names_repeat_where_solution_names_do_not(tables: SolutionTables) -> None:
    """Why a record stores the solution's name, not its kernel's (the first large gfx90a table)."""
    name, table = next(
        (t, tables.table(t))
        for t, _start, _end in tables.ranges()
        if t.endswith(f"_{ARCH}") and "_Type_" in t and len(tables.table(t)) > 100
    )
    kernels = {s.kernel_name for s in table}
    names = {s.name for s in table}
    print(f"{name}: {len(table)} solutions, {len(names)} names, {len(kernels)} kernels")
    assert len(kernels) < len(names) <= len(table)
    assert len(names) >= 0.99 * len(table)  # the odd repeat is a duplicate entry
    assert solution_candidate(5, table[0].name).identity == (
        f"hipblaslt/gemm?index=5&solution=s:{name_fingerprint(table[0].name)}"
    )
