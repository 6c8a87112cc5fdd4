"""OneDNNBackend: Candidates are oneDNN matmul implementations, named as oneDNN names them.

Grouped GEMMs of the MoE form (``jagged == "m"``: 2-D ``a`` x 3-D ``b`` with ``offs`` over
a's rows, torch tensors on the CPU) get the same implementations as loops, ``loop:<impl>``:
one oneDNN primitive per group, on the caller's memory, built once per group height (rows)
and kept (:class:`GroupedOneDNNRunner`). On the CPU ``offs`` is read where it lies, at no
cost; torch's own CPU grouped GEMM is a loop of its dense kernel too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from unimatmul import settings
from unimatmul.backend import (
    Backend,
    Candidate,
    NativeCall,
    Problem,
    Target,
    UnsupportedProblem,
    group_bounds,
    plain_grouped_call,
)

if TYPE_CHECKING:
    from unimatmul_backends.onednn._dnnl import Dnnl, MatmulPrimitive, MatmulSpec

_DTYPES = {"f32", "bf16"}
#: A grouped candidate's name: ``loop:`` and the implementation each group's primitive asks for.
LOOP = "loop:"
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh"}


def _strides(trans: bool, ld: int, batch_stride: int, batch: int) -> tuple[int, ...]:
    inner = (1, ld) if trans else (ld, 1)
    return (batch_stride, *inner) if batch > 1 else inner


class OneDNNBackend(Backend):
    """Offers each implementation oneDNN lists for a matmul (``brg:avx512_core``, ...)."""

    name = "onednn"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy", "torch"})
    ops: ClassVar[frozenset[str]] = frozenset({"gemm", "scaled_gemm", "grouped_gemm"})

    def __init__(self) -> None:
        self._dnnl: Dnnl | None = None
        self._error: str | None = None
        self._impls: dict[tuple[MatmulSpec, float], list[str]] = {}
        self._lock = threading.Lock()

    # --- the library --------------------------------------------------------------
    def _library(self) -> Dnnl:
        if self._dnnl is None and self._error is None:
            with self._lock:
                if self._dnnl is None and self._error is None:
                    try:
                        from unimatmul_backends.onednn._dnnl import get_dnnl

                        dnnl = get_dnnl()
                        # The engine too: a SYCL build (the 3.13 wheel) loads fine and
                        # can still have no CPU device, and that is "unavailable".
                        dnnl.engine  # noqa: B018
                        self._dnnl = dnnl
                    except Exception as exc:  # missing wheel, wrong version, bad path, no device
                        self._error = f"{type(exc).__name__}: {exc}"
        if self._dnnl is None:
            msg = f"oneDNN is unavailable: {self._error}"
            raise UnsupportedProblem(msg, backend=self.name)
        return self._dnnl

    def availability(self) -> str | None:
        try:
            self._library()
        except UnsupportedProblem:
            return self._error
        return None

    def versions(self) -> dict[str, str]:
        # The runtime beside the version: one oneDNN version ships in builds that thread
        # differently (GNU OpenMP for 3.2's onednn-cpu-gomp, SYCL for 3.13's onednn), and
        # the times in a record belong to the build that measured them.
        dnnl = self._library()
        return {"onednn": dnnl.version(), "onednn-runtime": dnnl.cpu_runtime}

    # --- problems -----------------------------------------------------------------
    def spec(self, problem: Problem, beta: float = 0.0) -> MatmulSpec:
        """The oneDNN matmul spec for a Problem, or UnsupportedProblem."""
        from unimatmul_backends.onednn._dnnl import MatmulSpec, PostOp

        if problem.op != "gemm":
            raise UnsupportedProblem(f"oneDNN backend runs gemm, not {problem.op}", problem=problem)
        if {problem.dtype_a, problem.dtype_b} - _DTYPES or problem.dtype_c not in _DTYPES | {"f32"}:
            raise UnsupportedProblem(
                f"oneDNN matmul here takes f32 and bf16, not {problem.dtype_a}", problem=problem
            )
        if problem.compute not in ("f32",):
            raise UnsupportedProblem(f"compute type {problem.compute} is not offered", problem=problem)
        if problem.batch > 1 and 0 in (problem.stride_a, problem.stride_b, problem.stride_c):
            raise UnsupportedProblem("broadcast batches (stride 0) go to Default", problem=problem)
        post_ops: list[Any] = []
        if not problem.beta_zero:
            post_ops.append(PostOp("sum", beta))
        if problem.activation is not None:
            post_ops.append(PostOp(_ACTIVATIONS[problem.activation]))
        return MatmulSpec(
            batch=problem.batch,
            m=problem.m,
            k=problem.k,
            n=problem.n,
            src_dtype=problem.dtype_a,
            wei_dtype=problem.dtype_b,
            dst_dtype=problem.dtype_c,
            src_strides=_strides(problem.trans_a, problem.lda, problem.stride_a, problem.batch),
            wei_strides=_strides(problem.trans_b, problem.ldb, problem.stride_b, problem.batch),
            dst_strides=_strides(False, problem.ldc, problem.stride_c, problem.batch),
            bias_dtype=problem.dtype_bias if problem.has_bias else None,
            post_ops=tuple(post_ops),
            runtime_alpha=True,
        )

    def impls(self, problem: Problem, beta: float = 1.0) -> list[str]:
        spec = self.spec(problem, 0.0 if problem.beta_zero else beta)
        key = (spec, beta)
        found = self._impls.get(key)
        if found is None:
            from unimatmul_backends.onednn._dnnl import DnnlError

            try:
                found = self._library().list_impls(spec)
            except DnnlError as exc:
                # oneDNN refuses some layouts outright (e.g. overlapping batch strides):
                # that is the protocol's "unsupported", not a failure of the backend.
                raise UnsupportedProblem(f"oneDNN refuses {problem.key}: {exc}", problem=problem) from exc
            # oneDNN can list one name twice (two variants of one implementation, seen once
            # its primitive cache holds others); a name is one candidate, and a primitive
            # asked for by name gets the first.
            found = list(dict.fromkeys(found))
            self._impls[key] = found
        return found

    def offered(self, problem: Problem) -> list[str]:
        """The implementations offered as candidates: oneDNN's reference ones ("ref:...")
        exist to check the others and run orders of magnitude slower, so measuring them
        only burns the tuning budget (``UNIMATMUL_ONEDNN_REF=1`` offers them too)."""
        with_ref = settings.ONEDNN_REF.get()
        return [impl for impl in self.impls(problem) if with_ref or not impl.startswith("ref:")]

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        if problem.is_grouped:
            return [Candidate.make(self.name, LOOP + impl) for impl in self.grouped_impls(problem, target)]
        return [Candidate.make(self.name, impl) for impl in self.offered(problem)]

    def grouped_impls(self, problem: Problem, target: Target) -> list[str]:
        """The implementations a grouped loop may ask for: those oneDNN offers one group of
        the bucket's mean height (the problem's rows over its groups), in its order."""
        if problem.jagged != "m":
            raise UnsupportedProblem(
                f"oneDNN loops over the groups of the MoE form (jagged m), not jagged={problem.jagged}",
                problem=problem,
                backend=self.name,
            )
        if target.array_kind != "torch":
            raise UnsupportedProblem(
                "grouped GEMMs come as torch tensors", problem=problem, backend=self.name
            )
        # One group as a dense product: the same operands, one matrix of b, the mean rows.
        rows = max(1, problem.m // problem.batch)
        dense = replace(problem, op="gemm", jagged="", batch=1, m=rows, stride_a=0, stride_b=0, stride_c=0)
        return self.offered(dense)

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        try:
            if problem.is_grouped:
                return candidate.name.removeprefix(LOOP) in self.grouped_impls(problem, target)
            return candidate.name in self.impls(problem)
        except UnsupportedProblem:
            return False

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        if candidate.backend != self.name:
            raise UnsupportedProblem(f"{candidate.identity} is not a oneDNN candidate", problem=problem)
        if problem.is_grouped:
            impl = candidate.name.removeprefix(LOOP)
            if not candidate.name.startswith(LOOP) or impl not in self.grouped_impls(problem, target):
                raise UnsupportedProblem(
                    f"{candidate.name!r} is not a oneDNN loop for {problem.key}",
                    problem=problem,
                    backend=self.name,
                )
            return GroupedOneDNNRunner(self, problem, candidate)
        if candidate.name not in self.impls(problem):
            raise UnsupportedProblem(
                f"oneDNN {self.versions()['onednn']} does not offer {candidate.name!r} for "
                f"{problem.key}; it offers {self.impls(problem)}",
                problem=problem,
            )
        return OneDNNRunner(self, problem, candidate, target)


class OneDNNRunner:
    """One oneDNN primitive on the caller's memory (no copies), built once and reused.

    oneDNN fixes beta (the sum post-op's scale) when the primitive is built, so a
    runner keeps one primitive per beta value it meets; alpha is passed per call.
    """

    def __init__(
        self, backend: OneDNNBackend, problem: Problem, candidate: Candidate, target: Target
    ) -> None:
        self.backend = backend
        self.problem = problem
        self.candidate = candidate
        self.pointers = target.adapter.pointers
        self._prims: dict[float, MatmulPrimitive] = {}
        self._native: MatmulPrimitive | None = None  # the native caller's own (native_call)
        # Primitives share one oneDNN stream and a scratchpad: one call at a time.
        self._lock = threading.Lock()
        self._primitive(0.0 if problem.beta_zero else 1.0)

    def _primitive(self, beta: float) -> MatmulPrimitive:
        prim = self._prims.get(beta)
        if prim is None:
            dnnl = self.backend._library()
            prim = dnnl.matmul(self.backend.spec(self.problem, beta), self.candidate.name)
            self._prims[beta] = prim
        return prim

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        pa, pb, po, pbias = self.pointers(a, b, out, bias)
        with self._lock:
            prim = self._prims.get(beta) or self._primitive(0.0 if self.problem.beta_zero else beta)
            prim.execute(pa, pb, po, pbias, alpha)

    def native_call(self) -> NativeCall | None:
        """This runner's call for a native caller (beta = 0), on a primitive of its own.

        The native caller sets the primitive's data handles under its own lock, so it
        gets a primitive (and scratchpad) that no Python call uses; made once, closed
        with the runner.
        """
        if not self.problem.beta_zero:
            return None
        with self._lock:
            if self._native is None:
                dnnl = self.backend._library()
                self._native = dnnl.matmul(self.backend.spec(self.problem, 0.0), self.candidate.name)
            return NativeCall("onednn", self._native.native_words())

    def close(self) -> None:
        for prim in self._prims.values():
            prim.close()
        self._prims.clear()
        if self._native is not None:
            self._native.close()
            self._native = None


class GroupedOneDNNRunner:
    """``runner(a, b, out, alpha, beta, bias, offs)`` for the MoE form: one oneDNN
    primitive per non-empty group, on views of the caller's memory.

    A group's primitive depends on its height (its rows) and the operands' strides; one is
    built the first time a height is met and kept, the least recently used dropped past
    :attr:`MAX_PRIMITIVES`. Each asks for the candidate's implementation where oneDNN
    offers it for that height, and takes oneDNN's first otherwise (a 1-row group may have
    other implementations than the bucket's mean height). One call at a time (the
    primitives share oneDNN's stream).
    """

    MAX_PRIMITIVES: ClassVar[int] = 128

    def __init__(self, backend: OneDNNBackend, problem: Problem, candidate: Candidate) -> None:
        self.backend = backend
        self.problem = problem
        self.candidate = candidate
        self.impl = candidate.name.removeprefix(LOOP)
        self._prims: OrderedDict[tuple[int, ...], MatmulPrimitive] = OrderedDict()
        self._lock = threading.Lock()

    def _primitive(self, key: tuple[int, ...]) -> MatmulPrimitive:
        prim = self._prims.get(key)
        if prim is not None:
            self._prims.move_to_end(key)
            return prim
        from unimatmul_backends.onednn._dnnl import MatmulSpec

        rows, sa0, sa1, sb1, sb2, so0, so1 = key
        p = self.problem
        spec = MatmulSpec(
            batch=1,
            m=rows,
            k=p.k,
            n=p.n,
            src_dtype=p.dtype_a,
            wei_dtype=p.dtype_b,
            dst_dtype=p.dtype_c,
            src_strides=(sa0, sa1),
            wei_strides=(sb1, sb2),
            dst_strides=(so0, so1),
        )
        dnnl = self.backend._library()
        prim = dnnl.matmul(spec, self.impl if self.impl in dnnl.list_impls(spec) else None)
        self._prims[key] = prim
        if len(self._prims) > self.MAX_PRIMITIVES:
            self._prims.popitem(last=False)[1].close()
        return prim

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        offs: Any = None,
    ) -> None:
        plain_grouped_call(alpha, beta, bias)
        if offs is None:
            raise ValueError("a oneDNN grouped loop needs offs (the MoE form)")
        size = a.element_size()
        sa0, sa1 = a.stride()
        sb0, sb1, sb2 = b.stride()
        so0, so1 = out.stride()
        pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
        with self._lock:
            for g, (start, end) in enumerate(group_bounds(offs, a.shape[0])):
                if end > start:
                    prim = self._primitive((end - start, sa0, sa1, sb1, sb2, so0, so1))
                    prim.execute(pa + start * sa0 * size, pb + g * sb0 * size, po + start * so0 * size)

    def close(self) -> None:
        with self._lock:
            for prim in self._prims.values():
                prim.close()
            self._prims.clear()
