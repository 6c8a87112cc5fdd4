"""The Triton kernels: split-K GEMVs for decode rows and a tile GEMM (plain, split-K, persistent).

Imported only once the backend knows how it runs (compiled for a GPU, or in Triton's
interpreter on the CPU): ``triton.jit`` decides at decoration time which of the two a
kernel becomes, so ``TRITON_INTERPRET`` must be set before this module is imported.

Every kernel computes ``C[m, n] = act(alpha * A[m, k] @ B[k, n] + beta * C + bias)``
(a scaled, fp8, problem: ``(scale_a * A) @ (scale_b * B) + bias``, the scales per
tensor, per row / column, or per block, SCALE_A / SCALE_B) over a batch, with any strides (a transposed operand is a pair of strides, the unit
one passed as the constant 1 so that loads along it are vectorised), fp32
accumulation, and the same epilogue (``_epilogue``). Split-K partial sums go through
an fp32 workspace with one arrival counter per output tile: every split adds its
partial with fp32 atomics, the last one to arrive reads the sum back (an atomic add of
zero, so the read is made where the atomics were), stores zeros over it, resets the
counter and runs the epilogue. The workspace is
therefore all zeros again after every call, one kernel does the whole product, and
calls queued on one stream never see each other's sums (runners keep one workspace
per stream: calls on two streams may overlap).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Activation codes (constexpr ACT).
ACT_NONE = 0
ACT_RELU = 1
ACT_GELU = 2
ACT_GELU_TANH = 3
ACTIVATIONS = {None: ACT_NONE, "relu": ACT_RELU, "gelu": ACT_GELU, "gelu_tanh": ACT_GELU_TANH}


@triton.jit
def _activate(x, ACT: tl.constexpr):
    if ACT == 1:
        x = tl.maximum(x, 0.0)
    elif ACT == 2:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACT == 3:
        # tanh through exp (portable: CUDA, ROCm and the interpreter): tanh(y) = 1 - 2 / (e^2y + 1),
        # which saturates correctly at both ends (e^2y -> inf gives 1, -> 0 gives -1).
        # |y| <= 15 keeps e^2y finite; tanh(15) is 1 in fp32 already.
        y = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = tl.minimum(tl.maximum(y, -15.0), 15.0)
        t = 1.0 - 2.0 / (tl.exp(2.0 * y) + 1.0)
        x = 0.5 * x * (1.0 + t)
    return x


@triton.jit
def _epilogue(
    acc,
    c_ptr,
    bias_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_cm,
    alpha,
    beta,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
):
    """Scale, add beta*C and the bias, activate, round to C's dtype and store (masked)."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
    out = acc * alpha
    # Two ifs: the outer one is decided at compile time, the inner one per call.
    if HAS_C:  # noqa: SIM102
        # BLAS semantics: C is not read when beta is 0 (it may hold anything, NaN included).
        if beta != 0.0:
            c = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            out = out + beta * c
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        out = out + bias[None, :]
    out = _activate(out, ACT)
    tl.store(ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _finish(
    acc,
    c_ptr,
    bias_ptr,
    ws_ptr,
    cnt_ptr,
    pid_b,
    tile_id,
    offs_m,
    offs_n,
    M,
    N,
    stride_cm,
    alpha,
    beta,
    SPLIT_K: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
):
    """The epilogue directly (one split), or after the split-K reduction (see the module doc).

    ``ws_ptr`` is the fp32 workspace, [batch, M, N] dense, and ``cnt_ptr`` the counters,
    one per tile of every batch (both None without split-K).
    """
    if SPLIT_K == 1:
        _epilogue(acc, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, alpha, beta, HAS_C, HAS_BIAS, ACT)
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        ws = ws_ptr + pid_b * M * N + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.atomic_add(ws, acc, mask=mask, sem="relaxed")
        # Every thread's adds are issued before one thread releases the tile's counter.
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel")
        tl.debug_barrier()
        if arrived == SPLIT_K - 1:
            # Read the sum where the atomics were made (L2), then leave zeros for the next call.
            zeros = tl.zeros_like(acc)
            total = tl.where(mask, tl.atomic_add(ws, zeros, mask=mask, sem="relaxed"), 0.0)
            tl.store(ws, zeros, mask=mask)
            tl.store(cnt_ptr + tile_id, 0)
            _epilogue(
                total, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, alpha, beta, HAS_C, HAS_BIAS, ACT
            )


@triton.jit
def _k_slice(pid_k, K, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The K range [k_start, k_stop) of split ``pid_k``: whole BLOCK_K blocks a split (the last
    may be short, or empty)."""
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * k_per_split
    return k_start, tl.minimum(K, k_start + k_per_split)


@triton.jit
def _scaled(acc, sa_ptr, sb_ptr, offs_m, offs_n, M, N, SCALE_A: tl.constexpr, SCALE_B: tl.constexpr):
    """A scaled GEMM's per-tensor (1) or row-wise (2) scales applied to an fp32 tile (or to
    one split's partial sum: the scales are linear), before the epilogue adds the bias.
    Block scales (3) are applied in the K loop instead, and nothing is done here (0)."""
    if SCALE_A == 1:
        acc = acc * tl.load(sa_ptr)
    elif SCALE_A == 2:
        acc = acc * tl.load(sa_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    if SCALE_B == 1:
        acc = acc * tl.load(sb_ptr)
    elif SCALE_B == 2:
        acc = acc * tl.load(sb_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    return acc


@triton.jit
def _block_scales(sa_ptr, sb_ptr, offs_m, offs_n, kb, M, N, stride_sam, stride_sak, stride_sbk, stride_sbn):
    """The block scales of K block ``kb`` (a vector: each its own block): A's [BLOCK_M] (1x128
    groups) and B's [BLOCK_N] (128x128 blocks), 0 outside the matrix."""
    sa = tl.load(sa_ptr + offs_m * stride_sam + kb * stride_sak, mask=offs_m < M, other=0.0)
    sb = tl.load(sb_ptr + kb * stride_sbk + (offs_n // 128) * stride_sbn, mask=offs_n < N, other=0.0)
    return sa, sb


@triton.jit
def _dot(a, b, acc, FAST_ACCUM: tl.constexpr):
    """``acc + a @ b`` on tensor cores; fp8 without FAST_ACCUM promotes every instruction's
    sum to fp32 (cuBLASLt's precise mode), with it keeps Hopper's fast accumulator over
    the whole loop (Triton's default there; no effect on 16-bit inputs)."""
    if FAST_ACCUM:  # noqa: SIM108 - a compile-time branch, as Triton reads it
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=0)
    return acc


@triton.jit
def gemv_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    alpha,
    beta,
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """Few rows of A (M <= BLOCK_M <= 8) against a weight: CUDA-core FMAs, no tensor cores.

    Program (pid_n, pid_k, batch) owns BLOCK_N columns of C and one K slice; each tile of
    B it loads ([BLOCK_K, BLOCK_N], vectorised along B's unit stride) is read exactly
    once and multiplied by every row of A. Products accumulate in a [BLOCK_M, BLOCK_K,
    BLOCK_N] fp32 tensor that is reduced over K once, after the loop.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    a_ptr += pid_b * stride_ab
    b_ptr += pid_b * stride_bb
    c_ptr += pid_b * stride_cb
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_start, k_stop = _k_slice(pid_k, K, SPLIT_K, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_start + offs_k)[None, :].to(tl.int64) * stride_ak
    b_ptrs = (
        b_ptr
        + (k_start + offs_k)[:, None].to(tl.int64) * stride_bk
        + offs_n[None, :].to(tl.int64) * stride_bn
    )
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            a = tl.load(a_ptrs, mask=mask_m & ((k + offs_k)[None, :] < k_stop), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & ((k + offs_k)[:, None] < k_stop), other=0.0)
        acc += a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    total = _scaled(tl.sum(acc, axis=1), sa_ptr, sb_ptr, offs_m, offs_n, M, N, SCALE_A, SCALE_B)
    tile_id = pid_b * tl.num_programs(0) + pid_n
    _finish(
        total,
        c_ptr,
        bias_ptr,
        ws_ptr,
        cnt_ptr,
        pid_b,
        tile_id,
        offs_m,
        offs_n,
        M,
        N,
        stride_cm,
        alpha,
        beta,
        SPLIT_K,
        HAS_C,
        HAS_BIAS,
        ACT,
    )


@triton.jit
def rows_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    alpha,
    beta,
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """A row of A against whole rows of an nn.Linear weight (B = W.T, K its unit stride).

    Program (pid_n, pid_k, batch) owns BLOCK_N columns of C, i.e. BLOCK_N rows of W, and
    one K slice; it loads [BLOCK_N, BLOCK_K] tiles along those rows (2-8 rows of 2-4K
    elements: 8-32 KB, contiguous and vectorised, as the weight-read kernel streams them),
    multiplies them by A's row and sums each tile at once into [BLOCK_M, BLOCK_N] fp32.
    Launched as the GEMV is (same arguments and grid); only the tile's orientation and
    when it is summed differ.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    a_ptr += pid_b * stride_ab
    b_ptr += pid_b * stride_bb
    c_ptr += pid_b * stride_cb
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_start, k_stop = _k_slice(pid_k, K, SPLIT_K, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + (k_start + offs_k)[None, :].to(tl.int64) * stride_ak
    b_ptrs = (
        b_ptr
        + offs_n[:, None].to(tl.int64) * stride_bn
        + (k_start + offs_k)[None, :].to(tl.int64) * stride_bk
    )
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            in_k = (k + offs_k)[None, :] < k_stop
            a = tl.load(a_ptrs, mask=mask_m & in_k, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & in_k, other=0.0)
        part = a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
        if SCALE_A == 3:
            # Block scales (BLOCK_K a multiple of 128): each group of 128 of K summed, then
            # scaled by its row's group scale and its columns' block scale.
            groups = tl.sum(tl.reshape(part, (BLOCK_M, BLOCK_N, BLOCK_K // 128, 128)), axis=3)
            kg = k // 128 + tl.arange(0, BLOCK_K // 128)
            in_g = kg[None, :] < tl.cdiv(k_stop, 128)
            sa = tl.load(
                sa_ptr + offs_m[:, None] * stride_sam + kg[None, :] * stride_sak,
                mask=mask_m & in_g,
                other=0.0,
            )
            sb = tl.load(
                sb_ptr + (offs_n // 128)[:, None] * stride_sbn + kg[None, :] * stride_sbk,
                mask=mask_n & in_g,
                other=0.0,
            )
            acc += tl.sum(groups * sa[:, None, :] * sb[None, :, :], axis=2)
        else:
            acc += tl.sum(part, axis=2)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = _scaled(acc, sa_ptr, sb_ptr, offs_m, offs_n, M, N, SCALE_A, SCALE_B)
    tile_id = pid_b * tl.num_programs(0) + pid_n
    _finish(
        acc,
        c_ptr,
        bias_ptr,
        ws_ptr,
        cnt_ptr,
        pid_b,
        tile_id,
        offs_m,
        offs_n,
        M,
        N,
        stride_cm,
        alpha,
        beta,
        SPLIT_K,
        HAS_C,
        HAS_BIAS,
        ACT,
    )


@triton.jit
def _tile(
    a_ptr,
    b_ptr,
    offs_m,
    offs_n,
    M,
    N,
    k_start,
    k_stop,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of A @ B over K in [k_start, k_stop), fp32, on tensor cores.

    Block-scaled (SCALE_A == 3, BLOCK_K dividing 128): each step's product is scaled by
    its K block's scales before it joins the sum (the DeepSeek-V3 / vLLM block-fp8 shape);
    per-tensor and row-wise scales are applied afterwards (:func:`_scaled`)."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = (
        a_ptr
        + offs_m[:, None].to(tl.int64) * stride_am
        + (k_start + offs_k)[None, :].to(tl.int64) * stride_ak
    )
    b_ptrs = (
        b_ptr
        + (k_start + offs_k)[:, None].to(tl.int64) * stride_bk
        + offs_n[None, :].to(tl.int64) * stride_bn
    )
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=mask_m, other=0.0)
            b = tl.load(b_ptrs, mask=mask_n, other=0.0)
        else:
            a = tl.load(a_ptrs, mask=mask_m & ((k + offs_k)[None, :] < k_stop), other=0.0)
            b = tl.load(b_ptrs, mask=mask_n & ((k + offs_k)[:, None] < k_stop), other=0.0)
        if SCALE_A == 3:
            sa, sb = _block_scales(
                sa_ptr, sb_ptr, offs_m, offs_n, k // 128, M, N, stride_sam, stride_sak, stride_sbk, stride_sbn
            )
            part = _dot(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), FAST_ACCUM)
            acc += part * sa[:, None] * sb[None, :]
        else:
            acc = _dot(a, b, acc, FAST_ACCUM)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return _scaled(acc, sa_ptr, sb_ptr, offs_m, offs_n, M, N, SCALE_A, SCALE_B)


@triton.jit
def tile_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    alpha,
    beta,
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """One output tile (and one K slice) per program; tiles in GROUP_M-row bands for L2 reuse.

    With BLOCK_M = 16 this is also the skinny (decode) kernel on tensor cores: one band
    of rows, programs spread over N and split over K.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % rows
    pid_n = (pid % group) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start, k_stop = _k_slice(pid_k, K, SPLIT_K, BLOCK_K)
    acc = _tile(
        a_ptr + pid_b * stride_ab,
        b_ptr + pid_b * stride_bb,
        offs_m,
        offs_n,
        M,
        N,
        k_start,
        k_stop,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        sa_ptr,
        sb_ptr,
        stride_sam,
        stride_sak,
        stride_sbk,
        stride_sbn,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        EVEN_K,
        SCALE_A,
        SCALE_B,
        FAST_ACCUM,
    )
    tile_id = pid_b * tl.num_programs(0) + pid
    _finish(
        acc,
        c_ptr + pid_b * stride_cb,
        bias_ptr,
        ws_ptr,
        cnt_ptr,
        pid_b,
        tile_id,
        offs_m,
        offs_n,
        M,
        N,
        stride_cm,
        alpha,
        beta,
        SPLIT_K,
        HAS_C,
        HAS_BIAS,
        ACT,
    )


@triton.jit
def persistent_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    BATCH,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    alpha,
    beta,
    sa_ptr,
    sb_ptr,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_C: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    SCALE_A: tl.constexpr,
    SCALE_B: tl.constexpr,
    FAST_ACCUM: tl.constexpr,
):
    """As many programs as fit on the device at once, each looping over tiles (batch included).

    The grid is sized after compiling, from the kernel's real registers and shared memory.

    Saves the launch and ramp of one program per tile, and lets a program's next loads
    overlap its previous tile's epilogue.
    """
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_batch = tiles_m * tiles_n
    group = GROUP_M * tiles_n
    for tile in range(pid, per_batch * BATCH, tl.num_programs(0)):
        batch = (tile // per_batch).to(tl.int64)
        t = tile % per_batch
        first_m = (t // group) * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (t % group) % rows
        pid_n = (t % group) // rows
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _tile(
            a_ptr + batch * stride_ab,
            b_ptr + batch * stride_bb,
            offs_m,
            offs_n,
            M,
            N,
            0,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            sa_ptr,
            sb_ptr,
            stride_sam,
            stride_sak,
            stride_sbk,
            stride_sbn,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
            SCALE_A,
            SCALE_B,
            FAST_ACCUM,
        )
        _epilogue(
            acc,
            c_ptr + batch * stride_cb,
            bias_ptr,
            offs_m,
            offs_n,
            M,
            N,
            stride_cm,
            alpha,
            beta,
            HAS_C,
            HAS_BIAS,
            ACT,
        )


KERNELS = {"gemv": gemv_kernel, "rows": rows_kernel, "tile": tile_kernel, "persistent": persistent_kernel}
