"""The grouped kernel (``triton_grouped``): every form and edge offs against float64, in
Triton's interpreter on the CPU (or compiled, with a GPU); compiled for Hopper without one;
real tune mode through the harness's grouped check."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from test_triton_backend import compiled_in_a_fresh_process  # noqa: E402
from unimatmul_triton import TritonInterpreterBackend, make_backend  # noqa: E402
from unimatmul_triton.grouped import (  # noqa: E402
    CONFIGS,
    ROWS,
    TritonGroupedBackend,
    TritonGroupedInterpreterBackend,
    jit_signature,
    make_grouped_backend,
    offered,
    rows_slots,
    rows_warmup_args,
)
from unimatmul_triton.grouped_kernels import grouped_rows_kernel  # noqa: E402

from unimatmul import Problem, UnsupportedProblem  # noqa: E402
from unimatmul.backend import Device, Target, adapter_for_kind  # noqa: E402
from unimatmul.core.grouped import grouped_problem, grouped_problem_of  # noqa: E402

INTERPRET = os.environ.get("UNIMATMUL_TRITON_INTERPRET") == "1"
DEVICE = Device("cpu", 0) if INTERPRET else Device("cuda", 0)
TARGET = Target(adapter_for_kind("torch"), DEVICE)
TOL = {"bf16": 2e-2, "f16": 3e-3}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
gpu = pytest.mark.skipif(INTERPRET, reason="needs a GPU (the interpreter runs the other tests)")

# Group sizes: skewed with an empty group, one group holding all, odd starts, all empty.
SIZES = {"skewed": [13, 0, 7, 4], "one": [0, 24, 0, 0], "odd": [1, 3, 5, 15], "empty": [0, 0, 0, 0]}


@pytest.fixture(scope="module")
def backend() -> TritonGroupedBackend:
    found = make_grouped_backend(make_backend())
    if found.availability() is not None:
        pytest.skip(f"triton unavailable: {found.availability()}")
    return found


def _operands(
    jagged: str, sizes: list[int], dtype: str, m: int = 24, n: int = 48, k: int = 40
) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(len(sizes) + sum(sizes))
    dev = "cpu" if INTERPRET else "cuda"
    total = sum(sizes) or 24

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen).to(DTYPES[dtype]).to(dev)

    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32, device=dev)
    g = len(sizes)
    if jagged == "m":
        return rand(total, k), rand(g, n, k).transpose(-2, -1), offs
    if jagged == "k":
        return rand(total, m).t(), rand(total, n), offs
    if jagged == "n":
        return rand(g, m, k), rand(k, total), offs
    return rand(g, m, k), rand(g, k, n), None


def _reference(jagged: str, a: Any, b: Any, offs: Any) -> Any:
    a64, b64 = a.double().cpu(), b.double().cpu()
    if jagged == "none":
        return a64 @ b64
    ends = [int(v) for v in offs.tolist()]
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))
    if jagged == "k":
        return torch.stack([a64[:, s:e] @ b64[s:e] for s, e in bounds])
    shape = (a.shape[0], b.shape[-1]) if jagged == "m" else (a.shape[1], b.shape[1])
    out = torch.full(shape, float("nan"), dtype=torch.float64)
    for g, (s, e) in enumerate(bounds):
        if jagged == "m":
            out[s:e] = a64[s:e] @ b64[g]
        else:
            out[:, s:e] = a64[g] @ b64[:, s:e]
    return out


# bf16 on every edge; f16 on the skewed offs (the interpreter is slow: the plugin's whole
# suite runs in it).
EDGE_CASES = [
    (j, sizes, "bf16") for j in ("m", "k", "n", "none") for sizes in SIZES if j != "none" or sizes == "skewed"
]
EDGE_CASES += [(j, "skewed", "f16") for j in ("m", "k", "n", "none")]


@pytest.mark.parametrize(("jagged", "sizes", "dtype"), EDGE_CASES)
def test_every_form_and_edge_offs(backend: TritonGroupedBackend, jagged: str, sizes: str, dtype: str) -> None:
    a, b, offs = _operands(jagged, SIZES[sizes], dtype)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    want = _reference(jagged, a, b, offs)
    for candidate in backend.candidates(problem, TARGET):
        runner = backend.prepare(problem, candidate, TARGET)
        out = torch.full(want.shape, float("nan"), dtype=a.dtype, device=a.device)
        runner(a, b, out, 1.0, 0.0, None, offs)
        got = out.double().cpu()
        covered = ~torch.isnan(want)
        assert bool(torch.isfinite(got[covered]).all()), candidate.identity
        err = (got - want).abs()[covered]
        scale = want.abs()[covered].max().clamp(min=1.0) if covered.any() else 1.0
        assert bool((err <= TOL[dtype] * scale).all()), (candidate.identity, float(err.max()))
        if jagged == "m" and sizes != "empty":  # rows past offs[-1] are left alone
            assert bool(torch.isnan(got[~covered]).all())


def test_the_configs_follow_the_rows_per_group() -> None:
    decode = grouped_problem(64, 256, 2048, 1024)  # 4 rows per expert: 16-row tiles
    prefill = grouped_problem(8, 2048, 14336, 4096)  # 256 rows an expert
    assert all(c.form == ROWS and c.block_m == 16 for c in offered(decode))
    assert offered(prefill) and all(c.form == ROWS and c.block_m >= 64 for c in offered(prefill))
    assert offered(grouped_problem(8, 8192, 14336, 4096)) == []  # past ROWS_MAX_PER_GROUP
    assert all(c.candidate in CONFIGS for c in offered(decode) + offered(prefill))
    # The other forms keep the persistent kernel (the rows kernel cuts a's rows only).
    weight_grad = grouped_problem(64, 2048, 1024, 256, jagged="k")
    assert offered(weight_grad) and all(c.form != ROWS for c in offered(weight_grad))


def test_the_rows_kernel_is_refused_for_the_other_forms(backend: TritonGroupedBackend) -> None:
    a, b, offs = _operands("k", SIZES["skewed"], "bf16")
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    rows = next(c for c in CONFIGS.values() if c.form == ROWS).candidate
    assert not backend.check(problem, rows, TARGET)
    with pytest.raises(UnsupportedProblem, match="m form"):
        backend.prepare(problem, rows, TARGET)


@pytest.mark.parametrize("block_m", [16, 64, 128])
def test_rows_slots_bound_the_tiles_of_any_offs(block_m: int) -> None:
    rng = np.random.default_rng(block_m)
    for _ in range(300):
        groups = int(rng.integers(1, 300))
        m = int(rng.integers(1, 5000))
        sizes = rng.multinomial(m, rng.dirichlet(np.full(groups, float(rng.choice([0.05, 1.0, 20.0])))))
        tiles = int(sum(-(-int(r) // block_m) for r in sizes))
        assert tiles <= rows_slots(m, groups, block_m) <= m


def test_many_experts_with_a_few_rows_each(backend: TritonGroupedBackend) -> None:
    """Decode through 128 experts: most empty, a few holding 1-3 rows, one past 16."""
    sizes = [0] * 128
    for g, rows in ((3, 1), (17, 2), (64, 3), (100, 1), (127, 19)):
        sizes[g] = rows
    a, b, offs = _operands("m", sizes, "bf16", n=32, k=32)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    want = _reference("m", a, b, offs)
    for candidate in backend.candidates(problem, TARGET):
        out = torch.full(want.shape, float("nan"), dtype=a.dtype, device=a.device)
        backend.prepare(problem, candidate, TARGET)(a, b, out, 1.0, 0.0, None, offs)
        err = (out.double().cpu() - want).abs()
        assert bool(torch.isfinite(out).all()), candidate.identity
        assert float(err.max()) <= TOL["bf16"] * float(want.abs().max()), candidate.identity


def test_what_it_cannot_run_is_refused(backend: TritonGroupedBackend) -> None:
    with pytest.raises(UnsupportedProblem, match="grouped"):
        backend.candidates(Problem.from_shape(16, 16, 16, "bf16"), TARGET)
    with pytest.raises(UnsupportedProblem, match="bf16 or f16"):
        backend.candidates(grouped_problem(4, 16, 16, 16, "f32"), TARGET)
    assert backend.ops == frozenset({"grouped_gemm"})


def test_the_plugin_hook_registers_it_beside_the_dense_backend() -> None:
    from unimatmul_triton import TritonBackend, unimatmul_register_backends

    found: list[Any] = []
    unimatmul_register_backends(found.append)
    assert [b.name for b in found] == ["triton", "triton_grouped"]
    dense, grouped = found
    assert isinstance(dense, TritonBackend) and isinstance(grouped, TritonGroupedBackend)
    assert isinstance(grouped, TritonGroupedInterpreterBackend) == isinstance(dense, TritonInterpreterBackend)


def test_compiles_for_hopper_without_a_gpu() -> None:
    """Every config of every form compiles for sm_90 (Triton ships ptxas), in a fresh
    process without the interpreter."""
    script = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from unimatmul_triton.grouped import CONFIGS, ROWS, _FORM
from unimatmul_triton.grouped_kernels import grouped_kernel, grouped_rows_kernel
ints = ("G", "M", "N", "K", "stride_ag", "stride_am", "stride_ak", "stride_bg", "stride_bk", "stride_bn",
        "stride_cg", "stride_cm", "stride_cn", "PROGRAMS")
rows_ints = ("G", "M", "N", "K", "stride_am", "stride_ak", "stride_bg", "stride_bk", "stride_bn",
             "stride_cm", "stride_cn", "SLOTS")
out = []
for config in CONFIGS.values():
    if config.form == ROWS:
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i32", **dict.fromkeys(rows_ints, "i32")}
        consts = {"G_POW2": 256, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k}
        sig.update(dict.fromkeys(consts, "constexpr"))
        ck = triton.compile(ASTSource(grouped_rows_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": config.warps, "num_stages": config.stages})
        out.append([ck.metadata.global_scratch_size, ck.metadata.shared])
        continue
    for form in _FORM.values():
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i32", **dict.fromkeys(ints, "i32")}
        consts = {"JAGGED": form, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k}
        sig.update(dict.fromkeys(consts, "constexpr"))
        ck = triton.compile(ASTSource(grouped_kernel, sig, consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": config.warps, "num_stages": config.stages})
        out.append([ck.metadata.global_scratch_size, ck.metadata.shared])
print(json.dumps(out))
"""
    results = compiled_in_a_fresh_process(script)
    rows = sum(1 for c in CONFIGS.values() if c.form == ROWS)
    assert len(results) == (len(CONFIGS) - rows) * 4 + rows
    for scratch, shared in results:
        assert scratch == 0 and shared < 227 * 1024


