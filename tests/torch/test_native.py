"""The native routing kernels on the CPU: the table, its kinds, and the way back to Python.

The native kernels are built for real here (CI has the compiler and ninja); the tests
read the table's own counters, so that a call served without Python is told apart from
one that went through the Python kernel.
"""

from __future__ import annotations

import gc
import threading
import warnings
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import Env, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.calls import new_id  # noqa: E402
from unimatmul.torch import native, routing  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402

NATIVE = pytest.mark.parametrize("env", ["native"], indirect=True)


def _only_plan(op: str) -> routing.Plan:
    found = [p for p in routing.TABLE.plans.values() if p.op == op]
    assert len(found) == 1, found
    return found[0]


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).to(a.dtype)


@NATIVE
def test_native_kernels_serve_the_cpu_key(env: Env) -> None:
    ut.enable()
    assert routing._router.native_keys == (("CPU", "CUDA") if torch.cuda.is_available() else ("CPU",))
    assert torch.ops.unimatmul_native.installed()


@NATIVE
def test_a_known_key_is_served_without_python(env: Env) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with ut.enabled():
        outs = [torch.mm(a, b) for _ in range(5)]
        plan = _only_plan("mm")
        assert plan.native == native.DEFAULT
        # The first call went through Python (which put the entry); the native table
        # counted the other four.
        assert native.counts() == {plan.ident: 4}
        assert ut.stats()["routed"] == 5
    for out in outs:
        torch.testing.assert_close(out, _ref(a, b), rtol=1e-5, atol=1e-5)


@NATIVE
def test_each_layout_and_form_is_its_own_entry(env: Env) -> None:
    a = torch.randn(12, 20)
    w = torch.randn(24, 20)
    bias = torch.randn(24)
    c = torch.randn(12, 24)
    with ut.enabled():
        for _ in range(2):
            outs = {
                "plain": torch.mm(a, w.t().contiguous()),
                "transposed": torch.mm(a, w.t()),
                "bias": torch.addmm(bias, a, w.t()),
                "c": torch.addmm(c, a, w.t(), beta=0.5, alpha=2.0),
                "batched": torch.bmm(a[None].expand(3, -1, -1), w.t()[None].expand(3, -1, -1)),
            }
        assert native.size() == 5
    ref = _ref(a, w.t())
    torch.testing.assert_close(outs["plain"], ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs["transposed"], ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs["bias"], ref + bias, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs["c"], 0.5 * c + 2.0 * ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs["batched"], ref[None].expand(3, -1, -1), rtol=1e-4, atol=1e-4)


@NATIVE
def test_a_mode_block_sends_every_call_to_python(env: Env) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with ut.enabled():
        torch.mm(a, b)
        plan = _only_plan("mm")
        with unimatmul.mode("off"):
            for _ in range(3):
                torch.mm(a, b)
        assert native.counts() == {}  # nothing counted natively while the block was open
        torch.mm(a, b)
        assert native.counts() == {plan.ident: 1}  # and served natively again after it
        assert ut.stats()["routed"] == 2  # the three calls in mode off were not routed


