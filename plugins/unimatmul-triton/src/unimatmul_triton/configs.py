"""The config space of each kernel family, and the analytic model that prunes it.

A :class:`KernelConfig` is one Candidate: a kernel name and its block sizes, split,
warps and stages. For a Problem, :func:`ranked_configs` enumerates every config that
applies, drops those that cannot run (shared memory over the per-block limit, a
register estimate that would spill heavily), scores the rest with a roofline model
of the device (bytes against the copy bandwidth, flops against the tensor-core peak,
waves of programs over the SMs, latency hiding from bytes in flight, split-K
traffic and launch costs) and returns them best first, the best of each family and
split style ahead of the rest, so that a short list still has every kind of kernel
in it. Only the few at the top are compiled and measured: the model ranks, the
harness decides.

Nothing here imports Triton or torch: it runs anywhere, tests included.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from unimatmul import Candidate, Problem

BACKEND = "triton"

#: Kernel families (the Candidate names).
GEMV = "gemv"  # CUDA-core FMAs, few rows (m <= GEMV_MAX_M)
ROWS = "rows"  # CUDA-core FMAs, one row of A against whole weight rows (nn.Linear layout)
SKINNY = "skinny"  # tensor cores, one 16-row band (m <= SKINNY_MAX_M)
TILE = "tile"  # tensor cores, tiles over m and n, optional split-K
PERSISTENT = "persistent"  # tensor cores, one program per resident slot, looping over tiles
NAMES = (GEMV, ROWS, SKINNY, TILE, PERSISTENT)
#: The families that multiply on the CUDA cores (no tensor-core tile, no pipeline of dots).
FMA_KERNELS = (GEMV, ROWS)

GEMV_MAX_M = 8
#: The rows kernel: m = 1 only. On the H200 (decode_lab.py): at m = 1 it ran
#: 1x4096x4096 in 11.3 us against the GEMV's 12.2 (torch 13.5); at m = 4 its per-tile
#: sums over a [4, block_n, block_k] product were 1.3-1.7x slower than the best offered.
ROWS_MAX_M = 1
#: Its tiles (block_n, warps), of block_k = K's next power of two in [1024, 4096]: 8-32 KB
#: of whole weight rows a program, the size the weight-read kernel streams. In decode_lab's
#: sweep (114-128 configs a shape, block_n 1-16, block_k 512-4096, 1-4 programs a SM or one
#: per tile) these were the fastest or within 1 % of it on every K = 4096 weight, and
#: every winner ran one program a tile. The sweep had no split-K, and the space offers none.
ROWS_TILES = ((4, 4), (2, 8))
SKINNY_MAX_M = 16
SKINNY_BLOCK_M = 16

_ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "f8e4m3": 1, "f8e5m2": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1}


@dataclass(frozen=True)
class Device:
    """What the model needs to know about a GPU. Defaults: the H200 (measured, GPU-NOTES)."""

    sms: int = 132
    bandwidth: float = 4.3e12  # bytes/s, device-to-device copy
    tensor_flops: float = 790e12  # 16-bit inputs, fp32 accumulation
    fma_flops: float = 60e12  # fp32 FMA on the CUDA cores (2 flops each)
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024
    regs_per_sm: int = 65536
    max_threads_per_sm: int = 2048
    latency_s: float = 0.9e-6  # DRAM latency under load: bytes in flight = bandwidth x latency
    launch_s: float = 2.5e-6  # a kernel's launch and ramp, seen inside a graph of back-to-back calls

    def scaled(self, sms: int, smem_per_block: int | None = None) -> Device:
        """Another GPU of the same kind with ``sms`` SMs (rates scale with SMs)."""
        ratio = sms / self.sms
        return Device(
            sms=sms,
            bandwidth=self.bandwidth * ratio,
            tensor_flops=self.tensor_flops * ratio,
            fma_flops=self.fma_flops * ratio,
            smem_per_sm=self.smem_per_sm,
            smem_per_block=smem_per_block or self.smem_per_block,
            regs_per_sm=self.regs_per_sm,
            max_threads_per_sm=self.max_threads_per_sm,
            latency_s=self.latency_s,
            launch_s=self.launch_s,
        )


H200 = Device()


@dataclass(frozen=True)
class KernelConfig:
    """One kernel with its compile-time parameters: exactly one Candidate."""

    kernel: str
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split_k: int = 1
    group_m: int = 1

    @property
    def candidate(self) -> Candidate:
        params: dict[str, int] = {
            "block_n": self.block_n,
            "block_k": self.block_k,
            "warps": self.warps,
            "stages": self.stages,
        }
        if self.kernel in (TILE, PERSISTENT):
            params["block_m"] = self.block_m
            params["group_m"] = self.group_m
        if self.kernel != PERSISTENT:
            params["split_k"] = self.split_k
        return Candidate.make(BACKEND, self.kernel, **params)

    def smem_bytes(self, itemsize: int) -> int:
        """Shared memory of the software pipeline (operand tiles of every stage)."""
        if self.kernel == ROWS:
            return 0  # one stage: its loads go to registers
        if self.kernel == GEMV:
            # Loads that feed no dot may still be pipelined through shared memory.
            return max(self.stages - 1, 0) * self.block_k * (self.block_n + self.block_m) * itemsize
        return self.stages * self.block_k * (self.block_m + self.block_n) * itemsize

    def regs_per_thread(self) -> int:
        """A rough register estimate: the fp32 accumulator spread over the threads, plus a base."""
        threads = 32 * self.warps
        if self.kernel == ROWS:
            # The [block_m, block_n, block_k] fp32 product before each tile's sum, and B.
            product = self.block_m * self.block_n * self.block_k / threads
            return int(product + self.block_k * self.block_n / threads / 2 + 32)
        if self.kernel == GEMV:
            acc = self.block_m * self.block_n * self.block_k / threads
            operands = self.block_k * self.block_n / threads / 2  # 16-bit pairs of B
            return int(acc + operands + 32)
        return int(self.block_m * self.block_n / threads + 48)


def config_of(problem: Problem, candidate: Candidate) -> KernelConfig | None:
    """The config a Candidate names for this problem, or None when it is not one of ours.

    Anything applicable is accepted (a stored identity may come from an older model's
    ranking): the checks are the ones the kernels need, not membership of the short list.
    """
    if candidate.backend != BACKEND or candidate.name not in NAMES:
        return None
    params: dict[str, int] = {k: v for k, v in candidate.params if type(v) is int}
    if len(params) != len(candidate.params):
        return None
    expected = {name for name, _ in KernelConfig(candidate.name, 1, 1, 1, 1, 1).candidate.params}
    if set(params) != expected:
        return None
    block_m = params.get("block_m", 0)
    if candidate.name in FMA_KERNELS:
        block_m = _pow2_at_least(problem.m)
    elif candidate.name == SKINNY:
        block_m = SKINNY_BLOCK_M
    config = KernelConfig(
        kernel=candidate.name,
        block_m=block_m,
        block_n=params["block_n"],
        block_k=params["block_k"],
        warps=params["warps"],
        stages=params["stages"],
        split_k=params.get("split_k", 1),
        group_m=params.get("group_m", 1),
    )
    return config if applies(problem, config) else None


def _is_pow2(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def _pow2_at_least(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def applies(problem: Problem, config: KernelConfig, device: Device = H200) -> bool:
    """Whether the kernel can run this problem with this config (shape limits, resources)."""
    c = config
    dims = (c.block_n, c.block_k, c.warps)
    if not all(_is_pow2(v) for v in (*dims, c.block_m)) or c.warps > 16 or c.stages < 1 or c.stages > 8:
        return False
    if c.split_k < 1 or c.split_k > 64 or c.group_m < 1 or c.group_m > 64:
        return False
    if c.kernel in FMA_KERNELS:
        most = GEMV_MAX_M if c.kernel == GEMV else ROWS_MAX_M
        if problem.m > most or c.block_m != _pow2_at_least(problem.m) or c.group_m != 1:
            return False
        # The rows kernel loads whole rows of B along K: only where K is B's unit stride
        # (x @ W.T), in one stage.
        if c.kernel == ROWS and (not problem.trans_b or c.stages != 1):
            return False
    elif c.kernel == SKINNY:
        if problem.m > SKINNY_MAX_M or c.block_m != SKINNY_BLOCK_M or c.group_m != 1:
            return False
    elif c.kernel in (TILE, PERSISTENT):
        if c.block_m < 16:
            return False
        if c.kernel == PERSISTENT and c.split_k != 1:
            return False
    else:
        return False
    if problem.is_scaled and not _applies_scaled(problem, c):
        return False
    if c.kernel not in FMA_KERNELS and (c.block_n < 16 or c.block_k < 16):
        return False  # tensor-core tiles are at least 16 wide
    if c.kernel in (*FMA_KERNELS, SKINNY) and c.block_n * c.block_k < 2048:
        return False  # under 4 KB of B per iteration: loop overhead, not bandwidth, decides
    itemsize = _ITEMSIZE.get(problem.dtype_a, 2)
    if c.smem_bytes(itemsize) > device.smem_per_block:
        return False
    return c.regs_per_thread() <= 255


def _applies_scaled(problem: Problem, c: KernelConfig) -> bool:
    """Whether the kernel applies a scaled problem's scales (see :func:`space`)."""
    if c.kernel == PERSISTENT:
        return False
    if not problem.is_block_scaled:
        return True
    if c.kernel == GEMV:
        return False
    return c.block_k % 128 == 0 if c.kernel == ROWS else 128 % c.block_k == 0


