"""The problem matrix: which GEMMs every backend is asked about.

Sizes include 1, primes, odd and large values; every transpose; leading dimensions
and batch strides larger than the minimum (padding the checks fill with canaries);
batches, a broadcast batch and a misaligned pointer; each dtype combination and
epilogue the backend supports, with alpha and beta. What a backend does not support
is still asked about, in a couple of probes each, to check that it answers
"unsupported" instead of crashing.

Scaled (fp8) GEMMs (``op == "scaled_gemm"``, what ``torch._scaled_mm`` computes) have a
matrix of their own: the layout torch's fp8 linear uses (A row-major, B column-major)
with per-tensor and row-wise scales, every output dtype, a bias, fast accumulation,
mixed e5m2/e4m3 inputs, padded leading dimensions, sizes with m of 1 and odd m, and a
block-scaled part (1x128 groups of A, 128x128 blocks of B, K and N over partial blocks); its
probes (a plain-GEMM layout, dimensions no fp8 kernel takes, a misaligned pointer)
must be refused cleanly. The plain-GEMM fp8 dtypes of ``DTYPES`` (no scales) stay
probes: no backend runs an unscaled fp8 product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.problem import EPILOGUES, Problem
from unimatmul.core.scales import scaled_problem

# (dtype of A, B, C, compute), most common first. The first one the backend
# supports gets the whole matrix; the others a smaller one.
DTYPES: tuple[tuple[str, str, str, str], ...] = (
    ("f32", "f32", "f32", "f32"),
    ("bf16", "bf16", "bf16", "f32"),
    ("f16", "f16", "f16", "f32"),
    ("bf16", "bf16", "f32", "f32"),
    ("f16", "f16", "f32", "f32"),
    ("f64", "f64", "f64", "f64"),
    ("f16", "f16", "f16", "f16"),
    ("f8e4m3", "f8e4m3", "bf16", "f32"),
    ("f8e4m3", "f8e4m3", "f32", "f32"),
    ("f8e5m2", "f8e4m3", "bf16", "f32"),
    ("f8e4m3", "f8e4m3", "f8e4m3", "f32"),
)

TRANSPOSES = ((False, False), (True, False), (False, True), (True, True))

SMALL = [(1, 1, 1), (7, 13, 17), (31, 37, 41), (127, 129, 65)]
EDGE = [(1, 1, 7), (1, 64, 32), (64, 1, 32), (48, 40, 1), (2, 3, 5)]
MEDIUM = [(97, 89, 101), (256, 192, 320), (513, 257, 129)]
LARGE_CPU = [(1024, 768, 512), (1031, 769, 523)]
LARGE_GPU = [(2048, 2048, 1024), (4099, 1031, 257)]


@dataclass(frozen=True)
class Case:
    """One problem of the matrix, the scalars it runs with, and the array kind used."""

    problem: Problem
    alpha: float = 1.0
    beta: float = 0.0
    kind: str = "numpy"
    #: Why this case cannot be run here (no array kind holds its dtypes), else "".
    not_runnable: str = ""

    @property
    def label(self) -> str:
        return f"{self.problem.key}@a{self.alpha:g},b{self.beta:g}@{self.kind}"


def make_problem(
    m: int,
    n: int,
    k: int,
    dtypes: tuple[str, str, str, str] = DTYPES[0],
    *,
    trans: tuple[bool, bool] = (False, False),
    pad: tuple[int, int, int] = (0, 0, 0),
    batch: int = 1,
    batch_pad: int = 0,
    broadcast_a: bool = False,
    beta_zero: bool = True,
    epilogue: str = "none",
    align: int = 16,
) -> Problem:
    """A Problem with leading dimensions ``pad`` elements above the minimum."""
    da, db, dc, compute = dtypes
    ta, tb = trans
    lda = (m if ta else k) + pad[0]
    ldb = (k if tb else n) + pad[1]
    ldc = n + pad[2]
    strides = (0, 0, 0)
    if batch > 1:
        # Explicit strides: the Problem's default (m*n) would overlap padded rows.
        strides = (
            0 if broadcast_a else (k if ta else m) * lda + batch_pad,
            (n if tb else k) * ldb + batch_pad,
            m * ldc + batch_pad,
        )
    return Problem(
        m=m,
        n=n,
        k=k,
        dtype_a=da,
        dtype_b=db,
        dtype_c=dc,
        compute=compute,
        trans_a=ta,
        trans_b=tb,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        batch=batch,
        stride_a=strides[0],
        stride_b=strides[1],
        stride_c=strides[2],
        beta_zero=beta_zero,
        epilogue=epilogue,
        align=align,
    )


Spec = tuple[Problem, float, float]


def _core(dt: tuple[str, str, str, str], quick: bool, large: list[tuple[int, int, int]]) -> list[Spec]:
    """The full treatment, for the backend's main dtype."""
    out: list[Spec] = []
    shapes = SMALL + EDGE + ([] if quick else MEDIUM + large)
    if quick:
        shapes = [*SMALL, (1, 64, 32), (64, 1, 32), (48, 40, 1), (256, 192, 320)]
    out += [(make_problem(*s, dt), 1.0, 0.0) for s in shapes]
    # Every transpose, on sizes that are primes, odd, or 1 in some dimension.
    trans_shapes = (
        [(31, 37, 41)]
        if quick
        else [(7, 13, 17), (31, 37, 41), (127, 129, 65), (1, 64, 32), (64, 1, 32), (48, 40, 1)]
    )
    for s in trans_shapes:
        out += [(make_problem(*s, dt, trans=t), 1.0, 0.0) for t in TRANSPOSES[1:]]
    # Leading dimensions above the minimum: the padding is guarded. The first padding
    # with every transpose, the others (one element, a cache line) with NN and TT.
    if quick:
        out.append((make_problem(31, 37, 41, dt, trans=(True, False), pad=(3, 5, 7)), 1.0, 0.0))
    else:
        for s in [(7, 13, 17), (31, 37, 41), (127, 129, 65)]:
            out += [(make_problem(*s, dt, trans=t, pad=(3, 5, 7)), 1.0, 0.0) for t in TRANSPOSES]
            for p in [(1, 1, 1), (64, 32, 16)]:
                out += [(make_problem(*s, dt, trans=t, pad=p), 1.0, 0.0) for t in TRANSPOSES[::3]]
    # Batches: contiguous, padded (rows and between batches), transposed.
    out.append((make_problem(7, 13, 17, dt, batch=3), 1.0, 0.0))
    out.append(
        (make_problem(31, 37, 41, dt, batch=4, trans=(True, True), pad=(2, 3, 5), batch_pad=11), 1.0, 0.0)
    )
    if not quick:
        out.append((make_problem(1, 1, 1, dt, batch=2), 1.0, 0.0))
        out.append((make_problem(64, 48, 32, dt, batch=5, trans=(False, True)), 1.0, 0.0))
        out.append(
            (
                make_problem(127, 129, 65, dt, batch=2, trans=(True, False), pad=(1, 0, 3), batch_pad=1),
                1.0,
                0.0,
            )
        )
    # Alpha and beta.
    out.append((make_problem(7, 13, 17, dt, beta_zero=False), 1.0, 1.0))
    out.append((make_problem(31, 37, 41, dt, beta_zero=False, pad=(0, 0, 3)), 1.5, -0.75))
    if not quick:
        out.append((make_problem(127, 129, 65, dt, trans=(True, True)), -2.0, 0.0))
        out.append((make_problem(1, 64, 32, dt, beta_zero=False), 0.5, 2.0))
        out.append(
            (make_problem(31, 37, 41, dt, beta_zero=False, batch=2, pad=(1, 2, 3), batch_pad=5), 0.5, 2.0)
        )
        out.append((make_problem(256, 192, 320, dt, beta_zero=False, trans=(False, True)), 1.0, 0.25))
    return out


