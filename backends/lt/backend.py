"""LtBackend: a Backend on the shared Lt driver; cuBLASLt and hipBLASLt subclass it.

A subclass says how to load its library (``load_driver``) and how an algo is named
(``algo_params`` / ``algo_from_params``: its algo codec); this class does the rest:

* **Candidates**: the library's heuristic list (``UNIMATMUL_LT_HEURISTICS``, default
  16), named by configuration, duplicates dropped; optionally an exhaustive search
  (``UNIMATMUL_LT_EXHAUSTIVE=1``, through ``extra_params``); and, when a leading
  dimension or pointer breaks 16-byte alignment, alignment candidates that run the best
  few heuristic algos (``UNIMATMUL_LT_PAD_HEURISTICS``, default 2) of the problem on
  padded copies: ``pad`` rounds leading dimensions up, ``pad-dims`` the dimensions too.
* **prepare** rebuilds the algo from the candidate's parameters, so what is measured is
  exactly what a stored identity reproduces, and returns an LtRunner / PaddedRunner.
* **Scaled (fp8) GEMMs** (``Problem.op == "scaled_gemm"``): the same heuristic and
  exhaustive candidates on the plan of ``layout.lt_scaled_gemm`` (scale modes and fast
  accumulation in the descriptor), run by a ScaledLtRunner; no alignment candidates
  (the padded copies would need scaled copies too). The plan's scale pointers are set
  to a small device buffer while the library lists and checks algos, as torch has real
  ones set by then; a runner sets the caller's before its first call.
* **check** re-validates a stored identity against the library now loaded.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from unimatmul import settings
from unimatmul.backend import Backend, Candidate, Problem, Runner, Target, UnsupportedProblem
from unimatmul_backends.lt.driver import LtAlgo, LtDriver, LtPlan
from unimatmul_backends.lt.layout import LtGemm, lt_problem, padded_problem
from unimatmul_backends.lt.runner import ArrayHooks, LtRunner, PaddedRunner, ScaledLtRunner, array_hooks

GEMM = "gemm"  # candidate name: an algo on the caller's own memory
PAD = "pad"  # candidate name: an algo on copies with aligned leading dimensions
PAD_DIMS = "pad-dims"  # ... on copies whose dimensions are rounded up to 16 bytes too
PADS = {PAD: False, PAD_DIMS: True}  # candidate name -> padded_problem(dims=...)
NAMES = (GEMM, *PADS)


class LtBackend(Backend):
    """Candidates and runners on the Lt driver (see the module docstring)."""

    #: Key of the library version in ``versions()`` (and so in every TuningRecord).
    version_name: ClassVar[str]

    def __init__(self) -> None:
        self._driver: LtDriver | None = None
        self._error: str | None = None
        self._lock = threading.Lock()
        self._hooks: dict[tuple[str, int], ArrayHooks] = {}
        # Per array hooks (one device): a small device buffer whose address stands in for
        # a scaled plan's scales while no caller's scales exist yet (kept with its hooks).
        self._scale_stand_ins: dict[int, tuple[ArrayHooks, Any, int]] = {}
        #: Counts of the last exhaustive search (for reports).
        self.last_search: dict[str, int] = {}

    # --- what a subclass provides ---------------------------------------------------
    @abstractmethod
    def load_driver(self) -> LtDriver:
        """Load the library and make a driver; raise with a clear reason if impossible."""

    @abstractmethod
    def algo_params(self, plan: LtPlan, algo: LtAlgo) -> dict[str, int]:
        """The identity of an algo: a few ints that ``algo_from_params`` rebuilds it from."""

    @abstractmethod
    def algo_from_params(self, plan: LtPlan, params: Mapping[str, Any]) -> LtAlgo:
        """The checked algo of an identity on ``plan``; raise if the library rejects it."""

    def extra_params(self, plan: LtPlan, seeds: Sequence[Mapping[str, int]]) -> list[dict[str, int]]:
        """Exhaustive mode: identities beyond the heuristic ``seeds`` (default: none)."""
        return []

    def format_version(self, version: int) -> str:
        return str(version)

    # --- settings ---------------------------------------------------------------------
    @property
    def heuristic_count(self) -> int:
        return settings.LT_HEURISTICS.get()

    @property
    def pad_count(self) -> int:
        return settings.LT_PAD_HEURISTICS.get()

    @property
    def workspace_limit(self) -> int:
        return settings.LT_WORKSPACE_MB.get() << 20

    @property
    def exhaustive(self) -> bool:
        return settings.LT_EXHAUSTIVE.get()

    # --- the library ------------------------------------------------------------------
    def driver(self) -> LtDriver:
        if self._driver is None and self._error is None:
            with self._lock:
                if self._driver is None and self._error is None:
                    try:
                        self._driver = self.load_driver()
                    except Exception as exc:  # missing library, unknown version, bad path
                        self._error = f"{type(exc).__name__}: {exc}"
        if self._driver is None:
            msg = f"{self.name} is unavailable: {self._error}"
            raise UnsupportedProblem(msg, backend=self.name)
        return self._driver

    def availability(self) -> str | None:
        try:
            self.driver()
        except UnsupportedProblem:
            return self._error
        return None

    def versions(self) -> dict[str, str]:
        return {self.version_name: self.format_version(self.driver().version())}

    def hooks(self, target: Target) -> ArrayHooks:
        key = (target.array_kind, target.device.index)
        found = self._hooks.get(key)
        if found is None:
            found = self._hooks[key] = array_hooks(target)
        return found

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # --- plans ------------------------------------------------------------------------
    def _plan(self, gemm: LtGemm, hooks: ArrayHooks) -> LtPlan:
        """The library's descriptors for ``gemm``; a scaled one points at stand-in scales."""
        plan = self.driver().plan(gemm, self.workspace_limit)
        if gemm.scaled:
            found = self._scale_stand_ins.get(id(hooks))
            if found is None:
                buf = hooks.empty_strided((64,), (1,), "f32")
                found = self._scale_stand_ins[id(hooks)] = (hooks, buf, hooks.ptr(buf))
            plan.set_scales(found[2], found[2])
        return plan

    # --- candidates -------------------------------------------------------------------
    def _heuristic_params(
        self, problem: Problem, count: int, exhaustive: bool, hooks: ArrayHooks
    ) -> list[dict[str, int]]:
        plan = self._plan(lt_problem(problem), hooks)
        try:
            params = [self.algo_params(plan, algo) for algo in plan.heuristics(count)]
            if exhaustive:
                params += self.extra_params(plan, params)
        finally:
            plan.close()
        return params

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        lt_problem(problem)  # UnsupportedProblem before any library work
        hooks = self.hooks(target)
        found: list[Candidate] = []
        errors: list[str] = []
        with hooks.device():
            try:
                for params in self._heuristic_params(problem, self.heuristic_count, self.exhaustive, hooks):
                    found.append(Candidate.make(self.name, GEMM, **params))
            except UnsupportedProblem:
                raise
            except Exception as exc:  # the library refused the layout: padding may still work
                errors.append(f"{type(exc).__name__}: {exc}")
            seen: set[Problem] = set()
            for name, dims in PADS.items():
                if problem.is_scaled:
                    break  # a padded copy of fp8 data would need its scales copied and padded too
                padded, copied = padded_problem(problem, dims=dims)
                if not copied or not self.pad_count or padded in seen:
                    continue
                if problem.has_bias and padded.n != problem.n:
                    continue  # the bias vector would be read past its end
                seen.add(padded)
                try:
                    for params in self._heuristic_params(padded, self.pad_count, False, hooks):
                        found.append(Candidate.make(self.name, name, **params))
                except Exception as exc:
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")
        if not found and errors:
            raise UnsupportedProblem(
                f"{self.name} offers no algo for {problem.key}: {'; '.join(errors)}", problem=problem
            )
        return list(dict.fromkeys(found))

    # --- runners ----------------------------------------------------------------------
    def _algo(self, plan: LtPlan, candidate: Candidate, problem: Problem) -> LtAlgo:
        try:
            algo = self.algo_from_params(plan, dict(candidate.params))
        except Exception as exc:
            plan.close()
            raise UnsupportedProblem(
                f"{self.name} rejects {candidate.identity} for {problem.key}: {type(exc).__name__}: {exc}",
                problem=problem,
            ) from exc
        if algo.workspace > self.workspace_limit:
            plan.close()
            raise UnsupportedProblem(
                f"{candidate.identity} needs {algo.workspace} bytes of workspace, over the "
                f"limit of {self.workspace_limit} (UNIMATMUL_LT_WORKSPACE_MB)",
                problem=problem,
            )
        return algo

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        if candidate.backend != self.name or candidate.name not in NAMES:
            raise UnsupportedProblem(f"{candidate.identity} is not a {self.name} candidate", problem=problem)
        hooks = self.hooks(target)
        with hooks.device():
            if candidate.name == GEMM:
                gemm = lt_problem(problem)
                plan = self._plan(gemm, hooks)
                kind = ScaledLtRunner if gemm.scaled else LtRunner
                return kind(plan, self._algo(plan, candidate, problem), candidate, hooks)
            if problem.is_scaled:
                raise UnsupportedProblem(f"{candidate.identity}: no padded scaled GEMMs", problem=problem)
            padded, copied = padded_problem(problem, dims=PADS[candidate.name])
            if not copied:
                raise UnsupportedProblem(f"{problem.key} is aligned: no padding to do", problem=problem)
            if problem.has_bias and padded.n != problem.n:
                raise UnsupportedProblem(
                    f"{candidate.name} would read the bias past its end", problem=problem
                )
            plan = self._plan(lt_problem(padded), hooks)
            inner = LtRunner(plan, self._algo(plan, candidate, padded), candidate, hooks)
            return PaddedRunner(inner, problem, padded, copied, candidate, hooks)

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        """Whether the library now loaded still builds and accepts this identity."""
        if candidate.backend != self.name or candidate.name not in NAMES:
            return False
        try:
            hooks = self.hooks(target)
            with hooks.device():
                if candidate.name in PADS:
                    if problem.is_scaled:
                        return False
                    problem, copied = padded_problem(problem, dims=PADS[candidate.name])
                    if not copied:
                        return False
                plan = self._plan(lt_problem(problem), hooks)
                try:
                    self._algo(plan, candidate, problem)
                finally:
                    plan.close()
        except Exception:
            return False
        return True