# --- the config space -------------------------------------------------------------------


def _splits(k: int, block_k: int, most: int = 32) -> list[int]:
    """Split-K factors that leave every split at least two blocks of K."""
    return [
        s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) if s <= most and s * block_k * 2 <= max(k, block_k * 2)
    ]


def space(problem: Problem) -> list[KernelConfig]:
    """Every config worth scoring for this problem (before the model prunes it).

    A scaled (fp8) problem: K blocks for one-byte operands, no persistent kernel, and,
    block-scaled, no GEMV (it sums over K once, after its loop) and tensor-core K blocks
    that divide 128 (each K step's product is scaled by its block's scales); the rows
    kernel sums groups of 128 inside its whole-row tiles (all multiples of 128).
    """
    m = problem.m
    scaled, block = problem.is_scaled, problem.is_block_scaled
    gemv_k = (128, 256, 512) if scaled else (64, 128, 256, 512)
    skinny_k = (64, 128) if block else (64, 128, 256)
    tile_k = (64, 128) if scaled else (32, 64)
    found: list[KernelConfig] = []
    if m <= GEMV_MAX_M and not block:
        bm = _pow2_at_least(m)
        for bn, bk, warps, stages in product((8, 16, 32, 64), gemv_k, (4, 8), (1, 3)):
            for split in _splits(problem.k, bk):
                found.append(KernelConfig(GEMV, bm, bn, bk, warps, stages, split))
    if m <= ROWS_MAX_M and problem.trans_b:
        bk = min(4096, max(1024, _pow2_at_least(problem.k)))
        found += [KernelConfig(ROWS, 1, bn, bk, warps, 1) for bn, warps in ROWS_TILES]
    if m <= SKINNY_MAX_M:
        for bn, bk, warps, stages in product((16, 32, 64, 128), skinny_k, (4, 8), (3, 4, 6)):
            for split in _splits(problem.k, bk):
                found.append(KernelConfig(SKINNY, SKINNY_BLOCK_M, bn, bk, warps, stages, split))
    else:
        block_ms = [
            bm for bm in (16, 32, 64, 128) if bm <= max(64, _pow2_at_least(m)) and (bm >= 64 or m <= 64)
        ]
        for bm, bn, bk, warps, stages in product(block_ms, (64, 128, 256), tile_k, (4, 8), (3, 4)):
            if bm * bn >= 128 * 256 and warps == 4:
                continue  # a 128x256 fp32 accumulator does not fit four warps' registers
            for split in _splits(problem.k, bk, most=16):
                found.append(KernelConfig(TILE, bm, bn, bk, warps, stages, split, group_m=8))
            if not scaled:
                found.append(KernelConfig(PERSISTENT, bm, bn, bk, warps, stages, 1, group_m=8))
    return [c for c in found if applies(problem, c)]


