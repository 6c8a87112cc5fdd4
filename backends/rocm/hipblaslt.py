"""HipblasltBackend: hipBLASLt solutions as Candidates, on the shared Lt driver.

The library is ``libhipblaslt.so`` through ctypes (:class:`CtypesLtLibrary` of the Lt
driver, bound with the hipBLASLt ABI table of the version the library reports). We
do not bind through hip-python: ROCm/hip-python ships hip, hiprtc, hipBLAS, hipFFT,
hipRAND, hipSOLVER, hipSPARSE, RCCL and rocTX modules but no hipBLASLt one, and the
C API through ctypes is the same path the cuBLASLt backend exercises on real NVIDIA
hardware.

Candidates: ``hipblasLtMatmulAlgoGetHeuristic`` with a large requested count
(``UNIMATMUL_HIPBLASLT_HEURISTICS``, default 256), in its order; then, through the
extension shim (:mod:`.hipblaslt_ext`, built at first use, never required), every other
solution of the GEMM type (``getAllAlgos``, what PyTorch TunableOp times) that the support
check accepts within the workspace limit, in the analytic order of :func:`tile_order`
(``UNIMATMUL_HIPBLASLT_POOL``: ``all``, a count, or ``0`` for the heuristic only).

Identity: ``hipblaslt/gemm?index=<i>[&solution=s:<fingerprint>]``: ``i`` is the solution
index hipBLASLt keeps in the first 4 bytes of the algo (``LtABI.solution_index``), the
same index PyTorch TunableOp writes as ``Gemm_Hipblaslt_<i>``; with the shim, the
fingerprint of the solution's name (:func:`name_fingerprint`), because indices move
between library builds. The records carry the library version as torch writes it
(``<hipblasLtGetVersion>-<hipblasLtGetGitRevision>``, e.g. ``1000-a6254b89-dirty``).

Rebuilding an algo from an identity (``prepare``, ``check``): with the shim,
``getAlgosFromIndex`` and the support check; a name that the index no longer has is
looked up among the type's solutions, and refused when none has it (never a silent
different kernel). Without it (the C API has neither ``getAlgosFromIndex`` nor
``hipblasLtMatmulAlgoCheck``), the heuristic is re-run for the problem with
:data:`REBUILD_COUNT` results and the algo whose index matches is taken: an index the
heuristic does not return for that problem is reported as unsupported, and so is an
identity with a name (nothing here could check it).

Grouped GEMMs (``Problem.op == "grouped_gemm"``, ``torch._grouped_mm``'s 2-D x 3-D form):
``hipblaslt_ext::GroupedGemm`` through the shim's user-args form (:mod:`.hipblaslt_grouped`),
on this backend's handle, library, version and error mapping, so a grouped record carries
the same ``hipblaslt`` version and its kernels the same backend name. Candidates: every
solution of the grouped type that supports the problem within the workspace limit, as the
library lists them (one listing per layout, cached); identity
``hipblaslt/grouped?index=<i>[&solution=s:<fingerprint>]``. Without the shim, or with one
built without the user-args form, and for the other forms, grouped problems get
UnsupportedProblem saying why.

hipBLASLt 0.1 / 0.2 (ROCm 5.5 / 5.6) kept pointers in the algo struct, so their
algos have no index and no stable identity: those versions are refused.

Nothing here has run on an AMD GPU. CI drives it through a fake libhipblaslt and a fake
shim, and ``tests/amd_real`` drives the descriptor calls through Debian's real
libhipblaslt 1.1 and builds, links and loads the shim against it (no device there: the
handle is never made, see ``load_driver``).
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from unimatmul import settings
from unimatmul.backend import LRU, Candidate, Problem, Runner, Target, UnsupportedProblem
from unimatmul_backends.lt.abi import (
    HIPBLASLT_ONLY_SIGNATURES,
    LT_SHARED_SIGNATURES,
    LtABI,
    select_hipblaslt_abi,
)
from unimatmul_backends.lt.backend import GEMM, LtBackend
from unimatmul_backends.lt.driver import CtypesLtLibrary, LtAlgo, LtDriver, LtError, LtPlan
from unimatmul_backends.lt.runner import ArrayHooks
from unimatmul_backends.rocm import hipblaslt_grouped
from unimatmul_backends.rocm.hipblaslt_ext import ExtAPI, HipblasltExt, load_ext
from unimatmul_backends.rocm.hipblaslt_grouped import GroupedSolution, MoeLayout
from unimatmul_backends.rocm.hipblaslt_identity import NAME, name_fingerprint
from unimatmul_backends.rocm.libraries import (
    ENV_HIPBLASLT,
    LibraryChoice,
    hip_device_reason,
    hip_runtime_device_reason,
    load_library,
)

#: Sonames to try: .so.0 (ROCm 5.7-6.x), .so.1 (ROCm 7).
LIBRARY_NAMES = ("libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0")
#: Results asked of the heuristic when an index is rebuilt (prepare, check).
REBUILD_COUNT = 1024
_REVISION_BYTES = 128  # what torch and hipblaslt-bench pass to hipblasLtGetGitRevision


_MACRO_TILE = re.compile(r"_MT(\d+)x(\d+)x(\d+)")


def solution_candidate(index: int, name: str | None = None) -> Candidate:
    """The Candidate of one hipBLASLt solution (TunableOp's ``Gemm_Hipblaslt_<index>``).

    ``name``: the solution's name (``getSolutionNameFromAlgo``) when it was measured; a
    library build in which the index names another solution re-resolves it by name
    (``algo_from_params``).
    """
    if name:
        return Candidate.make(NAME, GEMM, index=int(index), solution=name_fingerprint(name))
    return Candidate.make(NAME, GEMM, index=int(index))


def tile_order(m: int, n: int, name: str) -> tuple[float, int]:
    """The analytic order of one solution for an m x n output (smaller first).

    The macro tile in a Tensile solution or kernel name (``MT<m>x<n>x<depth>``): first the share of
    the tiles' area that holds output (the rest is padding work), then the larger tile
    (more reuse per loaded byte). A name without a tile sorts last.
    """
    found = _MACRO_TILE.search(name)
    if found is None:
        return (2.0, 0)
    mt0, mt1 = int(found.group(1)), int(found.group(2))
    if mt0 < 1 or mt1 < 1:
        return (2.0, 0)
    covered = math.ceil(m / mt0) * mt0 * math.ceil(n / mt1) * mt1
    return (1.0 - round((m * n) / covered, 2), -(mt0 * mt1))


def read_version(cdll: Any) -> tuple[int, str]:
    """(``hipblasLtGetVersion``, ``hipblasLtGetGitRevision``) through a handle of its own.

    Call it only once a HIP device is known to be there (``hip_runtime_device_reason``):
    without one, ``hipblasLtCreate`` ends the process. Both take a handle, and which ABI
    table applies depends on the version, so this binds only the three functions whose
    C shape is the same in every release.
    """
    signatures = {
        "hipblasLtCreate": LT_SHARED_SIGNATURES["Create"],
        "hipblasLtDestroy": LT_SHARED_SIGNATURES["Destroy"],
        "hipblasLtGetVersion": HIPBLASLT_ONLY_SIGNATURES["GetVersion"],
        "hipblasLtGetGitRevision": HIPBLASLT_ONLY_SIGNATURES["GetGitRevision"],
    }
    fns = {}
    for symbol, signature in signatures.items():
        fn = getattr(cdll, symbol)
        fn.restype = signature.restype
        fn.argtypes = list(signature.argtypes)
        fns[symbol] = fn
    handle = ctypes.c_void_p()
    status = fns["hipblasLtCreate"](ctypes.byref(handle))
    if status != 0:
        msg = f"hipblasLtCreate returned status {status} (is a HIP device visible?)"
        raise OSError(msg)
    try:
        version = ctypes.c_int(0)
        status = fns["hipblasLtGetVersion"](handle, ctypes.byref(version))
        if status != 0:
            msg = f"hipblasLtGetVersion returned status {status}"
            raise OSError(msg)
        revision = ctypes.create_string_buffer(_REVISION_BYTES)
        # Older builds may lack the revision; the version alone still selects the table.
        if fns["hipblasLtGetGitRevision"](handle, revision) != 0:
            revision.value = b""
    finally:
        fns["hipblasLtDestroy"](handle)
    return int(version.value), revision.value.decode("ascii", "replace")


def select_abi(version: int) -> LtABI:
    """The ABI table for ``version``; refuses releases whose algos have no index."""
    abi = select_hipblaslt_abi(version)
    if abi.solution_index_offset is None:
        msg = (
            f"{abi.label} keeps pointers in its algo struct: its algos have no solution index and "
            "cannot be stored; hipBLASLt 0.3 (ROCm 5.7) or newer is needed"
        )
        raise OSError(msg)
    return abi


Loader = Callable[[], tuple[Any, LibraryChoice]]
#: (library path, version, revision, ABI table) -> the bound shim; raises when there is none.
ExtLoader = Callable[[str, int, str, LtABI], ExtAPI]


def _load_hipblaslt() -> tuple[Any, LibraryChoice]:
    return load_library(LIBRARY_NAMES, ENV_HIPBLASLT, "libhipblaslt")


class HipblasltBackend(LtBackend):
    """AMD hipBLASLt on torch tensors of a ROCm build (see the module docstring).

    ``loader``, ``device_check``, ``runtime_check`` and ``hooks`` exist for the contract
    tests, which run without an AMD GPU: a fake library, no device checks, host-memory
    array hooks. ``runtime_check`` runs after the library is loaded and before its first
    handle: ``hipblasLtCreate`` ends the process when no device is visible.
    """

    name = NAME
    version_name = NAME
    device_kinds = frozenset({"hip"})
    array_kinds = frozenset({"torch"})
    ops = frozenset({"gemm", "scaled_gemm", "grouped_gemm"})

    def __init__(
        self,
        *,
        loader: Loader | None = None,
        device_check: Callable[[], str | None] = hip_device_reason,
        runtime_check: Callable[[], str | None] = hip_runtime_device_reason,
        hooks: Callable[[Target], ArrayHooks] | None = None,
        ext_loader: ExtLoader = load_ext,
    ) -> None:
        super().__init__()
        self._loader = loader or _load_hipblaslt
        self._ext_loader = ext_loader
        #: The extension shim (None: the heuristic path only; ``ext_reason`` says why).
        self.ext: ExtAPI | None = None
        self.ext_reason = "not loaded yet"
        # Per GEMM type (operations, data and compute types): getAllAlgos's list.
        self._pools: LRU[tuple[Any, ...], list[LtAlgo]] = LRU(64)
        self._device_check = device_check
        self._runtime_check = runtime_check
        self._hooks_factory = hooks
        self.location: LibraryChoice | None = None
        self.revision = ""
        # Bounded: each entry holds up to REBUILD_COUNT algos of one problem layout.
        self._heuristics: LRU[tuple[Any, int], dict[int, LtAlgo]] = LRU(256)
        # Per grouped layout and workspace limit: the grouped type's solutions that support
        # it (one listing serves candidates, check and every prepare of the layout).
        self._grouped: LRU[tuple[MoeLayout, int], list[GroupedSolution]] = LRU(64)

    # --- the library ------------------------------------------------------------------
    def load_driver(self) -> LtDriver:
        cdll, where = self._loader()
        # Before any handle: without a device hipblasLtCreate calls exit(1).
        no_device = self._runtime_check()
        if no_device is not None:
            raise OSError(no_device)
        version, revision = read_version(cdll)
        abi = select_abi(version)
        driver = LtDriver(abi, CtypesLtLibrary(abi, cdll, where.path))
        self.location, self.revision = where, revision
        try:
            self.ext, self.ext_reason = self._ext_loader(where.path, version, revision, abi), ""
        except Exception as exc:  # no compiler, no headers, another version: the heuristic stays
            self.ext, self.ext_reason = None, f"{type(exc).__name__}: {exc}"
        return driver

    def availability(self) -> str | None:
        reasons = []
        device = self._device_check()
        if device is not None:
            reasons.append(device)
        library = super().availability()
        if library is not None:
            reasons.append(f"libhipblaslt: {library}")
        return "; ".join(reasons) or None

    def format_version(self, version: int) -> str:
        # As torch's TunableOp writes HIPBLASLT_VERSION (>= 2.5), so imported files match.
        return f"{version}-{self.revision}" if self.revision else str(version)

    @property
    def heuristic_count(self) -> int:
        return settings.HIPBLASLT_HEURISTICS.get()

    @property
    def exhaustive(self) -> bool:
        """With the shim, every solution of the type is offered (``extra_params``)."""
        try:
            self.driver()
        except UnsupportedProblem:
            return False
        return self.ext is not None and settings.HIPBLASLT_POOL.get() != 0

    def hooks(self, target: Target) -> ArrayHooks:
        if self._hooks_factory is not None:
            return self._hooks_factory(target)
        return super().hooks(target)

    def close(self) -> None:
        self._heuristics.clear()
        self._pools.clear()
        self._grouped.clear()
        super().close()

    # --- grouped GEMMs: hipblaslt_ext::GroupedGemm through the shim (hipblaslt_grouped) --
    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        if not problem.is_grouped:
            return super().candidates(problem, target)
        found = self._grouped_solutions(problem, target)
        return list(dict.fromkeys(hipblaslt_grouped.solution_candidate(s) for s in found))

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        if not problem.is_grouped:
            return super().check(problem, candidate, target)
        try:
            hipblaslt_grouped.resolve(self._grouped_solutions(problem, target), candidate)
        except Exception:
            return False
        return True

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        if not problem.is_grouped:
            return super().prepare(problem, candidate, target)
        solutions = self._grouped_solutions(problem, target)
        ext, hooks, adapter = self._grouped_ext(problem), self.hooks(target), target.adapter
        with hooks.device():
            try:
                return hipblaslt_grouped.prepare(
                    ext, self.driver().handle, problem, candidate, self.workspace_limit,
                    lambda nbytes: hooks.empty_strided((nbytes,), (1,), "u8"),
                    adapter.torch, adapter.torch_device(target.device),  # type: ignore[attr-defined]
                    hooks.stream, solutions,
                )  # fmt: skip
            except LtError as exc:
                msg = f"{NAME} rejects {candidate.identity} for {problem.key}: {type(exc).__name__}: {exc}"
                raise UnsupportedProblem(msg, problem=problem, backend=NAME) from exc

    def _grouped_ext(self, problem: Problem) -> HipblasltExt:
        """The shim, with GroupedGemm's user-args form; UnsupportedProblem says why there is none."""
        self.driver()  # UnsupportedProblem without the library or a device; loads the shim
        why = hipblaslt_grouped.unavailable(self.ext, self.ext_reason)
        if why or not isinstance(self.ext, HipblasltExt):
            raise UnsupportedProblem(f"{NAME}: {why}", problem=problem, backend=NAME)
        return self.ext

    def _grouped_solutions(self, problem: Problem, target: Target) -> list[GroupedSolution]:
        """The grouped type's solutions that support ``problem``'s layout within the workspace
        limit, in the library's order (listed on a GroupedGemm of the layout, cached)."""
        layout = hipblaslt_grouped.moe_layout(problem)  # UnsupportedProblem before any library work
        if target.array_kind != "torch":
            msg = f"{NAME}'s grouped GEMM runs on torch tensors, not {target.array_kind} arrays"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
        ext, limit = self._grouped_ext(problem), self.workspace_limit
        found = self._grouped.get((layout, limit))
        if found is None:
            hooks = self.hooks(target)
            try:
                with (
                    hooks.device(),
                    hipblaslt_grouped.set_up(ext, self.driver().handle, layout, limit) as listing,
                ):
                    found = listing.solutions()
            except LtError as exc:  # the library refuses the problem itself
                msg = f"{NAME} has no grouped GEMM for {problem.key}: {exc}"
                raise UnsupportedProblem(msg, problem=problem, backend=NAME) from exc
            self._grouped.put((layout, limit), found)
        return found

    # --- the algo codec: the solution index and, with the shim, the solution's name -----
    def algo_params(self, plan: LtPlan, algo: LtAlgo) -> dict[str, Any]:
        params: dict[str, Any] = {"index": plan.driver.abi.solution_index(algo.data)}
        name = self._solution_name(plan, algo)
        if name:
            params["solution"] = name_fingerprint(name)
        return params

    def _solution_name(self, plan: LtPlan, algo: LtAlgo) -> str:
        """The solution's name, else its kernel's ("" without the shim or without names).

        The solution name, because kernel names are shared: a large gfx90a table of Debian's
        build holds 902 solutions with 902 names but 244 kernel names (the same code with
        another GSU and the like; ``docs/rocm.md``).
        """
        if self.ext is None:
            return ""
        return self.ext.solution_name(plan, algo) or self.ext.kernel_name(plan, algo)

    def _pool(self, plan: LtPlan) -> list[LtAlgo]:
        """getAllAlgos for the plan's GEMM type (cached: it depends on the type only)."""
        assert self.ext is not None
        gemm = plan.gemm
        key = (gemm.trans_a, gemm.trans_b, tuple(sorted(plan.types.items())), plan.compute)
        found = self._pools.get(key)
        if found is None:
            found = self.ext.all_algos(plan)
            self._pools.put(key, found)
        return found

    def extra_params(self, plan: LtPlan, seeds: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every other solution of the type that supports the plan, in the analytic order.

        Pruned before anything is measured: solutions the support check refuses, those over
        the workspace limit, repeats of an index; ``UNIMATMUL_HIPBLASLT_POOL=N`` keeps the N
        first of the order (:func:`tile_order`), ``all`` every one.
        """
        if self.ext is None:
            return []
        abi, limit = plan.driver.abi, plan.workspace_limit
        seen = {int(p["index"]) for p in seeds}
        pool = self._pool(plan)
        kept: list[tuple[tuple[float, int], int, dict[str, Any]]] = []
        for algo in pool:
            index = abi.solution_index(algo.data)
            if index in seen:
                continue
            seen.add(index)
            checked = self.ext.supported(plan, algo)
            if checked is None or checked.workspace > limit:
                continue
            name = self._solution_name(plan, checked)
            params: dict[str, Any] = {"index": index}
            if name:
                params["solution"] = name_fingerprint(name)
            kept.append((tile_order(plan.gemm.m, plan.gemm.n, name), index, params))
        kept.sort(key=lambda item: (item[0], item[1]))
        cap = settings.HIPBLASLT_POOL.get()
        if cap > 0:
            kept = kept[:cap]
        self.last_search = {"type_pool": len(pool), "offered": len(kept), "seeds": len(seeds)}
        return [params for _, _, params in kept]

    def _by_index(self, plan: LtPlan) -> dict[int, LtAlgo]:
        """The heuristic's algos for ``plan``'s layout, by solution index (cached)."""
        key = (plan.gemm, plan.workspace_limit)
        found = self._heuristics.get(key)
        if found is None:
            abi = plan.driver.abi
            algos = plan.heuristics(max(REBUILD_COUNT, self.heuristic_count))
            found = {}
            for algo in algos:
                # An index can come back twice (hipBLASLt lists "fallback" copies of the
                # plain kernels first); the first one is what the heuristic ranks best.
                found.setdefault(abi.solution_index(algo.data), algo)
            self._heuristics.put(key, found)
        return found

    def algo_from_params(self, plan: LtPlan, params: Mapping[str, Any]) -> LtAlgo:
        index = params.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            msg = f"a hipBLASLt identity needs an int 'index', got {dict(params)}"
            raise ValueError(msg)
        name = params.get("solution")
        if name is not None and not isinstance(name, str):
            msg = f"a hipBLASLt identity's 'solution' is a name's fingerprint, got {name!r}"
            raise ValueError(msg)
        if self.ext is not None:
            return self._rebuild(plan, index, name)
        if name is not None:
            msg = (
                f"solution {index} was measured as the solution named {name}; without the extension "
                f"shim ({self.ext_reason}) this library cannot say which solution the index names now"
            )
            raise UnsupportedProblem(msg, backend=NAME)
        algos = self._by_index(plan)
        algo = algos.get(index)
        if algo is None:
            msg = (
                f"solution {index} is not among the {len(algos)} the heuristic returns for this "
                f"problem (hipBLASLt's C API cannot rebuild an algo from an index otherwise)"
            )
            raise UnsupportedProblem(msg, backend=NAME)
        return algo

    def _rebuild(self, plan: LtPlan, index: int, name: str | None) -> LtAlgo:
        """getAlgosFromIndex, the support check, and the name checked (or re-resolved).

        ``name`` is the fingerprint of the solution's name when it was measured: an index
        that names another solution in this build is looked up by that name among the
        type's solutions, and refused when none has it.
        """
        assert self.ext is not None
        abi = plan.driver.abi
        algo = None
        for found in self.ext.from_index(plan, [index]):
            if abi.solution_index(found.data) == index:
                algo = self.ext.supported(plan, found)
                break
        if name is None:
            if algo is not None:
                return algo
            msg = f"solution {index} does not exist in this hipBLASLt build or does not support the problem"
            raise UnsupportedProblem(msg, backend=NAME)
        if not self.ext.has_kernel_name:
            msg = f"solution {index} was measured by name; this hipBLASLt build has no names to check it"
            raise UnsupportedProblem(msg, backend=NAME)
        if algo is not None and name_fingerprint(self._solution_name(plan, algo)) == name:
            return algo
        # Indices move between builds; the name is what was measured.
        for candidate in self._pool(plan):
            if name_fingerprint(self._solution_name(plan, candidate)) == name:
                moved = self.ext.supported(plan, candidate)
                if moved is not None:
                    return moved
        msg = (
            f"solution {index} no longer is the solution named {name} in this hipBLASLt build, and no "
            f"solution of the type is: the entry must be re-tuned"
        )
        raise UnsupportedProblem(msg, backend=NAME)