def _probes(dt: tuple[str, str, str, str]) -> list[Spec]:
    """Problems many backends do not support; each must be answered, not crash."""
    # Pointers one element off a 16-byte boundary (the caller's view at an odd offset).
    align = max(ITEMSIZE[d] for d in dt[:3])
    return [
        (make_problem(7, 13, 17, dt, batch=3, broadcast_a=True), 1.0, 0.0),
        (make_problem(31, 37, 41, dt, align=align), 1.0, 0.0),
        (make_problem(33, 35, 37, dt, align=align, trans=(True, False), pad=(1, 0, 1)), 1.0, 0.0),
    ]


def _secondary(dt: tuple[str, str, str, str], quick: bool) -> list[Spec]:
    """A smaller matrix for each further dtype combination the backend supports."""
    if quick:
        return [
            (make_problem(7, 13, 17, dt, trans=(True, False)), 1.0, 0.0),
            (make_problem(127, 129, 65, dt, trans=(False, True), pad=(1, 2, 3)), 1.0, 0.0),
            (make_problem(31, 37, 41, dt, beta_zero=False, batch=2), 1.5, 0.5),
        ]
    out = [(make_problem(*s, dt), 1.0, 0.0) for s in [*SMALL, (256, 192, 320)]]
    out += [(make_problem(31, 37, 41, dt, trans=t), 1.0, 0.0) for t in TRANSPOSES[1:]]
    out.append((make_problem(127, 129, 65, dt, trans=(False, True), pad=(1, 2, 3)), 1.0, 0.0))
    out.append((make_problem(31, 37, 41, dt, batch=3, pad=(2, 0, 4), batch_pad=3), 1.0, 0.0))
    out.append((make_problem(31, 37, 41, dt, beta_zero=False, batch=2), 1.5, 0.5))
    out.append((make_problem(1, 64, 32, dt, beta_zero=False, trans=(True, True)), -1.0, 1.0))
    return out