# --- the model ----------------------------------------------------------------------------


@dataclass
class Estimate:
    """The model's time for one config, with the terms it came from (for reports)."""

    config: KernelConfig
    seconds: float
    terms: dict[str, float] = field(default_factory=dict)


def residency(config: KernelConfig, itemsize: int, device: Device) -> int:
    """Programs of this config resident on one SM at once (shared memory, threads, registers)."""
    threads = 32 * config.warps
    by_threads = device.max_threads_per_sm // threads
    regs = max(config.regs_per_thread(), 32)
    by_regs = device.regs_per_sm // (regs * threads) if regs * threads <= device.regs_per_sm else 0
    smem = config.smem_bytes(itemsize) + 1024
    by_smem = device.smem_per_sm // smem
    return max(1, min(by_threads, by_regs, by_smem, 32))


def programs(problem: Problem, config: KernelConfig, device: Device = H200) -> int:
    """How many programs the kernel launches (the persistent kernel: as many as fit)."""
    tiles = math.ceil(problem.m / config.block_m) * math.ceil(problem.n / config.block_n) * problem.batch
    if config.kernel == PERSISTENT:
        itemsize = _ITEMSIZE.get(problem.dtype_a, 2)
        return min(tiles, device.sms * residency(config, itemsize, device))
    return tiles * config.split_k


