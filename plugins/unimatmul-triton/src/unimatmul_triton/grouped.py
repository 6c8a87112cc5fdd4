"""Grouped GEMMs (``torch._grouped_mm``'s four forms) as Triton kernels: ``triton_grouped``.

Two kernels. :func:`grouped_rows_kernel` serves the ``m`` form (``offs`` cut a's rows:
the MoE forward and its input gradient), the **rows** form: one program per (row tile,
column tile), each finding its group with one vector load of ``offs`` and a prefix sum
over the groups' tile counts, so a model with 128 experts costs no loop over them. Its
grid bounds the row tiles of any ``offs`` of the call (``min(ceil(M / BM) + min(G, M),
M)`` slots); the slots past the call's tiles return at once. It is compiled once per
config, whatever the token count (``M`` is not specialised). Its configs are per bucket
of rows per group: 16-row tiles with long K steps where groups hold a few rows (decode:
the weights are read once per group), larger tiles where they hold more.

:func:`grouped_kernel` serves every form (``Problem.jagged``: ``m``, ``k``, ``n``,
``none``). It is persistent: ``programs`` programs walk the output tiles of all groups in
turn (tile ``t`` goes to program ``t % programs``), reading the group boundaries from
``offs`` one group after another; the **skinny** form (16-row tiles) where groups hold
1-16 rows, the **persistent** form's larger tiles where they hold more; it serves the
``k``, ``n`` and ``none`` forms.

Both read the group boundaries from ``offs`` on the device, so no host sync and no
per-call set-up; each group's bounds are clamped to its operand as torch's slices clamp
them (an empty group has no tiles; in the ``k`` form its output tile is all zeros). bf16
and f16, fp32 accumulation.

The rows kernel's configs are compiled ahead: ``candidates()`` hands a warm-up of each
offered config (Triton's ``JITFunction.warmup`` with the problem's sizes and strides: the
same specialisation the first call finds) and its launcher build to the dense backend's
compile pool (``compiler.py``), so the configs of a problem compile in parallel while
the first is checked; ``prepare()`` waits for its own (``UNIMATMUL_TRITON_PRECOMPILE=0``
turns this off: each config then compiles at its first call).

A runner launches through Triton's own Python launcher (``kernel[grid](...)``), on the
caller's current stream; in test mode (``UNIMATMUL_TRITON_INTERPRET=1``) the same kernel
runs in Triton's interpreter on CPU tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from unimatmul.backend import (
    Backend,
    Candidate,
    NativeCall,
    NotReady,
    Problem,
    Target,
    UnsupportedProblem,
    plain_grouped_call,
    prepare_deadline,
)
from unimatmul.core.grouped import grouped_layouts, grouped_shapes
from unimatmul_triton import settings as plugin_settings
from unimatmul_triton.compiler import wait_for

NAME = "triton_grouped"
DTYPES = ("bf16", "f16")
SKINNY, PERSISTENT, ROWS = "skinny", "persistent", "rows"
_FORM = {"m": 0, "k": 1, "n": 2, "none": 3}


@dataclass(frozen=True)
class GroupedConfig:
    """One tile shape of the grouped kernel (its candidate's identity names all of it)."""

    form: str  # ROWS (grouped_rows_kernel), SKINNY or PERSISTENT (grouped_kernel)
    block_m: int
    block_n: int
    block_k: int
    warps: int = 4
    stages: int = 3

    @property
    def candidate(self) -> Candidate:
        return Candidate.make(
            NAME, self.form, bm=self.block_m, bn=self.block_n, bk=self.block_k, w=self.warps, s=self.stages
        )


SKINNY_CONFIGS = (
    GroupedConfig(SKINNY, 16, 64, 128),
    GroupedConfig(SKINNY, 16, 128, 128),
    GroupedConfig(SKINNY, 16, 32, 256, stages=4),
)
PERSISTENT_CONFIGS = (
    GroupedConfig(PERSISTENT, 64, 128, 64),
    GroupedConfig(PERSISTENT, 128, 128, 64, warps=8),
    GroupedConfig(PERSISTENT, 128, 64, 64, stages=4),
    GroupedConfig(PERSISTENT, 64, 64, 64),
)
# The rows kernel's, by the bucket's rows per group (chosen on the H200 over the expert
# products of four MoE configs: Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite, gpt-oss-20b).
ROWS_DECODE = (
    GroupedConfig(ROWS, 16, 64, 256),
    GroupedConfig(ROWS, 16, 128, 128),
    GroupedConfig(ROWS, 16, 64, 128, stages=4),
    GroupedConfig(ROWS, 16, 32, 256, stages=4),
)
ROWS_TILES = (
    GroupedConfig(ROWS, 64, 128, 64),
    GroupedConfig(ROWS, 128, 128, 64, warps=8),
    GroupedConfig(ROWS, 128, 256, 64, warps=8),
)
#: Past this many rows a group (the bucket's mean) no config of the m form is offered: on
#: the H200 torch's grouped kernel (CUTLASS, sm90) won or tied every such expert product
#: (8192 tokens of four MoE configs), and a kernel ahead on the harness's distributions
#: lost up to 18 % on the model's own routing.
ROWS_MAX_PER_GROUP = 256
CONFIGS = {c.candidate: c for c in SKINNY_CONFIGS + PERSISTENT_CONFIGS + ROWS_DECODE + ROWS_TILES}


def rows_per_group(problem: Problem) -> float:
    """The mean rows a group's product has in ``problem``'s bucket (what picks the tiles)."""
    if problem.jagged == "m":
        return problem.m / problem.batch
    return float(problem.m)


def offered(problem: Problem, limit: int | None = None) -> list[GroupedConfig]:
    """The configs of ``problem``'s bucket, most likely first. The ``m`` form: the rows
    kernel's 16-row tiles where groups hold up to 4 rows, those and its 64-row tiles up to
    16, its larger tiles up to :data:`ROWS_MAX_PER_GROUP`, none beyond. The
    other forms: skinny tiles where groups hold up to 16 rows, both kinds up to 64, the
    larger tiles beyond."""
    rows = rows_per_group(problem)
    if problem.jagged == "m":
        if rows <= 4:
            found = list(ROWS_DECODE)
        elif rows <= 16:
            found = [ROWS_DECODE[1], ROWS_TILES[0], ROWS_DECODE[2]]
        elif rows <= 64:
            found = [ROWS_TILES[0], ROWS_TILES[1], ROWS_DECODE[1]]
        elif rows <= ROWS_MAX_PER_GROUP:
            found = [ROWS_TILES[1], ROWS_TILES[0], ROWS_TILES[2]]
        else:
            found = []  # prefill of many rows a group: torch's grouped kernel was not beaten
    elif rows <= 16:
        found = [*SKINNY_CONFIGS, PERSISTENT_CONFIGS[3]]
    elif rows <= 64:
        found = [PERSISTENT_CONFIGS[3], SKINNY_CONFIGS[0], PERSISTENT_CONFIGS[0]]
    else:
        found = list(PERSISTENT_CONFIGS)
    return found[:limit] if limit is not None else found


def unsupported(problem: Problem) -> str:
    """Why the grouped kernel does not compute ``problem`` ("" when it does)."""
    if not problem.is_grouped:
        return f"{NAME} computes grouped GEMMs, not {problem.op}"
    if problem.dtype_a not in DTYPES:
        return f"{NAME} takes {' or '.join(DTYPES)}, not {problem.dtype_a}"
    if problem.compute not in ("f32", problem.dtype_a):
        return f"{NAME} accumulates in f32, which does not serve compute type {problem.compute}"
    return ""


def _kernel(form: str) -> Any:
    from unimatmul_triton import grouped_kernels

    return grouped_kernels.grouped_rows_kernel if form == ROWS else grouped_kernels.grouped_kernel


def rows_slots(m: int, groups: int, block_m: int) -> int:
    """Row-tile slots of a rows-kernel launch: at least the tiles of any ``offs`` over ``m``
    rows and ``groups`` groups (each group's tiles <= its rows / BM + 1, and every tile
    holds a row)."""
    return min(-(-m // block_m) + min(groups, m), m)


def rows_warmup_ints(problem: Problem) -> tuple[int, ...]:
    """The rows kernel's specialised ints of ``problem`` (G, N, K and the strides of a, b
    and out, in its argument order), as the door's calls pass them."""
    layouts = grouped_layouts(problem)
    return (problem.batch, problem.n, problem.k, *layouts["a"][1], *layouts["b"][1], *layouts["c"][1])


def rows_warmup_args(problem: Problem, config: GroupedConfig) -> tuple[Any, ...]:
    """The rows kernel's arguments up to its constexpr ones, as its warm-up passes them
    (the operands' dtypes for the operands)."""
    import torch

    dtype = getattr(torch, {"bf16": "bfloat16", "f16": "float16"}[problem.dtype_a])
    g, n, k, *strides = rows_warmup_ints(problem)
    return (
        dtype,
        dtype,
        dtype,
        torch.int32,
        g,
        problem.m,
        n,
        k,
        *strides,
        rows_slots(problem.m, g, config.block_m),
    )


def jit_signature(kernel: Any, args: tuple[Any, ...]) -> dict[str, str] | None:
    """The signature Triton's JIT gives ``kernel`` called with ``args`` (its arguments up to
    the constexpr ones, which are named "constexpr"), by the JIT's own rule
    (``triton.runtime.jit.mangle_type``: a pointer's dtype, an int's width, 1 compiled in
    where the argument is specialised); None where Triton has no such rule. What the
    compiler builds the launcher from ahead (a wrong guess costs a second build)."""
    try:
        from triton.runtime.jit import MockTensor, mangle_type

        signature = {}
        for i, param in enumerate(kernel.params):
            if param.is_constexpr or i >= len(args):
                signature[param.name] = "constexpr"
            else:
                value = MockTensor.wrap_dtype(args[i])
                signature[param.name] = mangle_type(value, specialize=not param.do_not_specialize)
    except Exception:
        return None
    return signature


def launch_params(
    kernel: Any, warm: tuple[Any, ...], roles: tuple[str | None, ...]
) -> list[dict[str, Any]] | None:
    """The parameters the compiled ``kernel`` takes for a call with arguments ``warm`` (the
    pointers' dtypes, then the ints, up to the constexprs), in order, as the plugin's
    ``launch_words`` reads them: the pointers first, named by ``roles`` (written per call;
    None: a constant 0, an argument the kernel never reads), then each int it takes as a
    constant of its value. What the JIT compiles in (the constexprs, every int of 1 it
    specialises) is no parameter (:func:`jit_signature`); the two hidden scratch pointers
    that Triton 3.6 appends are not listed. None where Triton has no rule for the signature."""
    signature = jit_signature(kernel, warm)
    if signature is None:
        return None
    params: list[dict[str, Any]] = []
    for i, kind in enumerate(signature.values()):
        if kind == "constexpr" or i >= len(warm):
            continue
        pointer = i < len(roles)
        role = roles[i] if pointer else None
        size = 8 if kind.startswith("*") or kind in ("i64", "u64") else 4
        params.append({"role": role or "constant", "size": size, "value": 0 if pointer else int(warm[i])})
    return params


def g_pow2(groups: int) -> int:
    """The rows kernel's vector of groups: 256 wide up to 256 groups (one compile for every
    model up to there), the next power of two beyond."""
    return 256 if groups <= 256 else 1 << (groups - 1).bit_length()


@dataclass
class GroupedRunner:
    """``runner(a, b, out, alpha, beta, bias, offs)``: one launch of the grouped kernel."""

    candidate: Candidate
    config: GroupedConfig
    jagged: str
    programs: int
    interpreted: bool = False
    kernel: Any = field(default=None, repr=False)
    _fast: Any = field(default=None, repr=False)  # the rows kernel's direct launch (_direct)

    def __post_init__(self) -> None:
        c = self.config
        self.kernel = _kernel(c.form)
        self._rows = c.form == ROWS
        self._form = _FORM[self.jagged]
        self._grid = (self.programs,)
        self._meta = {"BLOCK_M": c.block_m, "BLOCK_N": c.block_n, "BLOCK_K": c.block_k}
        if not self.interpreted:
            self._meta.update(num_warps=c.warps, num_stages=c.stages)

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
        sa, sb, sc = a.stride(), b.stride(), out.stride()
        if self._rows:
            self._call_rows(a, b, out, offs, sa, sb, sc)
            return
        form = self._form
        ints = self._persistent_ints(a.shape, b.shape, None if offs is None else offs.shape[0], sa, sb, sc)
        # offs is never read without offs (form "none")
        args = (a, b, out, offs if offs is not None else out, *ints)
        if self.interpreted:
            from unimatmul_triton.runner import _INTERPRETER_LOCK

            with _INTERPRETER_LOCK:
                self.kernel[self._grid](*args, JAGGED=form, **self._meta)
            return
        self.kernel[self._grid](*args, JAGGED=form, **self._meta)

    def _persistent_ints(
        self, a_shape: Any, b_shape: Any, groups: int | None, sa: Any, sb: Any, sc: Any
    ) -> tuple[int, ...]:
        """The persistent kernel's int arguments: (groups, rows, columns, depth) of the call,
        each operand's group stride (0: 2-D) and its two strides, and the programs."""
        form = self._form
        if form == 0:
            g, m, n, k = b_shape[0], a_shape[0], b_shape[2], a_shape[1]
        elif form == 1:
            g, m, n, k = groups or 0, a_shape[0], b_shape[1], a_shape[1]
        elif form == 2:
            g, m, n, k = a_shape[0], a_shape[1], b_shape[1], a_shape[2]
        else:
            g, m, n, k = a_shape[0], a_shape[1], b_shape[2], a_shape[2]
        sag = sa[0] if len(a_shape) == 3 else 0
        sbg = sb[0] if len(b_shape) == 3 else 0
        scg = sc[0] if len(sc) == 3 else 0
        return (g, m, n, k, sag, sa[-2], sa[-1], sbg, sb[-2], sb[-1], scg, sc[-2], sc[-1], self.programs)

    def native_call(self, a: Any, b: Any, offs: Any = None, out_dtype: Any = None) -> NativeCall | None:
        """This runner's launch for calls with the sizes, strides and alignment of ``a``,
        ``b`` and ``offs`` into a new ``out_dtype`` output (torch routing's native grouped
        table keys its entries so), as a NativeCall "launch": the a, b, out and offs
        pointers per call, every other argument and the grid fixed (the rows kernel's grid
        bounds the tiles of any offs over these rows). None in the interpreter, for a call
        with no rows, for operands not 16-byte aligned (the kernel the native caller
        launches is compiled for aligned ones, as the Python launcher's direct path), where
        the driver is not found, and unless ``UNIMATMUL_TRITON_GROUPED_NATIVE`` is on (off by
        default: see the setting)."""
        import torch

        from unimatmul_triton.runner import _Driver, _is_hip, compiled_launch_info, launch_words

        if not plugin_settings.GROUPED_NATIVE.get():
            return None
        if self.interpreted or a.device.type != "cuda" or a.numel() == 0:
            return None
        operands = (a, b) if offs is None else (a, b, offs)
        if any(x.data_ptr() & 15 for x in operands):
            return None
        out_dtype = out_dtype or a.dtype
        groups = 0 if offs is None else offs.shape[0]
        out_shape = grouped_shapes(tuple(a.shape), tuple(b.shape), groups)[1]
        sc = torch.empty(out_shape, dtype=out_dtype, device="meta").stride()
        sa, sb = a.stride(), b.stride()
        c = self.config
        if self._rows:
            m, g, n, k = a.shape[0], b.shape[0], b.shape[2], a.shape[1]
            slots = rows_slots(m, g, c.block_m)
            ints: tuple[int, ...] = (g, m, n, k, *sa, *sb, *sc, slots)
            grid = (slots * -(-n // c.block_n), 1, 1)
            constexprs = {"G_POW2": g_pow2(g)}
        else:
            ints = self._persistent_ints(a.shape, b.shape, groups, sa, sb, sc)
            grid = (self.programs, 1, 1)
            constexprs = {"JAGGED": self._form}
        dtypes = (a.dtype, b.dtype, out_dtype, offs.dtype if offs is not None else out_dtype)
        warm = (*dtypes, *ints)
        params = launch_params(self.kernel, warm, ("a", "b", "out", "offs" if offs is not None else None))
        driver = _Driver.words(a.device.index, _is_hip())
        if params is None or driver is None:
            return None
        with torch.cuda.device(a.device.index):
            compiled = self.kernel.warmup(*warm, grid=grid, **constexprs, **self._meta)
            compiled._init_handles()  # the function, loaded on this device
            info = compiled_launch_info(compiled, grid, params, 0)
        words = launch_words(info, driver)
        return None if words is None else NativeCall("launch", words)

    def _call_rows(self, a: Any, b: Any, out: Any, offs: Any, sa: Any, sb: Any, sc: Any) -> None:
        m, g = a.shape[0], b.shape[0]
        if m == 0:
            return
        n, k = b.shape[2], a.shape[1]
        bm, bn = self.config.block_m, self.config.block_n
        slots = rows_slots(m, g, bm)
        grid = (slots * -(-n // bn), 1, 1)
        if self.interpreted:
            from unimatmul_triton.runner import _INTERPRETER_LOCK

            with _INTERPRETER_LOCK:
                self.kernel[grid](
                    a, b, out, offs, g, m, n, k, *sa, *sb, *sc, slots, G_POW2=g_pow2(g), **self._meta
                )
            return
        pointers = (a.data_ptr(), b.data_ptr(), out.data_ptr(), offs.data_ptr())
        fixed = (g, n, k, *sa, *sb, *sc)
        aligned = not (pointers[0] | pointers[1] | pointers[2] | pointers[3]) & 15
        fast = self._fast
        if fast is not None and aligned and fast[0] == fixed:
            # The compiled kernel launched directly: what Triton's JIT would find for these
            # arguments (the same sizes, strides and 16-byte alignment; M and the slots are
            # not specialised), without its per-call binding of every argument.
            _, launch, function, packed, stream, tail = fast
            launch(grid, stream(), function, packed, (*pointers, g, m, n, k, *sa, *sb, *sc, slots, *tail))
            return
        compiled = self.kernel[grid](
            a, b, out, offs, g, m, n, k, *sa, *sb, *sc, slots, G_POW2=g_pow2(g), **self._meta
        )
        if aligned:
            self._fast = self._direct(compiled, fixed, g, a.device.index)

    def _direct(
        self, compiled: Any, fixed: tuple[int, ...], g: int, device_index: int
    ) -> tuple[Any, ...] | None:
        """What launches ``compiled`` directly for calls with these sizes and strides."""
        import torch

        from unimatmul_triton.runner import _launcher

        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is None:  # pragma: no cover - older torch
            return None
        c = self.config
        tail = (g_pow2(g), c.block_m, c.block_n, c.block_k)
        return (fixed, _launcher(compiled), compiled.function, compiled.packed_metadata,
                lambda: raw_stream(device_index), tail)  # fmt: skip


class TritonGroupedBackend(Backend):
    """The grouped kernel compiled for a GPU (CUDA or ROCm), on torch tensors."""

    name = NAME
    device_kinds: ClassVar[frozenset[str]] = frozenset({"cuda", "hip"})
    array_kinds: ClassVar[frozenset[str]] = frozenset({"torch"})
    ops: ClassVar[frozenset[str]] = frozenset({"grouped_gemm"})
    interpreted: ClassVar[bool] = False

    def __init__(self, dense: Backend) -> None:
        self._dense = dense  # the plugin's dense backend: one answer to "is Triton usable here"

    def availability(self) -> str | None:
        return self._dense.availability()

    def versions(self) -> dict[str, str]:
        return self._dense.versions()

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self._require(problem)
        found = offered(problem, self._limit())
        if not self.interpreted and plugin_settings.PRECOMPILE.get():
            for config in found:
                self._warm_up(problem, config, target)
        return [c.candidate for c in found]

    def ahead(self, problem: Problem, target: Target) -> None:
        """Start compiling what ``problem``'s candidates need (as :meth:`candidates` does)."""
        if not self.interpreted and plugin_settings.PRECOMPILE.get():
            self.candidates(problem, target)

    def _warm_up(self, problem: Problem, config: GroupedConfig, target: Target) -> Any:
        """The compile pool's future of ``config``'s kernel on ``problem`` (the rows kernel
        only; None for the other forms, which compile at their first call)."""
        if config.form != ROWS or problem.jagged != "m":
            return None
        ints = rows_warmup_ints(problem)
        index = target.device.index
        key = ("grouped_rows", problem.dtype_a, ints, config, index)
        launcher_key = ("grouped_rows", *("1" if v == 1 else "i" for v in ints))
        kernel = _kernel(config.form)

        import torch

        args = rows_warmup_args(problem, config)

        def work() -> Any:
            with torch.cuda.device(index):
                return kernel.warmup(
                    *args, grid=(1,), G_POW2=g_pow2(problem.batch),
                    BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                    num_warps=config.warps, num_stages=config.stages,
                )  # fmt: skip

        compiler = self._dense.compiler  # type: ignore[attr-defined]
        if not compiler.has_launcher(launcher_key):
            signature = jit_signature(kernel, args)
            if signature is not None:
                compiler.prebuild_launcher(launcher_key, signature)
        return compiler.submit_job(key, work, launcher_key)

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        config = CONFIGS.get(candidate)
        return (
            not unsupported(problem) and config is not None and (config.form != ROWS or problem.jagged == "m")
        )

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> GroupedRunner:
        self._require(problem)
        config = CONFIGS.get(candidate)
        if config is None:
            msg = f"{NAME} has no kernel {candidate.identity}"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
        if config.form == ROWS and problem.jagged != "m":
            msg = f"{NAME}'s rows kernel computes the m form (offs over a's rows), not {problem.jagged}"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
        if not self.interpreted and plugin_settings.PRECOMPILE.get():
            future = self._warm_up(problem, config, target)
            if future is not None:
                # Its compile, ahead or now (until the problem's tuning cap at most). A
                # warm-up that fails leaves the compile to the first call, which reports
                # what goes wrong for this candidate.
                try:
                    wait_for(
                        future,
                        prepare_deadline(),
                        lambda: f"{candidate.identity} was not compiled by the problem's tuning cap",
                    )
                except NotReady:
                    raise
                except Exception:
                    pass
        return GroupedRunner(
            candidate, config, problem.jagged, self._programs(problem, config, target), self.interpreted
        )

    def _programs(self, problem: Problem, config: GroupedConfig, target: Target) -> int:
        """Programs of one launch: two per SM (persistent), or fewer when the bucket has fewer tiles."""
        import torch

        sms = torch.cuda.get_device_properties(target.device.index).multi_processor_count
        tiles = math.ceil(problem.m / config.block_m) * math.ceil(problem.n / config.block_n)
        if problem.jagged in ("k", "none"):
            tiles *= problem.batch
        return max(1, min(2 * sms, tiles + problem.batch))

    def _limit(self) -> int | None:
        return None

    def _require(self, problem: Problem) -> None:
        why = unsupported(problem) or (self.availability() or "")
        if why:
            raise UnsupportedProblem(why, problem=problem, backend=NAME)


class TritonGroupedInterpreterBackend(TritonGroupedBackend):
    """The same kernel in Triton's interpreter, on CPU torch tensors (test mode)."""

    device_kinds: ClassVar[frozenset[str]] = frozenset({"cpu"})
    interpreted: ClassVar[bool] = True

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> GroupedRunner:
        from unimatmul_triton.runner import _interpreter_numpy2_fix

        _interpreter_numpy2_fix()
        return super().prepare(problem, candidate, target)

    def _programs(self, problem: Problem, config: GroupedConfig, target: Target) -> int:
        return 3  # a few programs: each walks several groups' tiles, as on a GPU

    def _limit(self) -> int | None:
        return 2  # the interpreter is slow: the bucket's two likeliest configs


def make_grouped_backend(dense: Any) -> TritonGroupedBackend:
    """The grouped backend beside ``dense`` (``make_backend()``'s): the same kernels in
    Triton's interpreter where ``dense`` interprets, compiled otherwise."""
    from unimatmul_triton.backend import TritonInterpreterBackend

    kind = (
        TritonGroupedInterpreterBackend
        if isinstance(dense, TritonInterpreterBackend)
        else TritonGroupedBackend
    )
    return kind(dense)
