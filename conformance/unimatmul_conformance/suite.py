"""The Suite: plans the checks for one backend on one device, runs them, reports.

Both ways of running the suite go through here: ``unimatmul conformance`` runs the
plan in a loop (:meth:`Suite.run`), the pytest plugin makes one test per check and
calls :meth:`Suite.run_check` from each.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from unimatmul._version import __version__
from unimatmul.backend import Backend, Candidate, Target
from unimatmul.core.arrays import CPU, Device, adapter_for_kind
from unimatmul.core.errors import BackendUnavailable
from unimatmul.core.platform import detect_platform
from unimatmul.core.problem import Problem
from unimatmul_conformance import checks as C
from unimatmul_conformance import gpu
from unimatmul_conformance.expectations import Expectations
from unimatmul_conformance.grouped import check_grouped, grouped_matrix
from unimatmul_conformance.loading import load_backend
from unimatmul_conformance.matrix import Case, build_matrix, make_problem
from unimatmul_conformance.numerics import CaseData, make_case_data
from unimatmul_conformance.report import FAILED, PASSED, SKIPPED, XFAILED, XPASSED, CheckResult, Report

# Array kinds in the order the suite prefers them, by device kind.
_PREFERENCE = {"cpu": ("numpy", "torch"), "cuda": ("torch", "cupy"), "hip": ("torch", "cupy")}
_NUMPY_DTYPES = frozenset({"f64", "f32", "f16"})


def parse_device(text: str) -> Device:
    kind, _, index = text.partition(":")
    if kind not in _PREFERENCE or (index and not index.isdigit()):
        msg = f"unknown device {text!r}; use cpu, cuda[:N] or hip[:N]"
        raise ValueError(msg)
    return Device(kind, int(index or 0))


def default_device(backend: Backend) -> Device:
    """The GPU the backend serves when one is present, else the CPU if it serves that."""
    kinds = backend.device_kinds
    if kinds & {"cuda", "hip"}:
        try:
            import torch

            if torch.cuda.is_available():
                kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
                if kind in kinds:
                    return Device(kind, 0)
        except ImportError:
            pass
    if "cpu" in kinds:
        return CPU
    msg = f"backend {backend.name!r} serves {sorted(kinds)} devices and none is present here"
    raise BackendUnavailable(msg, backend=backend.name)


def _holds(target: Target, dtype: str | None) -> bool:
    if dtype is None:
        return True
    if target.array_kind in ("numpy", "cupy"):
        return dtype in _NUMPY_DTYPES
    try:
        target.adapter.torch_dtype(dtype)  # type: ignore[attr-defined]
    except TypeError:
        return False
    return True


@dataclass
class Check:
    """One planned check: its id and what it looks at."""

    id: str
    name: str
    case: Case | None = None
    candidate: Candidate | None = None
    skip: str = ""  # planned as skipped, and why


@dataclass
class Suite:
    """The conformance suite for one backend on one device."""

    backend: Backend
    spec: str | None = None  # how the backend was named (for the fresh-process check)
    device: Device | None = None
    quick: bool = False
    expectations: Expectations | None = None
    only: frozenset[str] | None = None  # check names to run (None: all)
    seed: int = 0xC0FFEE
    threads: int = 4

    results: dict[str, CheckResult] = field(default_factory=dict, init=False)
    _plan: list[Check] | None = field(default=None, init=False)
    _cases: list[Case] | None = field(default=None, init=False)
    _offered: dict[tuple[str, str], Any] = field(default_factory=dict, init=False)
    _data: OrderedDict[str, CaseData] = field(default_factory=OrderedDict, init=False)
    _runs: dict[tuple[str, str], dict[str, C.Outcome]] = field(default_factory=dict, init=False)
    _started: float = field(default_factory=time.time, init=False)

    def __post_init__(self) -> None:
        backend = self.backend
        reason = backend.availability()
        if reason is not None:
            msg = f"backend {backend.name!r} is unavailable here: {reason}"
            raise BackendUnavailable(msg, backend=backend.name)
        if self.device is None:
            self.device = default_device(backend)
        if self.device.kind not in backend.device_kinds:
            msg = f"backend {backend.name!r} serves {sorted(backend.device_kinds)}, not {self.device.kind}"
            raise BackendUnavailable(msg, backend=backend.name)
        self.targets: dict[str, Target] = {}
        for kind in _PREFERENCE[self.device.kind]:
            if kind not in backend.array_kinds:
                continue
            try:
                self.targets[kind] = Target(adapter_for_kind(kind), self.device)
            except ImportError:
                continue
        if not self.targets:
            msg = (
                f"backend {backend.name!r} takes {sorted(backend.array_kinds)} arrays and none of those "
                f"libraries can be imported here for {self.device}"
            )
            raise BackendUnavailable(msg, backend=backend.name)
        self.primary = next(iter(self.targets))
        if self.expectations is None:
            self.expectations = Expectations.builtin(backend.name)
        if self.only is not None:
            unknown = set(self.only) - set(C.ALL)
            if unknown:
                msg = f"unknown checks {sorted(unknown)}; valid: {', '.join(C.ALL)}"
                raise ValueError(msg)

    # --- what the backend offers ----------------------------------------------------
    @property
    def target(self) -> Target:
        """The target of the preferred array kind."""
        return self.targets[self.primary]

    def offered_now(self, problem: Problem, kind: str) -> Any:
        """Ask the backend: a list of Candidates, or the exception it raised."""
        try:
            return list(self.backend.candidates(problem, self.targets[kind]))
        except Exception as exc:
            return exc

    def offered(self, case: Case) -> Any:
        key = (case.problem.key, case.kind)
        if key not in self._offered:
            self._offered[key] = self.offered_now(case.problem, case.kind)
        return self._offered[key]

    def offered_planned(self, label: str) -> list[str] | None:
        """The identities listed at planning for ``key@kind``, if it was a list."""
        key, _, kind = label.rpartition("@")
        found = self._offered.get((key, kind))
        return [c.identity for c in found] if isinstance(found, list) else None

    def other_candidates(self, case: Case) -> list[Candidate]:
        """Candidates offered for a different problem of the matrix (a stale cache entry)."""
        for other in self.cases:
            if other.problem.dtype_c != case.problem.dtype_c or other.problem.m != case.problem.m:
                offered = self.offered(other)
                if isinstance(offered, list) and offered:
                    return offered[:3]
        return []

    # --- the matrix and the plan ----------------------------------------------------
    @property
    def cases(self) -> list[Case]:
        if self._cases is None:
            self._cases = self._build_cases()
        return self._cases

    def _case(self, problem: Problem, alpha: float, beta: float, kind: str | None = None) -> Case:
        dtypes = {problem.dtype_a, problem.dtype_b, problem.dtype_c, problem.dtype_bias}
        kinds = [kind] if kind else list(self.targets)
        for name in kinds:
            if all(_holds(self.targets[name], d) for d in dtypes):
                return Case(problem, alpha, beta, name)
        held = sorted(d for d in dtypes if d)
        why = f"no array kind this backend takes ({', '.join(self.targets)}) holds {'/'.join(held)} here"
        return Case(problem, alpha, beta, self.primary, not_runnable=why)

    def _build_cases(self) -> list[Case]:
        def supports(problem: Problem) -> bool:
            case = self._case(problem, 1.0, 0.0)
            found = self.offered(case)
            return isinstance(found, list) and bool(found)

        assert self.device is not None
        specs = build_matrix(supports, quick=self.quick, gpu=self.device.kind != "cpu")
        cases = [self._case(p, a, b) for p, a, b in specs]
        # The other array kinds the backend takes, on a few problems of its main dtype.
        main = specs[0][0]
        dt = (main.dtype_a, main.dtype_b, main.dtype_c, main.compute)
        for kind in list(self.targets)[1:]:
            more = [
                (make_problem(31, 37, 41, dt), 1.0, 0.0),
                (make_problem(127, 129, 65, dt, trans=(True, False), pad=(1, 2, 3)), 1.0, 0.0),
                (
                    make_problem(31, 37, 41, dt, batch=2, beta_zero=False, pad=(0, 0, 2), batch_pad=1),
                    1.5,
                    0.5,
                ),
            ]
            cases += [self._case(p, a, b, kind) for p, a, b in (more[:1] if self.quick else more)]
        return cases

    def _special_cases(self) -> list[Case]:
        """Cases for the threads and GPU checks: a plain one, one with alpha, beta and padding,
        and a scaled (fp8, row-wise) one when the backend offers candidates for it."""
        main = self.cases[0].problem

        def first(test: Callable[[Case, Problem], bool]) -> list[Case]:
            for case in self.cases:
                p = case.problem
                if (
                    case.kind == self.primary
                    and (p.dtype_a, p.dtype_c) == (main.dtype_a, main.dtype_c)
                    and test(case, p)
                ):
                    return [case]
            return []

        plain = first(
            lambda c, p: (
                (p.m, p.n, p.k, p.batch, p.ldc, p.epilogue) == (127, 129, 65, 1, 129, "none")
                and not (p.trans_a or p.trans_b)
                and c.beta == 0.0
            )
        )
        scaled = first(lambda c, p: (p.m, p.n, p.k) == (31, 37, 41) and c.beta == -0.75)
        fp8 = [
            case
            for case in self.cases
            if case.problem.is_scaled
            and case.problem.scale_a == "rowwise"
            and case.problem.ldc == case.problem.n
            and not case.problem.fast_accum
            and not case.not_runnable
            and isinstance(self.offered(case), list)
            and self.offered(case)
        ]
        fp8.sort(key=lambda c: -c.problem.m)  # the largest: threads and graphs see whole tiles
        return (plain if self.quick else plain + scaled) + fp8[:1]

    def plan(self) -> list[Check]:
        if self._plan is None:
            self._plan = [c for c in self._make_plan() if self.only is None or c.name in self.only]
        return self._plan

    def _make_plan(self) -> list[Check]:
        plan = [Check(C.PLATFORM, C.PLATFORM), Check(C.IDENTITY, C.IDENTITY), Check(C.CACHE, C.CACHE)]
        base_seen: set[tuple[str, str, str, str]] = set()
        for case in self.cases:
            label = case.label
            plan.append(Check(f"{C.CANDIDATES}::{label}", C.CANDIDATES, case))
            p = case.problem
            base = (p.dtype_a, p.dtype_b, p.dtype_c, p.compute)
            if base not in base_seen and p.epilogue == "none":
                base_seen.add(base)
                plan.append(Check(f"{C.UNSUPPORTED}::{label}", C.UNSUPPORTED, case))
            offered = self.offered(case)
            if not isinstance(offered, list):
                continue
            for candidate in offered:
                if not isinstance(candidate, Candidate):
                    continue
                for name in C.RUN:
                    plan.append(
                        Check(
                            f"{name}::{label}::{candidate.identity}", name, case, candidate, case.not_runnable
                        )
                    )
        gpu = self.device is not None and self.device.kind != "cpu"
        for case in self._special_cases():
            offered = self.offered(case)
            if not isinstance(offered, list):
                continue
            for candidate in offered:
                ident = f"{case.label}::{candidate.identity}"
                plan.append(Check(f"{C.THREADS}::{ident}", C.THREADS, case, candidate))
                if gpu:
                    skip = (
                        "" if case.kind == "torch" else f"the GPU checks need torch arrays, not {case.kind}"
                    )
                    plan.append(Check(f"{C.GRAPH}::{ident}", C.GRAPH, case, candidate, skip))
                    plan.append(Check(f"{C.STREAM}::{ident}", C.STREAM, case, candidate, skip))
        plan += self._grouped_plan()
        if not gpu:
            plan.append(Check(C.GRAPH, C.GRAPH, skip="CPU target: no graphs"))
            plan.append(Check(C.STREAM, C.STREAM, skip="CPU target: no streams"))
        return plan

    def _grouped_plan(self) -> list[Check]:
        """The grouped matrix's checks, for a backend that names ``grouped_gemm`` in its ops."""
        if "grouped_gemm" not in getattr(self.backend, "ops", ()):
            return [
                Check(
                    C.GROUPED, C.GROUPED, skip="the backend names no grouped_gemm op: never asked about one"
                )
            ]
        if "torch" not in self.targets:
            return [
                Check(C.GROUPED, C.GROUPED, skip="grouped GEMMs run on torch tensors, which it does not take")
            ]
        plan = []
        for problem in grouped_matrix(self.quick):
            case = Case(problem, kind="torch")
            plan.append(Check(f"{C.CANDIDATES}::{case.label}", C.CANDIDATES, case))
            offered = self.offered(case)
            for candidate in offered if isinstance(offered, list) else []:
                if isinstance(candidate, Candidate):
                    ident = f"{C.GROUPED}::{case.label}::{candidate.identity}"
                    plan.append(Check(ident, C.GROUPED, case, candidate))
        return plan

    # --- running ----------------------------------------------------------------------
    def case_data(self, case: Case) -> CaseData:
        """Operands and reference of a case, shared by its candidates (a few kept)."""
        label = case.label
        found = self._data.get(label)
        if found is None:
            target = self.targets[case.kind]
            seed = self.seed ^ zlib.crc32(label.encode())
            found = make_case_data(case.problem, case.alpha, case.beta, target.adapter, target.device, seed)
            self._data[label] = found
            while len(self._data) > 2:
                self._data.popitem(last=False)
        return found

    def forget_case_data(self, case: Case) -> None:
        self._data.pop(case.label, None)

    def _outcome(self, check: Check) -> C.Outcome:
        if check.skip:
            return SKIPPED, check.skip
        name, case, candidate = check.name, check.case, check.candidate
        if name == C.PLATFORM:
            return C.check_platform(self)
        if name == C.IDENTITY:
            return C.check_identity_stable(self)
        if name == C.CACHE:
            return C.check_cache_roundtrip(self)
        assert case is not None
        if name == C.CANDIDATES:
            return C.check_candidates(self, case)
        if name == C.UNSUPPORTED:
            return C.check_unsupported(self, case)
        assert candidate is not None
        if name in C.RUN:
            key = (case.label, candidate.identity)
            if key not in self._runs:
                self._runs[key] = C.execute(self, case, candidate)
            return self._runs[key][name]
        if name == C.GROUPED:
            return check_grouped(self, case.problem, candidate)
        if name == C.THREADS:
            return C.check_threads(self, case, candidate, threads=self.threads)
        if name == C.GRAPH:
            return gpu.check_graph(self, case, candidate)
        if name == C.STREAM:
            return gpu.check_stream(self, case, candidate)
        msg = f"no check named {name!r}"
        raise ValueError(msg)

    def run_check(self, check: Check) -> CheckResult:
        """Run one check, apply the expected failures, record and return the result."""
        started = time.perf_counter()
        try:
            status, why = self._outcome(check)
        except Exception as exc:  # a bug in the suite or an escape from the backend
            status, why = FAILED, f"the check itself raised {type(exc).__name__}: {exc}"
        assert self.expectations is not None
        expected = self.expectations.match(check.id)
        if expected is not None and status == FAILED:
            status, why = XFAILED, f"{why} [expected: {expected.reason}]"
        elif expected is not None and status == PASSED:
            status, why = XPASSED, f"{why} [expected to fail ({expected.source}): {expected.reason}]"
        result = CheckResult(
            id=check.id,
            check=check.name,
            status=status,
            why=why,
            case=check.case.label if check.case else None,
            candidate=check.candidate.identity if check.candidate else None,
            duration_s=time.perf_counter() - started,
            expected=expected.reason if expected else None,
        )
        self.results[check.id] = result
        return result

    def run(self, progress: Callable[[Iterable[Check]], Iterable[Check]] | None = None) -> Report:
        """Run every planned check; ``progress`` may wrap the iteration (a progress bar)."""
        self._started = time.time()
        checks: Iterable[Check] = self.plan()
        for check in progress(checks) if progress else checks:
            self.run_check(check)
        return self.report()

    def report(self) -> Report:
        """The report of every check run so far."""
        backend = self.backend
        try:
            versions = backend.versions()
            platform = detect_platform(self.target, [backend]).to_dict()
        except Exception as exc:
            versions, platform = {}, {"error": f"{type(exc).__name__}: {exc}"}
        supported = sum(1 for c in self.cases if isinstance(self.offered(c), list) and self.offered(c))
        return Report(
            backend=backend.name,
            target={"array": self.primary, "device": str(self.device), "arrays": ", ".join(self.targets)},
            mode="quick" if self.quick else "full",
            versions=versions,
            platform=platform,
            cases=len(self.cases),
            supported_cases=supported,
            results=list(self.results.values()),
            started=self._started,
            duration_s=time.time() - self._started,
            suite_version=__version__,
        )


def run_suite(
    backend: Backend | str,
    *,
    device: Device | str | None = None,
    quick: bool = False,
    expectations: Expectations | None = None,
    checks: Iterable[str] | None = None,
) -> Report:
    """Run the suite on ``backend`` (an instance, a registered name or ``module:attr``)."""
    spec = backend if isinstance(backend, str) else None
    instance = load_backend(backend) if isinstance(backend, str) else backend
    suite = Suite(
        instance,
        spec=spec,
        device=parse_device(device) if isinstance(device, str) else device,
        quick=quick,
        expectations=expectations,
        only=frozenset(checks) if checks is not None else None,
    )
    return suite.run()


__all__ = ["Check", "Suite", "default_device", "parse_device", "run_suite"]