@NATIVE
@pytest.mark.parametrize("alpha", [1.0, 2.5])
def test_a_onednn_kernel_runs_from_cpp(env: Env, alpha: float) -> None:
    """A tuned oneDNN choice is executed by the native kernel (its own primitive), bias
    and runtime alpha included, and counted there."""
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    x = torch.randn(16, 48)
    weight, bias = torch.randn(40, 48), torch.randn(40)

    def run() -> torch.Tensor:
        return torch.addmm(bias, x, weight.t(), alpha=alpha)

    ref = (x.double() @ weight.double().t() * alpha + bias.double()).float()
    with ut.enabled(), collecting() as met, torch.no_grad():
        run()
    tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    with ut.enabled(), torch.no_grad():
        outs = [run() for _ in range(3)]
        plan = _only_plan("addmm")
        assert plan.runner is not None and plan.runner.candidate.backend == "onednn"
        assert plan.native == native.ONEDNN
        assert native.counts() == {plan.ident: 2}  # the first call went through Python
        assert ut.stats()["kernel"] == 3
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@NATIVE
def test_a_kept_tie_is_served_from_cpp_and_marked_a_tie(env: Env) -> None:
    """A Default record's tie that its window kept (a oneDNN kernel level with Default):
    the plan holds a TieRunner, the native entry makes the kernel's call and is marked a
    tie (on a GPU such an entry runs PyTorch's kernel under graph capture)."""
    from dataclasses import replace

    from unimatmul.backend import DEFAULT
    from unimatmul.cache.record import OK
    from unimatmul.tuning import confirm

    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    x, weight = torch.randn(16, 48), torch.randn(40, 48)
    ref = (x.double() @ weight.double().t()).float()
    with ut.enabled(), collecting() as met, torch.no_grad():
        torch.mm(x, weight.t())
    ((problem, target),) = list({(p.key, t): (p, t) for p, t in met}.values())
    tune_preferring_kernels(env.selector, [(problem, target)])
    namespace = env.selector.platform(target).namespace
    record = env.selector.store.get(namespace, problem.key)
    assert record.winner.startswith("onednn/")
    (measured,) = [r for r in record.results if r.identity == record.winner]
    kept = {"verdict": confirm.CONFIRMED, "kernel": record.winner, "kernel_s": 1e-6, "default_s": 2e-6}
    tie = replace(
        record,
        winner=DEFAULT.identity,
        default_s=record.winner_s,
        results=[replace(measured, status=OK)],
        settings={confirm.KEY: kept},
    )
    env.selector.store.put(namespace, problem.key, tie)
    ut.clear_plans()
    with ut.enabled(), torch.no_grad():
        outs = [torch.mm(x, weight.t()) for _ in range(3)]
        plan = _only_plan("mm")
        assert isinstance(plan.runner, confirm.TieRunner) and plan.source == "confirmed"
        assert plan.native == native.ONEDNN
        assert native.counts() == {plan.ident: 2}  # the first call went through Python
        entry = native.entry_for(plan.runner)
        assert entry.tie and entry.kernel is plan.runner.kernel and entry.kind == native.ONEDNN
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@NATIVE
def test_the_profiler_names_a_native_call(env: Env) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with ut.enabled():
        torch.mm(a, b)  # the entry is made outside the profiler
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                torch.mm(a, b)
    names = {e.key for e in prof.key_averages()}
    assert "unimatmul::mm [default]" in names, sorted(names)


@NATIVE
def test_errors_are_pytorch_s_own(env: Env) -> None:
    with ut.enabled():
        with pytest.raises(RuntimeError, match="cannot be multiplied"):
            torch.mm(torch.randn(3, 4), torch.randn(5, 6))
        with pytest.raises(RuntimeError):
            torch.bmm(torch.randn(3, 4), torch.randn(4, 6))


@NATIVE
def test_threads_share_the_table(env: Env) -> None:
    shapes = [(8 + i, 16, 4 + i) for i in range(6)]
    operands = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    refs = [_ref(a, b) for a, b in operands]  # before routing: references are products too
    errors: list[str] = []

    def work() -> None:
        for _ in range(50):
            for (a, b), ref in zip(operands, refs, strict=True):
                out = torch.mm(a, b)
                if not torch.allclose(out, ref, rtol=1e-4, atol=1e-4):
                    errors.append(f"{tuple(a.shape)} x {tuple(b.shape)}")

    with ut.enabled():
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Every call counted once, also when threads met a new key at the same time.
        assert ut.stats()["routed"] == 4 * 50 * len(shapes)
        assert native.size() == len(shapes)
    assert not errors


@NATIVE
def test_clearing_moves_native_counts_to_the_stats(env: Env) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with ut.enabled():
        for _ in range(4):
            torch.mm(a, b)
        ut.clear_plans()
        assert native.size() == 0
        torch.mm(a, b)
        assert ut.stats()["routed"] == 5