def test_the_native_launch_s_parameters_are_the_compiled_kernel_s() -> None:
    """``launch_params`` (what ``GroupedRunner.native_call`` lays out for a native caller)
    lists the parameters of the kernel compiled for those arguments, sizes in order: checked
    against the PTX of the rows kernel (a decode call of one row: M and SLOTS stay
    parameters of 1, unit strides are compiled in) and of the persistent kernel's k form,
    compiled for sm_90 in a fresh process without the interpreter (the two hidden scratch
    pointers last)."""
    script = r"""
import json, re
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from unimatmul_triton.grouped import g_pow2, jit_signature, launch_params, rows_slots
from unimatmul_triton.grouped_kernels import grouped_kernel, grouped_rows_kernel
bf16, i32 = torch.bfloat16, torch.int32
g, n, k = 8, 512, 256
rows = (bf16, bf16, bf16, i32, g, 1, n, k, k, 1, n * k, 1, k, n, 1, rows_slots(1, g, 16))
# the k form: a (64 x 192) as a transposed view, b (192 x 128), out (g, 64, 128), 132 programs
persistent = (bf16, bf16, bf16, i32, g, 64, 128, 192, 0, 1, 64, 0, 128, 1, 64 * 128, 128, 1, 132)
out = []
for kernel, warm, consts in ((grouped_rows_kernel, rows, {"G_POW2": g_pow2(g)}),
                             (grouped_kernel, persistent, {"JAGGED": 1})):
    consts = {**consts, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}
    params = launch_params(kernel, warm, ("a", "b", "out", "offs"))
    signature = jit_signature(kernel, warm)
    names = list(signature)
    compiled_in = {names[i]: warm[i] for i, t in enumerate(signature.values()) if t == "constexpr" and i < len(warm)}
    sig = {name: ("constexpr" if t == "constexpr" else t) for name, t in signature.items()}
    ck = triton.compile(ASTSource(kernel, sig, {**compiled_in, **consts}), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "num_stages": 2})
    entry = ck.asm["ptx"].split(".entry", 1)[1].split(")", 1)[0]
    ptx = [8 if t == "u64" else 4 for t in re.findall(r"\.param \.(u64|u32|b64|b32)", entry)]
    out.append([[p["size"] for p in params], [p["role"] for p in params], ptx, sorted(compiled_in)])
print(json.dumps(out))
"""
    (rows, rows_roles, rows_ptx, rows_in), (pers, pers_roles, pers_ptx, _) = compiled_in_a_fresh_process(
        script
    )
    assert [*rows, 8, 8] == rows_ptx, (rows, rows_ptx)
    assert [*pers, 8, 8] == pers_ptx, (pers, pers_ptx)
    assert rows_roles[:4] == pers_roles[:4] == ["a", "b", "out", "offs"]
    assert set(rows_roles[4:]) == set(pers_roles[4:]) == {"constant"}
    assert rows_in == ["stride_ak", "stride_bk", "stride_cn"]  # M and SLOTS of 1 stay parameters