def _epilogue(dt: tuple[str, str, str, str], epilogue: str, quick: bool) -> list[Spec]:
    """Cases for one supported epilogue."""
    out = [
        (make_problem(7, 13, 17, dt, epilogue=epilogue), 1.0, 0.0),
        (make_problem(31, 37, 41, dt, epilogue=epilogue, trans=(True, False), pad=(2, 3, 4)), 1.0, 0.0),
    ]
    if not quick:
        out += [
            (make_problem(127, 129, 65, dt, epilogue=epilogue, trans=(False, True)), 1.0, 0.0),
            (make_problem(1, 64, 32, dt, epilogue=epilogue), 1.0, 0.0),
            (make_problem(31, 37, 41, dt, epilogue=epilogue, batch=3, pad=(0, 1, 2), batch_pad=3), 1.0, 0.0),
            (make_problem(31, 37, 41, dt, epilogue=epilogue), -1.5, 0.0),
            (make_problem(31, 37, 41, dt, epilogue=epilogue, beta_zero=False), 1.0, 0.5),
        ]
    return out


# (A, B, output) dtypes of scaled GEMMs, most common first: the first one gets the
# full scaled matrix when the backend supports it, the others a few cases each. The
# fnuz pair is MI300's encoding (no torch array holds it off ROCm).
SCALED_DTYPES: tuple[tuple[str, str, str], ...] = (
    ("f8e4m3", "f8e4m3", "bf16"),
    ("f8e4m3", "f8e4m3", "f16"),
    ("f8e4m3", "f8e4m3", "f32"),
    ("f8e5m2", "f8e4m3", "bf16"),
    ("f8e4m3fnuz", "f8e4m3fnuz", "bf16"),
)
# m anything (1, odd, prime); n and k multiples of 16, which torch._scaled_mm requires on a GPU.
SCALED_SHAPES = [(1, 16, 16), (7, 32, 48), (31, 48, 64), (127, 144, 96), (256, 192, 320)]
SCALED_LARGE_GPU = [(2048, 2048, 1024), (1031, 4096, 512)]


def make_scaled_problem(
    m: int,
    n: int,
    k: int,
    dtypes: tuple[str, str, str] = SCALED_DTYPES[0],
    *,
    scales: str = "tensor",
    bias: bool = False,
    fast_accum: bool = False,
    trans: tuple[bool, bool] = (False, True),
    pad: tuple[int, int, int] = (0, 0, 0),
    align: int = 16,
) -> Problem:
    """A scaled Problem, by default in torch's fp8-linear layout, ``pad`` above tight lds."""
    base = scaled_problem(
        m,
        n,
        k,
        dtype_a=dtypes[0],
        dtype_b=dtypes[1],
        dtype_c=dtypes[2],
        scales=scales,
        bias=bias,
        fast_accum=fast_accum,
    )
    ta, tb = trans
    return replace(
        base,
        trans_a=ta,
        trans_b=tb,
        lda=(m if ta else k) + pad[0],
        ldb=(k if tb else n) + pad[1],
        ldc=n + pad[2],
        align=align,
    )


def _scaled(quick: bool, large: list[tuple[int, int, int]]) -> list[Spec]:
    """The scaled matrix, for a backend that runs the main scaled dtypes."""
    dt = SCALED_DTYPES[0]
    shapes = SCALED_SHAPES[:3] if quick else SCALED_SHAPES + large
    out: list[Spec] = []
    for scales in ("tensor", "rowwise"):
        out += [(make_scaled_problem(*s, dt, scales=scales), 1.0, 0.0) for s in shapes]
        out.append((make_scaled_problem(31, 48, 64, dt, scales=scales, bias=True), 1.0, 0.0))
        out.append((make_scaled_problem(127, 144, 96, dt, scales=scales, pad=(16, 32, 8)), 1.0, 0.0))
        if not quick:
            out.append((make_scaled_problem(127, 144, 96, dt, scales=scales, fast_accum=True), 1.0, 0.0))
            out.append((make_scaled_problem(1, 64, 32, dt, scales=scales, bias=True), 1.0, 0.0))
    for other in SCALED_DTYPES[1:]:
        out.append((make_scaled_problem(31, 48, 64, other), 1.0, 0.0))
        out.append((make_scaled_problem(7, 32, 48, other, scales="rowwise"), 1.0, 0.0))
        if other[2] != "f32":  # torch: no bias with a float32 output
            out.append((make_scaled_problem(31, 48, 64, other, scales="rowwise", bias=True), 1.0, 0.0))
    return out + _block_scaled(quick) + _scaled_probes(dt)