@NATIVE
def test_an_emptied_table_keeps_its_kernels_one_generation(env: Env) -> None:
    """The kernel a native entry runs lives on for one emptying of the table (a call in
    flight on another thread may still hold its entry), and is freed at the next; nothing
    ran under CUDA graph capture here, so nothing is kept for graphs."""
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    x, weight = torch.randn(16, 48), torch.randn(40, 48)
    with ut.enabled(), collecting() as met, torch.no_grad():
        torch.mm(x, weight.t())
    tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    held = ut.stats()["held_for_graphs"]
    with ut.enabled(), torch.no_grad():
        torch.mm(x, weight.t())
        plan = _only_plan("mm")
        assert plan.native == native.ONEDNN
        kernel = weakref.ref(routing._router.kept.now[plan.ident])
        del plan
        ut.clear_plans()
        gc.collect()
        assert kernel() is not None  # one generation more
        ut.clear_plans()
        gc.collect()
        assert kernel() is None
    assert torch.ops.unimatmul_native.pinned() == []
    assert ut.stats()["held_for_graphs"] == held


@pytest.mark.parametrize("env", ["python"], indirect=True)
def test_a_failed_build_falls_back_to_the_python_kernels(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV, "auto")
    monkeypatch.setattr(native, "load", lambda cuda, **_: False)
    monkeypatch.setitem(native._failures, False, "OSError: no compiler (test)")
    monkeypatch.setitem(native._failures, True, "OSError: no compiler (test)")  # the GPU build, on a GPU
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    ref = _ref(a, b)
    with pytest.warns(RuntimeWarning, match="native routing kernels did not build"):
        ut.enable()
    assert routing._router.native_keys == ()
    torch.testing.assert_close(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
    assert ut.stats()["routed"] == 1


def test_the_choice_of_keys() -> None:
    import os

    old = os.environ.get(native.ENV)
    try:
        for text, gpu, keys in (
            ("auto", True, ("CPU", "CUDA")),
            ("auto", False, ("CPU",)),
            ("", True, ("CPU", "CUDA")),
            ("cuda", True, ("CUDA",)),
            ("cuda", False, ()),
            ("0", True, ()),
            ("off", True, ()),
        ):
            os.environ[native.ENV] = text
            assert native.wanted_keys(gpu) == keys
        os.environ[native.ENV] = "sometimes"
        with pytest.raises(ValueError, match=native.ENV):
            native.wanted_keys(True)
    finally:
        if old is None:
            os.environ.pop(native.ENV, None)
        else:
            os.environ[native.ENV] = old


def test_a_runner_s_native_call_picks_the_entry_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.backend import NativeCall

    lt = NativeCall("lt", [1] * 13)
    padded = NativeCall("lt", [1] * 13, (None,) * 6, (0, 0))
    scaled = NativeCall("scaled_lt", [1] * 16)
    onednn = NativeCall("onednn", [1] * 12)
    calls = (lt, padded, scaled, onednn, None)
    monkeypatch.setattr(native, "_loaded_gpu", True)
    assert [native.kind_of(c) for c in calls] == [
        native.LT,
        native.PADDED,
        native.SCALED_LT,
        native.ONEDNN,
        native.PYTHON,
    ]
    monkeypatch.setattr(native, "_loaded_gpu", False)  # the CPU build makes no Lt call
    assert [native.kind_of(c) for c in calls] == [native.PYTHON] * 3 + [native.ONEDNN, native.PYTHON]


def _launch_words(*roles: int) -> list[int]:
    """A NativeCall "launch"'s words: the 12 fixed ones, then a pointer per role (0: a constant)."""
    return [1, 2, 3, 4, 8, 1, 1, 128, 0, 0, 0, len(roles), *(w for r in roles for w in (r, 8, 0))]


def test_a_scaled_launch_is_a_launch_entry_of_the_scaled_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch whose parameters include both scale pointers (a Triton fp8 kernel's) is a
    LAUNCH entry of the SCALED table where the build makes launches, and PYTHON otherwise;
    a table that cannot make the call (a plain launch or Lt call in the SCALED table, a
    scaled one elsewhere) gets PYTHON."""
    from unimatmul.backend import NativeCall

    roles = NativeCall.LAUNCH_ROLES
    scaled = NativeCall("launch", _launch_words(1, 2, 3, 5, 6, roles["scale_a"], roles["scale_b"], 0))
    plain = NativeCall("launch", _launch_words(1, 2, 3, 5, 6, 0))
    half = NativeCall("launch", _launch_words(1, 2, 3, 5, 6, roles["scale_a"]))
    scaled_lt = NativeCall("scaled_lt", [1] * 16)
    lt = NativeCall("lt", [1] * 13)
    monkeypatch.setattr(native, "_loaded_gpu", True)
    assert native.kind_of(scaled, native.SCALED) == native.LAUNCH
    assert native.kind_of(scaled_lt, native.SCALED) == native.SCALED_LT
    assert [native.kind_of(c, native.SCALED) for c in (plain, half, lt, None)] == [native.PYTHON] * 4
    assert [native.kind_of(scaled, t) for t in (native.ROUTING, native.API)] == [native.PYTHON] * 2
    assert native.kind_of(plain, native.ROUTING) == native.LAUNCH
    assert native.kind_of(scaled_lt, native.ROUTING) == native.PYTHON
    monkeypatch.setattr(native, "_loaded_gpu", False)  # the CPU build makes no launch
    assert native.kind_of(scaled, native.SCALED) == native.PYTHON
    assert native.kind_of(scaled_lt, native.SCALED) == native.PYTHON


def test_a_grouped_launch_is_a_launch_entry_of_the_grouped_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch with the offs pointer (a Triton grouped kernel's, m, k or n form) is a LAUNCH
    entry of the GROUPED table only; there a launch without it (the 3-D x 3-D form) is one
    too, and an Lt call is not."""
    from unimatmul.backend import NativeCall

    offs = NativeCall.LAUNCH_ROLES["offs"]
    grouped = NativeCall("launch", _launch_words(1, 2, 3, offs, 0, 0))
    batched = NativeCall("launch", _launch_words(1, 2, 3, 0, 0, 0))
    lt = NativeCall("lt", [1] * 13)
    monkeypatch.setattr(native, "_loaded_gpu", True)
    assert [native.kind_of(c, native.GROUPED) for c in (grouped, batched)] == [native.LAUNCH] * 2
    assert [native.kind_of(c, native.GROUPED) for c in (lt, None)] == [native.PYTHON] * 2
    assert [native.kind_of(grouped, t) for t in (native.ROUTING, native.API, native.SCALED)] == [
        native.PYTHON
    ] * 3
    monkeypatch.setattr(native, "_loaded_gpu", False)  # the CPU build makes no launch
    assert native.kind_of(grouped, native.GROUPED) == native.PYTHON


class _LaunchOffered:
    """A prepared kernel that offers a NativeCall (and is never called here)."""

    def __init__(self, call: Any) -> None:
        self.call = call

    def native_call(self) -> Any:
        return self.call


def test_the_entry_of_a_scaled_launch_goes_by_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.backend import NativeCall

    roles = NativeCall.LAUNCH_ROLES
    call = NativeCall("launch", _launch_words(1, 2, 3, roles["scale_a"], roles["scale_b"]))
    runner = _LaunchOffered(call)
    monkeypatch.setattr(native, "_loaded_gpu", True)
    entry = native.entry_for(runner, table=native.SCALED)
    assert (entry.kind, entry.call, entry.kernel) == (native.LAUNCH, call, runner)
    assert native.entry_for(runner, table=native.ROUTING).kind == native.PYTHON
    monkeypatch.setattr(native, "_loaded_gpu", False)
    assert native.entry_for(runner, table=native.SCALED).kind == native.PYTHON


@NATIVE
def test_the_cpu_build_takes_no_scaled_lt_entry(env: Env) -> None:
    from unimatmul.backend import NativeCall

    if native.has_lt():
        pytest.skip("the GPU build is loaded")
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    # Scale attributes and C-is-D, then an Lt call's 12 words and one word of algo.
    call = NativeCall("scaled_lt", [17, 18, 0, 0x7000, 0x7100, 1, 1, 1, 1, 1, 1, 1, 0, 0, 4, 0])
    with pytest.raises(RuntimeError, match="needs the GPU build"):
        native.put_scaled(
            a, a.t(), one, one, None, torch.bfloat16, False, native.SCALED_LT, new_id(), "x", (16, 16), call
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="unknown kind"):
        native.put_scaled(a, a.t(), one, one, None, torch.bfloat16, False, native.LT, new_id(), "x", (16, 16))
    roles = NativeCall.LAUNCH_ROLES
    launch = NativeCall("launch", _launch_words(1, 2, 3, 5, 6, roles["scale_a"], roles["scale_b"]))
    with pytest.raises(RuntimeError, match="LAUNCH entry needs the GPU build"):
        native.put_scaled(
            a, a.t(), one, one, None, torch.bfloat16, False, native.LAUNCH, new_id(), "x", (16, 16), launch
        )  # fmt: skip
    assert native.size(native.SCALED) == 0


@NATIVE
def test_the_cpu_build_takes_no_grouped_launch_entry(env: Env) -> None:
    from unimatmul.backend import NativeCall

    if native.has_lt():
        pytest.skip("the GPU build is loaded")
    a, b = torch.ones(8, 16), torch.ones(2, 16, 4)
    offs = torch.tensor([3, 8], dtype=torch.int32)
    launch = NativeCall("launch", _launch_words(1, 2, 3, NativeCall.LAUNCH_ROLES["offs"]))
    ops = torch.ops.unimatmul_native
    with pytest.raises(RuntimeError, match="LAUNCH entry needs the GPU build"):
        ops.put_grouped(-1, a, b, offs, None, native.LAUNCH, new_id(), "x", [8, 4], launch.words, 0)
    with pytest.raises(RuntimeError, match="unknown kind"):
        ops.put_grouped(-1, a, b, offs, None, native.LT, new_id(), "x", [8, 4], [], 0)
    assert native.size(native.GROUPED) == 0


@pytest.mark.slow
def test_build_native_command_says_it_builds_once(tmp_path: Any) -> None:
    """A real build in an empty extension folder says on stderr what it does (it takes
    10-40 s); the next process loads that build and says nothing."""
    import os
    import subprocess
    import sys

    environment = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}

    def build() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "unimatmul.torch", "--build-native"],
            capture_output=True,
            text=True,
            timeout=600,
            env=environment,
        )

    first = build()
    assert first.returncode == 0, first.stderr[-2000:]
    assert "native routing kernels built for the" in first.stdout
    (line,) = [text for text in first.stderr.splitlines() if "building the native routing kernels" in text]
    assert "once per PyTorch version" in line
    again = build()
    assert again.returncode == 0, again.stderr[-2000:]
    assert "building" not in again.stderr