@pytest.mark.skipif(not INTERPRET, reason="the CPU's tune mode (a GPU has the GPU tests)")
def test_real_tune_mode_checks_the_grouped_candidates(tmp_path: Any) -> None:
    """``grouped_matmul`` in tune mode: every triton_grouped candidate is measured by the
    harness and checked, on every distribution of offs, against the float64 reference."""
    import unimatmul
    from unimatmul.cache.record import OK, PRUNED
    from unimatmul.testing import isolated_selector, registered

    a, b, offs = _operands("m", SIZES["skewed"], "bf16")
    with isolated_selector(tmp_path / "cache.msgpack") as selector:
        dense = TritonInterpreterBackend()
        grouped = TritonGroupedInterpreterBackend(dense)
        with registered(selector.plugins, grouped, name="grouped-test"), unimatmul.mode("tune"):
            out = unimatmul.grouped_matmul(a, b, offs)
        (record,) = [r for _, _, r in selector.store.items(None)]
    want = _reference("m", a, b, offs)
    assert float((out.double() - want).abs().max()) <= TOL["bf16"] * float(want.abs().max())
    found = {r.identity: r for r in record.results if r.identity.startswith("triton_grouped/")}
    assert len(found) == 2
    for result in found.values():
        assert result.status in (OK, PRUNED), result
        assert result.error is not None and result.error < TOL["bf16"]