#: Block-scaled sizes: K over several 128-blocks and a part of one, N likewise, m of 1
#: (decode), a few rows and more than a tile's; all multiples of 16 where torch needs it.
BLOCK_SCALED_SHAPES = [(1, 256, 384), (7, 160, 320), (33, 144, 272)]


def _block_scaled(quick: bool) -> list[Spec]:
    """The block-scaled part (1x128 groups of A, 128x128 blocks of B: DeepSeek-V3's and
    Qwen3-FP8's layers), for a backend that runs the main scaled kind."""
    dt = SCALED_DTYPES[0]
    shapes = BLOCK_SCALED_SHAPES[:2] if quick else BLOCK_SCALED_SHAPES
    out: list[Spec] = [(make_scaled_problem(*s, dt, scales="block"), 1.0, 0.0) for s in shapes]
    out.append((make_scaled_problem(7, 160, 320, dt, scales="block", bias=True), 1.0, 0.0))
    if not quick:
        out.append((make_scaled_problem(33, 144, 272, dt, scales="block", fast_accum=True), 1.0, 0.0))
        out.append((make_scaled_problem(7, 160, 320, dt, scales="block", pad=(16, 32, 8)), 1.0, 0.0))
        out.append((make_scaled_problem(7, 160, 320, SCALED_DTYPES[3], scales="block"), 1.0, 0.0))
        out.append((make_scaled_problem(1, 256, 384, SCALED_DTYPES[2], scales="block"), 1.0, 0.0))
    return out


def _scaled_probes(dt: tuple[str, str, str]) -> list[Spec]:
    """Scaled problems fp8 kernels may not take; each must be answered, not crash."""
    return [
        (make_scaled_problem(31, 48, 64, dt, trans=(False, False)), 1.0, 0.0),  # B row-major ("NN")
        (make_scaled_problem(31, 37, 41, dt), 1.0, 0.0),  # n and k not multiples of 16
        (make_scaled_problem(31, 48, 64, dt, scales="rowwise", align=8), 1.0, 0.0),
    ]


def build_matrix(
    supports: Callable[[Problem], bool],
    *,
    quick: bool,
    gpu: bool,
) -> list[tuple[Problem, float, float]]:
    """Every (problem, alpha, beta) to ask the backend about.

    ``supports(problem)`` says whether the backend offers candidates for a problem;
    it sizes the matrix (full treatment for the first supported dtype combination,
    a smaller one for the others, two probes for the rest).
    """
    base = {dt: make_problem(64, 48, 32, dt) for dt in DTYPES}
    supported = [dt for dt in DTYPES if supports(base[dt])]
    main = supported[0] if supported else DTYPES[0]
    specs = _core(main, quick, LARGE_GPU if gpu else LARGE_CPU)
    specs += _probes(main)
    for dt in DTYPES:
        if dt == main:
            continue
        if dt in supported:
            specs += _secondary(dt, quick)
        else:
            specs += [
                (make_problem(7, 13, 17, dt), 1.0, 0.0),
                (make_problem(31, 37, 41, dt, trans=(True, True), beta_zero=False), 1.0, 1.0),
            ]
    epilogue_support = {ep: supports(make_problem(64, 48, 32, main, epilogue=ep)) for ep in EPILOGUES[1:]}
    for ep, ok in epilogue_support.items():
        if ok:
            specs += _epilogue(main, ep, quick)
        else:
            specs.append((make_problem(7, 13, 17, main, epilogue=ep), 1.0, 0.0))
    # Epilogues on the other dtypes: one case per supported pair.
    for dt in supported[1:]:
        for ep, ok in epilogue_support.items():
            if ok and (not quick or ep == "bias_relu"):
                specs.append((make_problem(31, 37, 41, dt, epilogue=ep, trans=(True, False)), 1.0, 0.0))
    # Scaled (fp8) GEMMs: the whole scaled matrix if the backend runs the main kind.
    if supports(make_scaled_problem(64, 48, 32)):
        specs += _scaled(quick, SCALED_LARGE_GPU if gpu else [])
    else:
        specs += [
            (make_scaled_problem(7, 32, 48), 1.0, 0.0),
            (make_scaled_problem(31, 48, 64, scales="rowwise", bias=True), 1.0, 0.0),
        ]
    unique: dict[tuple[str, float, float], Spec] = {}
    for problem, alpha, beta in specs:
        unique.setdefault((problem.key, alpha, beta), (problem, alpha, beta))
    return list(unique.values())