@NATIVE
def test_a_launch_entry_is_checked_where_it_is_put(env: Env) -> None:
    """A NativeCall "launch" becomes a LAUNCH entry only in the GPU build, for GPU tensors,
    with words that hold together; anything else is refused when put, never at a call."""
    from unimatmul.backend import NativeCall

    ut.enable()
    words = [1, 2, 3, 4, 8, 1, 1, 128, 0, 0, 0, 3, 1, 8, 0, 2, 8, 0, 3, 8, 0]
    call = NativeCall("launch", words)
    assert native.kind_of(call) == (native.LAUNCH if native.has_lt() else native.PYTHON)
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with pytest.raises(RuntimeError, match=r"LAUNCH entry (needs the GPU build|is for GPU tensors)"):
        native.put("mm", a, b, None, 0, native.LAUNCH, new_id(), "x", (4, 2), 0, call)
    if torch.cuda.is_available():
        a, b = a.cuda(), b.cuda()
        for bad, why in (
            (words[:-1], "LAUNCH data of 20 words for 3 parameters"),
            ([*words[:12], 9, 8, 0, *words[15:]], "parameter role 9"),
            ([*words[:12], 1, 4, 0, *words[15:]], "pointer of 4 bytes"),
            ([*words[:15], 1, 8, 0, *words[18:]], "role 1 twice"),
            ([*words[:12], 0, 8, 0, *words[15:]], "without its a, b and out"),
            (_launch_words(1, 2, 3, 7, 8), "scale parameters in a LAUNCH entry outside"),
            ([*words[:12], 7, 4, 0, *words[15:]], "pointer of 4 bytes"),
        ):
            with pytest.raises(RuntimeError, match=why):
                native.put(
                    "mm",
                    a,
                    b,
                    None,
                    0,
                    native.LAUNCH,
                    new_id(),
                    "x",
                    (4, 2),
                    0,
                    NativeCall("launch", bad),
                )
        # The SCALED table's launch takes both scale pointers (7, 8), and only there.
        fp8 = torch.ones(16, 16, device="cuda").to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        for roles, why in (
            ((1, 2, 3), "without its scale_a and scale_b"),
            ((1, 2, 3, 7), "without its scale_a and scale_b"),
            ((1, 2, 3, 7, 8, 8), "role 8 twice"),
        ):
            with pytest.raises(RuntimeError, match=why):
                native.put_scaled(
                    fp8, fp8.t(), one, one, None, torch.bfloat16, False, native.LAUNCH, new_id(), "x", (16, 16),
                    NativeCall("launch", _launch_words(*roles)),
                )  # fmt: skip
        assert native.size(native.SCALED) == 0
    assert native.size() == 0