@gpu
def test_on_the_gpu_every_candidate_matches_torch_grouped_mm(backend: TritonGroupedBackend) -> None:
    a, b, offs = _operands("m", [300, 0, 700, 24], "bf16", n=512, k=256)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    want = torch._grouped_mm(a, b, offs)
    for candidate in backend.candidates(problem, TARGET):
        out = torch.empty_like(want)
        backend.prepare(problem, candidate, TARGET)(a, b, out, 1.0, 0.0, None, offs)
        torch.cuda.synchronize()
        assert float((out.float() - want.float()).abs().max()) <= 2e-2 * float(want.float().abs().max())


@gpu
def test_on_the_gpu_the_rows_kernels_launcher_built_ahead_is_the_one_it_needs(
    backend: TritonGroupedBackend,
) -> None:
    """Each rows config compiled ahead finds its launcher built from the signature guessed
    before the compile (the JIT's own types), not built again after it."""
    a, b, offs = _operands("m", [5, 0, 9, 2], "bf16", n=384, k=192)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    rows = [c for c in offered(problem) if c.form == ROWS]
    assert rows
    for config in rows:
        compiled = backend._warm_up(problem, config, TARGET).result()
        guessed = jit_signature(grouped_rows_kernel, rows_warmup_args(problem, config))
        assert guessed == compiled.src.signature


