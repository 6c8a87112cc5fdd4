"""The grouped GEMM kernel (``grouped.py`` says what it serves).

Imported once the backend knows how it runs: ``triton.jit`` decides at decoration time
whether the kernel is compiled or interpreted, so ``TRITON_INTERPRET`` is set before.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    offs_ptr,
    G,
    M,
    N,
    K,
    stride_ag,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_cg,
    stride_cm,
    stride_cn,
    PROGRAMS,
    JAGGED: tl.constexpr,  # 0: offs cut M (2-D a, 3-D b); 1: K (2-D x 2-D); 2: N (3-D a, 2-D b); 3: none
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``C_g = A_g @ B_g`` for every group g, persistent over the tiles of all groups."""
    pid = tl.program_id(0)
    tile_base = 0
    start = 0
    for g in range(G):
        m_lo = 0
        m_hi = M
        n_lo = 0
        n_hi = N
        k_lo = 0
        k_hi = K
        if JAGGED != 3:
            end = tl.load(offs_ptr + g)
            if JAGGED == 0:
                extent = M
            elif JAGGED == 1:
                extent = K
            else:
                extent = N
            # torch's slices: [start, end) clamped to the operand, empty when end < start
            lo = tl.minimum(tl.maximum(start, 0), extent)
            hi = tl.maximum(tl.minimum(tl.maximum(end, 0), extent), lo)
            start = end
            if JAGGED == 0:
                m_lo = lo
                m_hi = hi
            elif JAGGED == 1:
                k_lo = lo
                k_hi = hi
            else:
                n_lo = lo
                n_hi = hi
        g64 = tl.full((), 0, tl.int64) + g
        a_base = a_ptr + g64 * stride_ag
        b_base = b_ptr + g64 * stride_bg
        c_base = c_ptr + g64 * stride_cg
        tiles_n = tl.cdiv(n_hi - n_lo, BLOCK_N)
        tiles = tl.cdiv(m_hi - m_lo, BLOCK_M) * tiles_n
        first = tile_base + (pid - tile_base % PROGRAMS + PROGRAMS) % PROGRAMS
        for t in range(first, tile_base + tiles, PROGRAMS):
            local = t - tile_base
            rm = m_lo + (local // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = n_lo + (local % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
            rk = tl.arange(0, BLOCK_K)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BLOCK_K):
                kk = k0 + rk
                a = tl.load(
                    a_base + rm[:, None].to(tl.int64) * stride_am + kk[None, :].to(tl.int64) * stride_ak,
                    mask=(rm[:, None] < m_hi) & (kk[None, :] < k_hi),
                    other=0.0,
                )
                b = tl.load(
                    b_base + kk[:, None].to(tl.int64) * stride_bk + rn[None, :].to(tl.int64) * stride_bn,
                    mask=(kk[:, None] < k_hi) & (rn[None, :] < n_hi),
                    other=0.0,
                )
                acc = tl.dot(a, b, acc)
            tl.store(
                c_base + rm[:, None].to(tl.int64) * stride_cm + rn[None, :].to(tl.int64) * stride_cn,
                acc.to(c_ptr.dtype.element_ty),
                mask=(rm[:, None] < m_hi) & (rn[None, :] < n_hi),
            )
        tile_base += tiles


@triton.jit(do_not_specialize=["M", "SLOTS"])  # one compile for every token count
def grouped_rows_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    offs_ptr,
    G,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bg,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    SLOTS,
    G_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The ``m`` form (``offs`` cut a's rows), one program per (row tile, column tile).

    Every program reads all of ``offs`` at once, counts each group's row tiles and finds
    its own group by a prefix sum: no loop over the groups, so many experts cost one
    vector load. ``SLOTS`` row-tile slots bound the tiles of any ``offs`` of the call;
    the slots past the call's tiles return at once.
    """
    pid = tl.program_id(0)
    slot = pid % SLOTS
    pid_n = pid // SLOTS
    gi = tl.arange(0, G_POW2)
    inside = gi < G
    ends = tl.load(offs_ptr + gi, mask=inside, other=0)
    starts = tl.load(offs_ptr + gi - 1, mask=inside & (gi > 0), other=0)
    # torch's slices: [start, end) clamped to a's rows, empty when end < start
    lo = tl.minimum(tl.maximum(starts, 0), M)
    hi = tl.maximum(tl.minimum(tl.maximum(ends, 0), M), lo)
    hi = tl.where(inside, hi, lo)
    tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M
    last = tl.cumsum(tiles, 0)  # one past each group's last tile
    if slot >= tl.sum(tiles):
        return
    g = tl.sum((last <= slot).to(tl.int32))
    own = gi == g
    first = tl.sum(tl.where(own, last - tiles, 0))
    m_lo = tl.sum(tl.where(own, lo, 0))
    m_hi = tl.sum(tl.where(own, hi, 0))
    rm = m_lo + (slot - first) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    b_base = b_ptr + g.to(tl.int64) * stride_bg
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am
    b_cols = b_base + rn[None, :].to(tl.int64) * stride_bn
    row_ok = rm[:, None] < m_hi
    col_ok = rn[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_rows + kk[None, :].to(tl.int64) * stride_ak, mask=row_ok & (kk[None, :] < K), other=0.0)
        b = tl.load(b_cols + kk[:, None].to(tl.int64) * stride_bk, mask=(kk[:, None] < K) & col_ok, other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(
        c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :].to(tl.int64) * stride_cn,
        acc.to(c_ptr.dtype.element_ty),
        mask=row_ok & col_ok,
    )