def estimate(problem: Problem, config: KernelConfig, device: Device = H200) -> Estimate:
    """The modelled time of one call (seconds), from bytes, flops, waves and latency hiding."""
    c = config
    itemsize = _ITEMSIZE.get(problem.dtype_a, 2)
    out_size = _ITEMSIZE.get(problem.dtype_c, 2)
    resident = residency(c, itemsize, device)
    slots = device.sms * resident
    count = programs(problem, c, device)
    tiles_m = math.ceil(problem.m / c.block_m)
    tiles_n = math.ceil(problem.n / c.block_n)

    # Bytes from DRAM: B once, A once per band of columns that L2 cannot keep, C once
    # (twice when beta != 0), plus the split-K partials (fp32 atomics, mostly in L2).
    b_bytes = (
        problem.k
        * problem.n
        * itemsize
        * (1 if problem.stride_b == 0 and problem.batch > 1 else problem.batch)
    )
    a_bytes = (
        problem.m
        * problem.k
        * itemsize
        * (1 if problem.stride_a == 0 and problem.batch > 1 else problem.batch)
    )
    c_bytes = problem.m * problem.n * out_size * problem.batch * (1 if problem.beta_zero else 2)
    a_passes = 1.0 if a_bytes < 16 << 20 else max(1.0, tiles_n / 8)
    b_passes = 1.0 if b_bytes < 16 << 20 else max(1.0, tiles_m / 8)
    split_bytes = 0.0
    if c.split_k > 1:
        split_bytes = 3.0 * problem.m * problem.n * problem.batch * 4 * c.split_k / 4  # L2 atomics ~4x DRAM
    dram = a_bytes * a_passes + b_bytes * b_passes + c_bytes + split_bytes

    # Latency hiding: the bytes a resident program keeps in flight (its pipeline's
    # stages, or one tile of loads for the FMA kernel) against bandwidth x latency.
    fma = c.kernel in FMA_KERNELS
    stages_in_flight = max(1, c.stages - 1) if not fma else max(1, c.stages)
    per_program = c.block_k * (c.block_n + (c.block_m if not fma else 0)) * itemsize * stages_in_flight
    busy = min(count, slots)
    in_flight = per_program * busy
    hiding = min(1.0, in_flight / (device.bandwidth * device.latency_s))
    # Fewer programs than SMs leave SMs without loads to issue.
    spread = min(1.0, count / device.sms)
    t_mem = dram / (device.bandwidth * max(hiding, 0.05) * max(spread, 0.05) ** 0.5)

    # Compute: waves of programs over the SMs, each program's tile at a per-SM rate.
    flops_per_program = 2.0 * c.block_m * c.block_n * math.ceil(problem.k / c.split_k)
    if fma:
        # FMAs on real rows only (BLOCK_M is the next power of two of m).
        rate = device.fma_flops / device.sms * (problem.m / c.block_m)
        efficiency = 0.6
    else:
        rate = device.tensor_flops / device.sms
        # Small tiles reuse operands less (mma without wgmma below 64 rows).
        efficiency = {16: 0.35, 32: 0.45, 64: 0.65, 128: 0.8}.get(c.block_m, 0.8)
        efficiency *= min(1.0, c.block_n / 128) ** 0.3 * min(1.0, c.block_k / 64) ** 0.2
        if c.kernel == PERSISTENT:
            efficiency *= 1.05  # the next tile's loads overlap this tile's epilogue
    if c.kernel == PERSISTENT:
        tiles = tiles_m * tiles_n * problem.batch
        waves = math.ceil(tiles / slots) if tiles > 0 else 1
        t_compute = waves * resident * flops_per_program / (rate * efficiency)
    else:
        waves = math.ceil(count / slots)
        t_compute = waves * resident * flops_per_program / (rate * efficiency)

    # Each iteration of a program's K loop costs issue slots (addresses, masks, a barrier
    # and a pipeline wait) whatever its size; the SM's four schedulers share them.
    iterations = count * math.ceil(math.ceil(problem.k / c.split_k) / c.block_k)
    t_loop = iterations / device.sms * 60e-9 / 4
    overhead = device.launch_s + 0.3e-6 * math.ceil(count / slots) + t_loop
    if c.split_k > 1:
        overhead += 0.6e-6  # the last split's reduction and epilogue run after the others
    seconds = max(t_mem, t_compute) + overhead
    return Estimate(
        c,
        seconds,
        {
            "mem_s": t_mem,
            "compute_s": t_compute,
            "overhead_s": overhead,
            "programs": count,
            "resident": resident,
        },
    )