# --- building in the background -----------------------------------------------------------

# A program's first enable() on a machine without a build: it returns while a process of its
# own builds the kernels, the Python kernels serve (here in tune mode, from two threads), and
# the native kernels take over once the build is loaded. Prints one JSON line.
_FIRST_ENABLE = r"""
import json, threading, time
import torch
import unimatmul.torch as ut
from unimatmul.torch import native, routing

gen = torch.Generator().manual_seed(0)
a, w, bias = (torch.randn(*s, generator=gen) for s in ((48, 96), (40, 96), (40,)))
ref = (a.double() @ w.double().t() + bias.double()).float()
mm_ref = (a.double() @ w.double().t()).float()
wrong = []

def check(phase):
    got = torch.nn.functional.linear(a, w, bias), torch.mm(a, w.t())
    for out, want in zip(got, (ref, mm_ref)):
        if not torch.allclose(out, want, rtol=1e-4, atol=1e-4):
            wrong.append((phase, (out - want).abs().max().item()))

started = time.perf_counter()
ut.enable()
enable_s = time.perf_counter() - started
at_enable = native.status()["state"]
phases = {"building": 0, "native": 0}
stop = threading.Event()

def other_thread():
    while not stop.is_set():
        check("native" if routing._router.native_keys else "building")

thread = threading.Thread(target=other_thread)
thread.start()
while not routing._router.native_keys and time.perf_counter() - started < 900:
    check("building")
    phases["building"] += 1
    time.sleep(0.01)
took_over_s = time.perf_counter() - started
native.counts(reset=True)
for _ in range(20):
    check("native")
    phases["native"] += 1
stop.set()
thread.join()
print(json.dumps({
    "enable_s": enable_s, "took_over_s": took_over_s, "at_enable": at_enable,
    "after": native.status()["state"], "keys": list(routing._router.native_keys),
    "phases": phases, "wrong": wrong, "native_calls": sum(native.counts().values()),
    "sources": sorted(ut.stats()["by_source"]),
}))
"""


