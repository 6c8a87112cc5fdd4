"""A kernel call as a plan: the argument list with roles, the grid, and the specialisation.

:func:`plan_for` turns (Problem, KernelConfig) into a :class:`LaunchPlan`: every
argument of the Triton kernel in order, each either a value fixed for the problem (a
size, a stride, a constexpr) or a slot filled per call (``a``, ``b``, ``out``,
``bias``, ``workspace``, ``counters``, ``alpha``, ``beta``, and a scaled problem's
``scale_a`` and ``scale_b``). The plan also gives the
Triton signature, constexprs and divisibility attributes the kernel is compiled with,
following Triton's own JIT rules (an int equal to 1 becomes a constant, an int or a
pointer divisible by 16 is marked so), except that pointers are marked from the
Problem's alignment instead of from one call's arrays. Runners build their call
from it, and ``launch_info()`` describes the same list to a native caller.

:meth:`LaunchPlan.key` is the plan's specialisation: two plans with one key compile to
one binary, whatever their exact sizes. What of a shape changes it: each size and stride
that is 1 (compiled in) or a multiple of 16 (marked divisible), or over 2**31 (i64);
the pointers' 16-byte alignment (``Problem.align``); ``EVEN_K`` (k a multiple of
``block_k * split_k``); which operand is transposed (its unit stride); batch strides;
the dtypes; beta == 0; the epilogue and scale modes; and the config (blocks, split,
warps, stages). m, n and k themselves, beyond those, do not.

Nothing here imports Triton or torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from unimatmul import Problem, UnsupportedProblem
from unimatmul_triton.configs import FMA_KERNELS, PERSISTENT, KernelConfig

# Triton's names of the data types of pointers (the ``*bf16`` of a signature): the fp8
# pair of CUDA (OCP) and the fnuz pair of ROCm (gfx942), each what torch's dtype holds.
TRITON_DTYPE = {
    "bf16": "bf16",
    "f16": "fp16",
    "f32": "fp32",
    "f8e4m3": "fp8e4nv",
    "f8e5m2": "fp8e5",
    "f8e4m3fnuz": "fp8e4b8",
    "f8e5m2fnuz": "fp8e5b16",
}
ACT_CODES = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
#: A scaled GEMM's scale modes as the kernels' SCALE_A / SCALE_B codes (0: no scales).
SCALE_CODES = {"": 0, "tensor": 1, "rowwise": 2, "block1x128": 3, "block128x128": 3}

#: Roles of the per-call slots.
POINTER_ROLES = ("a", "b", "out", "bias", "workspace", "counters", "scale_a", "scale_b")
SCALAR_ROLES = ("alpha", "beta")

MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Param:
    """One argument of the kernel, in order.

    ``kind``: ``ptr`` (a device pointer), ``i32``/``i64`` (an int fixed for the problem),
    ``fp32`` (a per-call scalar) or ``constexpr`` (compiled in: not passed to the GPU).
    ``role`` names the per-call slot (pointers and scalars), else None.
    """

    name: str
    kind: str
    value: Any = None
    role: str | None = None
    dtype: str | None = None  # pointers: the element type (Triton's name)
    divisible: bool = False  # tt.divisibility=16: ints and pointers

    @property
    def passed(self) -> bool:
        """Whether the compiled kernel takes this argument (constexprs are compiled in)."""
        return self.kind != "constexpr"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything about one kernel call that is fixed for a (Problem, config) pair."""

    kernel: str  # the Triton kernel in kernels.KERNELS
    params: tuple[Param, ...]
    grid: tuple[int, int, int]  # the persistent kernel: tiles (capped at launch by residency)
    warps: int
    stages: int
    workspace_elems: int = 0  # fp32 split-K partials, [batch, m, n]
    counter_elems: int = 0  # int32 arrival counters, one per output tile

    def signature(self) -> dict[str, str]:
        sig = {}
        for p in self.params:
            sig[p.name] = f"*{p.dtype}" if p.kind == "ptr" else p.kind
        return sig

    def constexprs(self) -> dict[str, Any]:
        return {p.name: p.value for p in self.params if p.kind == "constexpr"}

    def attrs(self) -> dict[tuple[int, ...], list[list[Any]]]:
        return {(i,): [["tt.divisibility", 16]] for i, p in enumerate(self.params) if p.divisible}

    def key(self) -> tuple[Any, ...]:
        """What decides the compiled binary (two plans with one key share a kernel)."""
        sig = tuple(sorted(self.signature().items()))
        consts = tuple(sorted((k, repr(v)) for k, v in self.constexprs().items()))
        attrs = tuple(sorted(self.attrs()))
        return (self.kernel, sig, consts, attrs, self.warps, self.stages)

    def launcher_key(self) -> tuple[str, ...]:
        """What decides the launcher Triton builds for the compiled kernel: the kind of each
        argument, pointers as one kind (Triton 3.6's ``make_launcher`` writes its C source
        from these only). Kernels of many configs and shapes share one launcher."""
        return tuple("*" if p.kind == "ptr" else p.kind for p in self.params)


def _int_param(name: str, value: int) -> Param:
    # Triton's JIT rule: 1 is compiled in (so a unit stride makes loads along it
    # contiguous), a multiple of 16 is marked divisible, anything else is a plain int.
    if value == 1:
        return Param(name, "constexpr", 1)
    kind = "i32" if -(2**31) <= value < 2**31 else "i64"
    return Param(name, kind, value, divisible=value % 16 == 0)


def _ptr(name: str, role: str, dtype: str | None, aligned: bool) -> Param:
    if dtype is None:
        return Param(name, "constexpr", None)  # an absent operand (no bias, no split)
    return Param(name, "ptr", None, role=role, dtype=TRITON_DTYPE[dtype], divisible=aligned)