@gpu
def test_on_the_gpu_the_rows_kernel_launches_directly_after_its_first_call(
    backend: TritonGroupedBackend,
) -> None:
    """The first call goes through Triton's JIT, the later ones launch the compiled kernel
    directly (token counts change, the kernel does not), eagerly and in a CUDA graph; an
    unaligned ``offs`` goes back to the JIT."""
    sizes = [0] * 64
    for g, rows in ((1, 3), (9, 1), (40, 7), (63, 2)):
        sizes[g] = rows
    a, b, offs = _operands("m", sizes, "bf16", n=256, k=128)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    config = next(c for c in offered(problem) if c.form == ROWS)
    runner = backend.prepare(problem, config.candidate, TARGET)
    for round_ in range(3):
        want = torch._grouped_mm(a, b, offs).float()
        out = torch.full(want.shape, float("nan"), dtype=a.dtype, device=a.device)
        runner(a, b, out, 1.0, 0.0, None, offs)
        torch.cuda.synchronize()
        assert runner._fast is not None, round_
        assert float((out.float() - want).abs().max()) <= 2e-2 * float(want.abs().max()), round_
        a = torch.randn_like(a)  # new values, the same shape
    # Fewer rows (another token count of the bucket), captured in a graph.
    a2, offs2 = a[:9].clone(), torch.tensor([0, 4, 4, 9] + [9] * 60, dtype=torch.int32, device=a.device)
    out2 = torch.full((9, 256), float("nan"), dtype=a.dtype, device=a.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner(a2, b, out2, 1.0, 0.0, None, offs2)
    a2.copy_(torch.randn_like(a2))
    graph.replay()
    torch.cuda.synchronize()
    want2 = torch._grouped_mm(a2, b, offs2).float()
    assert float((out2.float() - want2).abs().max()) <= 2e-2 * float(want2.abs().max())
    # An offs four bytes off 16-byte alignment: Triton's JIT again (its own specialisation).
    base = torch.zeros(65, dtype=torch.int32, device=a.device)
    base[1:] = offs
    shifted = base[1:]
    out3 = torch.full((a.shape[0], 256), float("nan"), dtype=a.dtype, device=a.device)
    runner(a, b, out3, 1.0, 0.0, None, shifted)
    want3 = torch._grouped_mm(a, b, offs).float()
    assert float((out3.float() - want3).abs().max()) <= 2e-2 * float(want3.abs().max())


@gpu
def test_on_the_gpu_the_rows_configs_compile_ahead_and_the_first_call_finds_them(
    backend: TritonGroupedBackend,
) -> None:
    """``candidates()`` compiles each offered rows config in the compile pool, with the
    specialisation of the door's calls: the first call of every runner compiles nothing
    more (Triton's JIT cache of the kernel does not grow), and its result is right."""
    from unimatmul_triton.grouped_kernels import grouped_rows_kernel

    # An expert shape no other test uses (its own specialisation), 12 groups.
    sizes = [5, 0, 17, 3, 0, 40, 1, 9, 0, 2, 11, 8]
    a, b, offs = _operands("m", sizes, "bf16", m=sum(sizes), n=336, k=208)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    compiler = backend._dense.compiler  # type: ignore[attr-defined]
    before = compiler.compiles
    candidates = backend.candidates(problem, TARGET)
    rows = [c for c in candidates if CONFIGS[c].form == ROWS]
    assert rows and compiler.compiles - before == len(rows)
    cache = grouped_rows_kernel.device_caches[0][0]
    want = torch._grouped_mm(a, b, offs).float()
    for candidate in rows:
        runner = backend.prepare(problem, candidate, TARGET)  # waits for its warm-up
        compiled = len(cache)
        out = torch.full(want.shape, float("nan"), dtype=a.dtype, device=a.device)
        runner(a, b, out, 1.0, 0.0, None, offs)
        torch.cuda.synchronize()
        assert len(cache) == compiled, f"{candidate.identity} compiled again at its first call"
        assert float((out.float() - want).abs().max()) <= 2e-2 * float(want.abs().max())
    # Listing the candidates again compiles nothing.
    backend.candidates(problem, TARGET)
    assert compiler.compiles - before == len(rows)


@gpu
def test_on_the_gpu_a_runner_describes_its_launch_for_a_native_caller(
    backend: TritonGroupedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``native_call(a, b, offs, out_dtype)``: the a, b, out and offs pointers per call, each
    other argument the compiled kernel takes as a constant, the two hidden scratch pointers,
    the grid that bounds any offs's tiles; None for an offs off 16-byte alignment (the kernel
    it names is compiled for aligned pointers). (Launched by torch routing's native table:
    tests/torch/test_grouped_routing_gpu.py.)"""
    from unimatmul.backend import NativeCall

    roles = NativeCall.LAUNCH_ROLES
    sizes = [5, 0, 9, 2]
    a, b, offs = _operands("m", sizes, "bf16", n=384, k=192)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    for config in (c for c in offered(problem) if c.form == ROWS):
        runner = backend.prepare(problem, config.candidate, TARGET)
        monkeypatch.delenv("UNIMATMUL_TRITON_GROUPED_NATIVE", raising=False)
        assert runner.native_call(a, b, offs, a.dtype) is None  # off by default
        monkeypatch.setenv("UNIMATMUL_TRITON_GROUPED_NATIVE", "1")
        call = runner.native_call(a, b, offs, a.dtype)
        assert call is not None and call.kind == "launch"
        words = call.words
        # The function the JIT launches for these operands (its direct path, after a call).
        runner(a, b, torch.empty(a.shape[0], 384, dtype=a.dtype, device=a.device), 1.0, 0.0, None, offs)
        assert runner._fast is not None and int(runner._fast[2]) == words[3]
        cache = grouped_rows_kernel.device_caches[0][0]
        compiled = next(c for c in cache.values() if int(c.function) == words[3])
        passed = [t for t in compiled.src.signature.values() if t != "constexpr"]
        assert words[11] == len(passed) + 2  # the kernel's parameters and the two scratch pointers
        params = [tuple(words[12 + 3 * i : 15 + 3 * i]) for i in range(words[11])]
        assert [p[0] for p in params[:4]] == [roles["a"], roles["b"], roles["out"], roles["offs"]]
        assert all(p[0] == 0 for p in params[4:])
        slots = rows_slots(a.shape[0], 4, config.block_m)
        assert tuple(words[4:7]) == (slots * -(-384 // config.block_n), 1, 1)
        assert words[7] == 32 * config.warps
    base = torch.zeros(5, dtype=torch.int32, device=a.device)
    base[1:] = offs
    assert runner.native_call(a, b, base[1:], a.dtype) is None