def _fresh_machine(tmp_path: Any, **extra: str) -> dict[str, str]:
    """The environment of a process on a machine where no native build exists yet."""
    import os

    environment = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    return environment | {
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
        "UNIMATMUL_CACHE": str(tmp_path / "cache.msgpack"),
        **extra,
    }


def _run(program: str, environment: dict[str, str]) -> tuple[dict[str, Any], str]:
    """Run ``program`` in a process of its own: the JSON line it prints, and its stderr."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=1200, env=environment
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_the_first_enable_returns_at_once_and_the_native_kernels_take_over(tmp_path: Any) -> None:
    """No build present: enable() returns while the build runs in the background; products
    are right before, during and after the native kernels take over (two threads)."""
    found, said = _run(_FIRST_ENABLE, _fresh_machine(tmp_path, UNIMATMUL_MODE="tune"))
    assert found["at_enable"] == "building"
    assert "building the native routing kernels for the CPU in the background" in said
    assert found["after"] == "loaded" and found["keys"][0] == "CPU"
    assert found["wrong"] == []
    # The Python kernels served while it built (tuning, in tune mode), the native table after.
    assert found["phases"]["building"] > 0 and "tuned" in found["sources"]
    assert found["native_calls"] >= found["phases"]["native"]
    # enable() did not wait for the compiler: the build took most of the time to take over.
    assert found["enable_s"] < found["took_over_s"] / 2, found
    # The next process loads that build at once.
    again, said = _run(_FIRST_ENABLE, _fresh_machine(tmp_path))
    assert again["at_enable"] == "loaded"
    assert "building" not in said


# With UNIMATMUL_TORCH_NATIVE_BUILD=never nothing is built; then, in the background, a build
# that fails (no compiler): one warning with the reason, and the Python kernels keep serving.
_NO_BUILD = r"""
import json, os, time, warnings
import torch
import unimatmul.torch as ut
from unimatmul.torch import native, routing