def _scale_params(p: Problem) -> list[Param]:
    """A scaled GEMM's scale pointers (f32) and, block-scaled, the scales' strides: scale_a
    ``[m, ceil(k/128)]`` outer-dim-major (strides ``(1, m)``) and scale_b ``[ceil(k/128),
    ceil(n/128)]`` with strides ``(1, ceil(k/128))``, the layouts the Problem stands for
    (``unimatmul.core.scales``). A plain GEMM has none of them (compiled-in Nones and 0s)."""
    if not p.is_scaled:
        return [
            Param("sa_ptr", "constexpr", None),
            Param("sb_ptr", "constexpr", None),
            *(
                Param(name, "constexpr", 0)
                for name in ("stride_sam", "stride_sak", "stride_sbk", "stride_sbn")
            ),
        ]
    # The scales' own addresses are part of the Problem's alignment.
    aligned = p.align >= 16
    params = [
        Param("sa_ptr", "ptr", None, role="scale_a", dtype="fp32", divisible=aligned),
        Param("sb_ptr", "ptr", None, role="scale_b", dtype="fp32", divisible=aligned),
    ]
    if not p.is_block_scaled:
        strides = [
            Param(name, "constexpr", 0) for name in ("stride_sam", "stride_sak", "stride_sbk", "stride_sbn")
        ]
        return [*params, *strides]
    kb = math.ceil(p.k / 128)
    strides = [
        _int_param("stride_sam", 1),
        _int_param("stride_sak", p.m),
        _int_param("stride_sbk", 1),
        _int_param("stride_sbn", kb),
    ]
    return [*params, *strides]


def plan_for(problem: Problem, config: KernelConfig) -> LaunchPlan:
    """The launch plan of ``config`` on ``problem`` (UnsupportedProblem when it cannot run)."""
    p, c = problem, config
    if p.batch > MAX_GRID_YZ and c.kernel != PERSISTENT:
        msg = f"batch {p.batch} is over the grid's limit of {MAX_GRID_YZ}"
        raise UnsupportedProblem(msg, problem=problem, backend="triton")
    aligned = p.align >= 16
    stride_am, stride_ak = (1, p.lda) if p.trans_a else (p.lda, 1)
    stride_bk, stride_bn = (1, p.ldb) if p.trans_b else (p.ldb, 1)
    split = c.split_k if c.kernel != PERSISTENT else 1
    tiles_m = math.ceil(p.m / c.block_m)
    tiles_n = math.ceil(p.n / c.block_n)
    params: list[Param] = [
        _ptr("a_ptr", "a", p.dtype_a, aligned),
        _ptr("b_ptr", "b", p.dtype_b, aligned),
        _ptr("c_ptr", "out", p.dtype_c, aligned),
        _ptr("bias_ptr", "bias", p.dtype_bias if p.has_bias else None, aligned),
    ]
    if c.kernel != PERSISTENT:
        with_split = split > 1
        # The workspace is ours: allocated 16-byte aligned.
        params.append(_ptr("ws_ptr", "workspace", "f32" if with_split else None, True))
        params.append(
            Param("cnt_ptr", "ptr", None, role="counters", dtype="i32", divisible=True)
            if with_split
            else Param("cnt_ptr", "constexpr", None)
        )
    params += [_int_param("M", p.m), _int_param("N", p.n), _int_param("K", p.k)]
    if c.kernel == PERSISTENT:
        params.append(_int_param("BATCH", p.batch))
    params += [
        _int_param("stride_ab", p.stride_a),
        _int_param("stride_am", stride_am),
        _int_param("stride_ak", stride_ak),
        _int_param("stride_bb", p.stride_b),
        _int_param("stride_bk", stride_bk),
        _int_param("stride_bn", stride_bn),
        _int_param("stride_cb", p.stride_c),
        _int_param("stride_cm", p.ldc),
        Param("alpha", "fp32", None, role="alpha"),
        Param("beta", "fp32", None, role="beta"),
        *_scale_params(p),
        Param("BLOCK_M", "constexpr", c.block_m),
        Param("BLOCK_N", "constexpr", c.block_n),
        Param("BLOCK_K", "constexpr", c.block_k),
    ]
    if c.kernel not in FMA_KERNELS:
        params.append(Param("GROUP_M", "constexpr", c.group_m))
    if c.kernel != PERSISTENT:
        params.append(Param("SPLIT_K", "constexpr", split))
    params += [
        Param("EVEN_K", "constexpr", p.k % (c.block_k * split) == 0),
        Param("HAS_C", "constexpr", not p.beta_zero),
        Param("HAS_BIAS", "constexpr", p.has_bias),
        Param("ACT", "constexpr", ACT_CODES[p.activation]),
        Param("SCALE_A", "constexpr", SCALE_CODES[p.scale_a]),
        Param("SCALE_B", "constexpr", SCALE_CODES[p.scale_b]),
        Param("FAST_ACCUM", "constexpr", p.fast_accum),
    ]
    if c.kernel in FMA_KERNELS:
        grid = (tiles_n, split, p.batch)
        kernel = c.kernel
        counters = tiles_n * p.batch
    elif c.kernel == PERSISTENT:
        grid = (tiles_m * tiles_n * p.batch, 1, 1)
        kernel = "persistent"
        counters = 0
    else:
        grid = (tiles_m * tiles_n, split, p.batch)
        kernel = "tile"
        counters = tiles_m * tiles_n * p.batch
    workspace = p.batch * p.m * p.n if split > 1 else 0
    return LaunchPlan(
        kernel=kernel,
        params=tuple(params),
        grid=grid,
        warps=c.warps,
        stages=c.stages,
        workspace_elems=workspace,
        counter_elems=counters if split > 1 else 0,
    )