#: Configs offered where the K loop's loads cannot be vectorised (see :func:`vector_loads`).
UNALIGNED_CANDIDATES = 2


def vector_loads(problem: Problem) -> bool:
    """Whether Triton can vectorise the loads of A and B in the K loop.

    Triton marks an integer argument divisible (``tt.divisibility=16``) only when it is a
    multiple of 16, and a pointer from the Problem's alignment (``launch.plan_for``). A
    stride that steps between rows of A or B (over a dimension longer than 1) and is not a
    multiple of 16, or a pointer below 16 bytes, leaves every row start unproven, and the
    loads go element by element. Measured on the H200: every tile candidate
    of 1000^3 (lda = ldb = 1000) took ~166 us against cuBLASLt's 7.7, and of
    1024 x 1025 x 1024 (ldb = 1025) 34 us against 15 (padded).
    """
    p = problem
    if p.align < 16:
        return False
    steps = [
        (p.lda, p.k if p.trans_a else p.m),  # A: between its rows (or columns when transposed)
        (p.ldb, p.n if p.trans_b else p.k),
    ]
    if p.batch > 1:
        steps += [(p.stride_a, p.batch), (p.stride_b, p.batch)]
    return all(stride % 16 == 0 for stride, extent in steps if extent > 1 and stride not in (0, 1))


def offered(problem: Problem, count: int) -> int:
    """How many of the ranked configs to measure: ``count``, or UNALIGNED_CANDIDATES where
    the loads cannot be vectorised (the model has no term for it; its two best are still
    measured, so a Triton kernel that wins there is still found)."""
    return count if vector_loads(problem) else min(count, UNALIGNED_CANDIDATES)


def ranked_configs(problem: Problem, device: Device = H200, limit: int | None = None) -> list[Estimate]:
    """Configs best first: the best of each (family, split or not) leads, then by time.

    Kept for the most recent problems: ``unimatmul tune`` ranks each problem twice, once
    handing its configs out to compile ahead, once when it is measured."""
    ordered = _ranked(problem, device)
    return list(ordered[:limit] if limit is not None else ordered)


@functools.lru_cache(maxsize=1024)
def _ranked(problem: Problem, device: Device) -> tuple[Estimate, ...]:
    estimates = sorted((estimate(problem, c, device) for c in space(problem)), key=lambda e: e.seconds)
    leaders: list[Estimate] = []
    seen: set[tuple[str, bool]] = set()
    for est in estimates:
        kind = (est.config.kernel, est.config.split_k > 1)
        if kind not in seen:
            seen.add(kind)
            leaders.append(est)
    best = estimates[0].seconds if estimates else 0.0
    # A family leader far behind the best is no use to measure.
    leaders = [e for e in leaders if e.seconds <= 2.0 * best]
    # Then spread over tile shapes: configs differing only in warps or stages come after
    # every distinct (kernel, block sizes, split) has had its best in.
    shapes = {_shape(e.config) for e in leaders}
    leading = {id(e) for e in leaders}
    distinct: list[Estimate] = []
    repeats: list[Estimate] = []
    for est in estimates:
        if id(est) in leading:
            continue
        if _shape(est.config) in shapes:
            repeats.append(est)
        else:
            shapes.add(_shape(est.config))
            distinct.append(est)
    return (*sorted(leaders, key=lambda e: e.seconds), *distinct, *repeats)


def _shape(config: KernelConfig) -> tuple[str, int, int, int, int]:
    return (config.kernel, config.block_m, config.block_n, config.block_k, config.split_k)


def describe(estimates: list[Estimate]) -> list[dict[str, Any]]:
    """Estimates as plain dicts (identity, modelled microseconds, terms) for reports."""
    return [
        {"identity": e.config.candidate.identity, "model_us": e.seconds * 1e6, **e.terms} for e in estimates
    ]