a, b = torch.randn(24, 40), torch.randn(40, 8)
ref = (a.double() @ b.double()).float()
found = {}
os.environ["UNIMATMUL_TORCH_NATIVE_BUILD"] = "never"
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    ut.enable()
    found["never"] = [native.building(False), native.status()["state"], len(said)]
    found["never_right"] = torch.allclose(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
    ut.disable()
    os.environ["UNIMATMUL_TORCH_NATIVE_BUILD"] = "background"
    ut.enable()
    found["started"] = native.building(False)
    while native.building(False):
        time.sleep(0.05)
    time.sleep(0.2)  # the watcher warns after it gave up the lock
    found["warnings"] = [str(w.message) for w in said]
found["status"] = native.status()
found["keys"] = list(routing._router.native_keys)
found["right"] = torch.allclose(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_never_builds_nothing_and_a_failed_background_build_says_why(tmp_path: Any) -> None:
    found, _ = _run(_NO_BUILD, _fresh_machine(tmp_path, CXX="/bin/false"))
    assert found["never"] == [False, "not built", 0] and found["never_right"]
    assert found["started"]
    (warning,) = found["warnings"]
    assert "native routing kernels did not build" in warning and "Python kernels" in warning
    assert found["status"]["state"] == "failed" and found["status"]["reason"] in warning
    assert found["keys"] == [] and found["right"]


def test_build_native_takes_cpu_or_gpu_and_nothing_else(capsys: pytest.CaptureFixture[str]) -> None:
    from unimatmul.torch.__main__ import main

    assert main(["--build-native", "tpu"]) == 2
    assert main(["--build-native", "cpu", "gpu"]) == 2
    assert "--build-native [cpu|gpu]" in capsys.readouterr().err


def test_info_says_whether_the_native_kernels_are_built(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, isolated: Any
) -> None:
    """Read from the extension folder (a fresh one here), as a process that has not loaded
    them sees it: not built, then building while the builder's lock file is there."""
    import json
    from io import StringIO

    from unimatmul.cli import main

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    monkeypatch.setattr(native, "_loaded_gpu", None)
    cuda = torch.cuda.is_available()

    def info(*args: str) -> str:
        out = StringIO()
        assert main(["info", *args], out=out) == 0
        return out.getvalue()

    assert "torch:     native routing kernels not built" in info()
    folder = native._build_folder(cuda)
    assert folder is not None
    (folder / "lock").touch()
    text = info()
    assert "native routing kernels building" in text and "remove its lock file" in text
    assert json.loads(info("--json"))["torch_native"]["state"] == "building"
    (folder / "lock").unlink()
    monkeypatch.setenv(native.ENV, "0")
    assert "native routing kernels off" in info()
