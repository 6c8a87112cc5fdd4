"""Tests for the raw oneDNN ctypes layer (backends/onednn/_dnnl.py).

These really run oneDNN: every implementation the library offers for a
problem is executed on strided numpy buffers and compared with a float64
reference.  Skipped when libdnnl cannot be found.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# A plain import: if the module itself cannot be imported that is a failure,
# not a skip (needs the repo root on sys.path, e.g. `python -m pytest`).
from unimatmul_backends.onednn import _dnnl

np = pytest.importorskip("numpy")

try:
    _LIB_PATH = _dnnl.find_library()
except OSError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"oneDNN library not available: {exc}", allow_module_level=True)

MatmulSpec = _dnnl.MatmulSpec
PostOp = _dnnl.PostOp

# ref(a, b, bias | None, c_old | None) -> expected dst, all float64.
RefFn = Callable[[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None], np.ndarray]

REPO_ROOT = Path(__file__).resolve().parents[3]
F32_TOL = 1e-5


@pytest.fixture(scope="module")
def dnnl() -> Iterator[_dnnl.Dnnl]:
    yield _dnnl.get_dnnl()


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_to_f32(b: np.ndarray) -> np.ndarray:
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


_NP_STORAGE = {"f32": np.float32, "bf16": np.uint16}
_NAN_BITS = {"f32": np.float32(np.nan), "bf16": np.uint16(0x7FC0)}


class Operand:
    """A strided view over a flat buffer, as a caller of the backend would have."""

    def __init__(self, spec: MatmulSpec, which: str, values: np.ndarray | None = None) -> None:
        self.dtype = spec.dtype(which)
        self.shape = spec.shape(which)
        self.strides = spec.strides(which)
        storage = _NP_STORAGE[self.dtype]
        # One spare element at the end: guards against off-by-one overreads in
        # our extent computation being invisible.
        self.buf = np.zeros(spec.extent(which) + 1, dtype=storage)
        self.view = np.lib.stride_tricks.as_strided(
            self.buf,
            shape=self.shape,
            strides=[s * self.buf.itemsize for s in self.strides],
        )
        if values is not None:
            self.set(values)

    @property
    def ptr(self) -> int:
        return int(self.buf.ctypes.data)

    def set(self, values: np.ndarray) -> None:
        v = np.broadcast_to(np.asarray(values, dtype=np.float32), self.shape)
        self.view[...] = f32_to_bf16(v).reshape(self.shape) if self.dtype == "bf16" else v

    def poison(self) -> None:
        self.buf[...] = _NAN_BITS[self.dtype]

    def values64(self) -> np.ndarray:
        """Logical values (after any bf16 rounding) as float64."""
        v = bf16_to_f32(self.view) if self.dtype == "bf16" else self.view
        return np.array(v, dtype=np.float64)


def strides_for(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """Element strides for a [.., r, c] operand stored in ``layout``.

    'n': row-major; 't': stored transposed (column-major within each batch);
    'pad': row-major with a padded leading dimension.
    """
    *b, r, c = shape
    if layout == "n":
        inner = (c, 1)
        bstride = r * c
    elif layout == "t":
        inner = (1, r)
        bstride = r * c
    elif layout == "pad":
        inner = (c + 3, 1)
        bstride = r * (c + 3)
    else:  # pragma: no cover
        raise ValueError(layout)
    return (bstride, *inner) if b else inner


def make_spec(
    batch: int,
    m: int,
    k: int,
    n: int,
    a: str = "n",
    b: str = "n",
    c: str = "n",
    **kw: object,
) -> MatmulSpec:
    bs = (batch,) if batch > 1 else ()
    return MatmulSpec(
        batch,
        m,
        k,
        n,
        src_strides=strides_for((*bs, m, k), a),
        wei_strides=strides_for((*bs, k, n), b),
        dst_strides=strides_for((*bs, m, n), c),
        **kw,
    )


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(got - ref)
    return float(diff / denom) if denom > 0 else float(diff)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def rand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def run_all_impls(
    dnnl: object,
    spec: MatmulSpec,
    rng: np.random.Generator,
    ref_fn: RefFn,
    tol: float,
    c0: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    alpha: float = 1.0,
) -> list[str]:
    """Run every offered impl of ``spec``; returns the impl names checked."""
    impls = dnnl.list_impls(spec)
    assert impls, f"no implementation offered for {spec}"
    src = Operand(spec, "src", rand(rng, spec.shape("src")))
    wei = Operand(spec, "wei", rand(rng, spec.shape("wei")))
    bia = (
        Operand(spec, "bias", bias if bias is not None else rand(rng, spec.shape("bias")))
        if spec.bias_dtype
        else None
    )
    dst = Operand(spec, "dst")
    c0_vals = c0 if c0 is not None else rand(rng, spec.shape("dst"))
    failures = []
    for name in impls:
        with dnnl.matmul(spec, name) as prim:
            assert prim.impl_name == name
            if any(op.kind == "sum" for op in spec.post_ops):
                dst.poison()  # the padding stays NaN, the logical part holds C
                dst.set(c0_vals)
                c_in = dst.values64()
            else:
                dst.poison()
                c_in = None
            prim.execute(src.ptr, wei.ptr, dst.ptr, bia.ptr if bia else None, alpha=alpha)
            got = dst.values64()
            if not np.all(np.isfinite(got)):
                failures.append(f"{name}: non-finite output (not fully written)")
                continue
            ref = ref_fn(src.values64(), wei.values64(), bia.values64() if bia else None, c_in)
            err = rel_err(got, ref)
            if not err < tol:
                failures.append(f"{name}: rel err {err:.3g} >= {tol}")
    assert not failures, f"{spec}: " + "; ".join(failures)
    return impls


def plain_ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, c: np.ndarray | None) -> np.ndarray:
    return np.matmul(a, b)


# ---------------------------------------------------------------------------
# library / discovery
# ---------------------------------------------------------------------------


def test_version(dnnl: _dnnl.Dnnl) -> None:
    v = dnnl.version()
    assert v.startswith("3."), v
    major, minor, patch, _githash = dnnl.version_info()
    assert (major, minor) >= (3, 0)
    assert v.split("+")[0] == f"{major}.{minor}.{patch}"


def test_env_var_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_dnnl.ENV_VAR, _LIB_PATH if os.path.isabs(_LIB_PATH) else "/nonexistent")
    if os.path.isabs(_LIB_PATH):
        assert _dnnl.find_library() == _LIB_PATH
    monkeypatch.setenv(_dnnl.ENV_VAR, "/nonexistent/libdnnl.so.3")
    with pytest.raises(OSError, match="UNIMATMUL_DNNL_LIB"):
        _dnnl.find_library()


def test_not_found_lists_every_place(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(_dnnl.ENV_VAR, raising=False)
    monkeypatch.setattr(_dnnl.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(_dnnl, "_DIST_NAMES", ("no-such-distribution-xyz",))
    monkeypatch.setattr(_dnnl.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(OSError) as info:
        _dnnl.find_library()
    msg = str(info.value)
    assert str(tmp_path / "lib" / "libdnnl.so.3") in msg
    assert "no-such-distribution-xyz" in msg
    assert "ctypes.util.find_library" in msg
    assert _dnnl.ENV_VAR in msg


def test_every_wheel_is_looked_for(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Both oneDNN wheels are named where the library is not found: 3.2's and 3.13's.
    monkeypatch.delenv(_dnnl.ENV_VAR, raising=False)
    monkeypatch.setattr(_dnnl.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(_dnnl.ctypes.util, "find_library", lambda name: None)
    missing = [d for d in _dnnl._DIST_NAMES if not _dnnl._dist_lib_candidates(d)]
    if len(missing) == len(_dnnl._DIST_NAMES):
        with pytest.raises(OSError) as info:
            _dnnl.find_library()
        assert all(repr(d) in str(info.value) for d in ("onednn-cpu-gomp", "onednn"))
    else:  # one wheel is installed: its files are found wherever the prefix says
        assert _dnnl.find_library().endswith(("libdnnl.so.3", "libdnnl.so"))


def test_elf_needed_reads_the_dependencies(dnnl: _dnnl.Dnnl) -> None:
    needed = _dnnl._elf_needed(dnnl.path)
    assert "libc.so.6" in needed and "libstdc++.so.6" in needed, needed
    assert _dnnl._elf_needed(__file__) == []  # not an ELF file


def _build_library(tmp_path: Path, name: str, source: str, *deps: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test libraries")
    (tmp_path / f"{name}.c").write_text(source)
    out = tmp_path / f"{name}.so"
    links = [f"-l:{d}.so" for d in deps]
    # No -rpath: like the onednn wheel, the library does not say where its dependencies are.
    # A soname, as every real library has: the loader matches a loaded dependency by it.
    cmd = [cc, "-shared", "-fPIC", f"-Wl,-soname,{name}.so", "-o", str(out), str(tmp_path / f"{name}.c")]
    cmd += [f"-L{tmp_path}", *links]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def test_dependencies_are_taken_from_the_librarys_own_folder(tmp_path: Path) -> None:
    # top -> middle -> leaf, all in one folder with no RUNPATH: a plain dlopen of top
    # fails on its missing dependency, loading beside it works (depth first).
    _build_library(tmp_path, "libumm_leaf", "int leaf(void) { return 40; }\n")
    _build_library(
        tmp_path, "libumm_middle", "int leaf(void);\nint middle(void) { return leaf() + 1; }\n", "libumm_leaf"
    )
    top = _build_library(
        tmp_path, "libumm_top", "int middle(void);\nint top(void) { return middle() + 1; }\n", "libumm_middle"
    )
    code = (
        "import ctypes, sys\n"
        "from unimatmul_backends.onednn import _dnnl\n"
        "try:\n"
        "    ctypes.CDLL(sys.argv[1])\n"
        "    sys.exit('a plain load found the dependencies: the test proves nothing')\n"
        "except OSError as exc:\n"
        "    assert 'libumm_middle.so' in str(exc), exc\n"
        "print(_dnnl._load_with_neighbours(sys.argv[1]).top())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(top)], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert done.stdout.strip() == "42"


def test_a_missing_dependency_is_named(tmp_path: Path) -> None:
    _build_library(tmp_path, "libumm_gone", "int gone(void) { return 1; }\n")
    top = _build_library(
        tmp_path, "libumm_needs_gone", "int gone(void);\nint f(void) { return gone(); }\n", "libumm_gone"
    )
    (tmp_path / "libumm_gone.so").unlink()
    with pytest.raises(OSError, match=r"cannot load .*libumm_needs_gone\.so.*libumm_gone\.so"):
        _dnnl._load_with_neighbours(str(top))


def test_a_sycl_build_is_pointed_at_its_opencl_cpu_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lib = tmp_path / "libdnnl.so.3"
    monkeypatch.delenv(_dnnl.OPENCL_ICD_VAR, raising=False)
    _dnnl._point_opencl_at_cpu_runtime(str(lib))
    assert _dnnl.OPENCL_ICD_VAR not in os.environ  # no runtime beside it: nothing to point at
    (tmp_path / "libintelocl.so").write_bytes(b"")
    _dnnl._point_opencl_at_cpu_runtime(str(lib))
    assert os.environ[_dnnl.OPENCL_ICD_VAR] == str(tmp_path / "libintelocl.so")
    monkeypatch.setenv(_dnnl.OPENCL_ICD_VAR, "/the/users/choice.so")
    _dnnl._point_opencl_at_cpu_runtime(str(lib))
    assert os.environ[_dnnl.OPENCL_ICD_VAR] == "/the/users/choice.so"


def test_the_cpu_runtime_is_known(dnnl: _dnnl.Dnnl) -> None:
    assert dnnl.cpu_runtime in _dnnl.CPU_RUNTIMES.values()
    if dnnl.cpu_runtime == "sycl":  # the engine works: its OpenCL CPU runtime was found
        assert dnnl.engine and os.environ.get(_dnnl.OPENCL_ICD_VAR)


def test_a_forked_child_runs_or_refuses_but_never_hangs(dnnl: _dnnl.Dnnl) -> None:
    # OpenMP (3.2) carries on in a forked child; SYCL (3.13) would hang in the child's
    # first execute, so the child must refuse with an error that names fork.
    code = (
        "import os, faulthandler, numpy as np\n"
        "from unimatmul_backends.onednn import _dnnl\n"
        "d = _dnnl.get_dnnl()\n"
        "a = np.arange(64, dtype=np.float32).reshape(8, 8) / 64; c = np.full((8, 8), np.nan, np.float32)\n"
        "p = d.matmul(_dnnl.MatmulSpec(1, 8, 8, 8)); p.execute(a.ctypes.data, a.ctypes.data, c.ctypes.data)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    faulthandler.dump_traceback_later(30, exit=True)\n"
        "    c[...] = np.nan\n"
        "    try:\n"
        "        p.execute(a.ctypes.data, a.ctypes.data, c.ctypes.data)\n"
        "        ok = np.allclose(c, a.astype(np.float64) @ a, rtol=1e-5)\n"
        "        print('ran', ok, flush=True)\n"
        "    except RuntimeError as exc:\n"
        "        print('refused', exc, flush=True)\n"
        "    os._exit(0)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    if dnnl.cpu_runtime == "sycl":
        assert done.stdout.startswith("refused") and "fork()" in done.stdout, done.stdout
    else:
        assert done.stdout.strip() == "ran True", done.stdout + done.stderr


def test_import_loads_nothing() -> None:
    code = (
        "import unimatmul_backends.onednn._dnnl as d\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libdnnl' not in maps, 'library loaded at import'\n"
        "d.get_dnnl()\n"
        "assert 'libdnnl' in open('/proc/self/maps').read()\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


# ---------------------------------------------------------------------------
# f32: every impl, many shapes and layouts
# ---------------------------------------------------------------------------

SHAPES = [
    (1, 1, 1, 1),
    (1, 7, 13, 5),
    (1, 64, 64, 64),
    (1, 129, 257, 65),
    (3, 17, 19, 23),
]
LAYOUTS = [
    ("n", "n", "n"),
    ("t", "n", "n"),
    ("n", "t", "n"),
    ("t", "t", "n"),
    ("pad", "pad", "pad"),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "".join(s[0] for s in x))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_f32_all_impls(
    dnnl: _dnnl.Dnnl, shape: tuple[int, int, int, int], layout: tuple[str, str, str]
) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((shape, layout)).encode()))
    spec = make_spec(*shape, *layout)
    impls = run_all_impls(dnnl, spec, rng, plain_ref, F32_TOL)
    assert "ref:any" in impls


def test_f32_bias_relu(dnnl: _dnnl.Dnnl) -> None:
    rng = np.random.default_rng(1)
    for batch in (1, 3):
        spec = make_spec(batch, 33, 47, 29, "t", "n", bias_dtype="f32", post_ops=(PostOp("relu"),))

        def ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, c: np.ndarray | None) -> np.ndarray:
            return np.maximum(np.matmul(a, b) + bias, 0.0)

        run_all_impls(dnnl, spec, rng, ref, F32_TOL)


@pytest.mark.parametrize("kind,fn", [("gelu_erf", gelu_erf), ("gelu_tanh", gelu_tanh)])
def test_f32_bias_gelu(dnnl: _dnnl.Dnnl, kind: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    rng = np.random.default_rng(2)
    spec = make_spec(1, 40, 24, 36, "n", "t", bias_dtype="f32", post_ops=(PostOp(kind),))
    run_all_impls(dnnl, spec, rng, lambda a, b, bias, c: fn(np.matmul(a, b) + bias), F32_TOL)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.25), (2.0, 0.0)])
def test_f32_alpha_beta(dnnl: _dnnl.Dnnl, alpha: float, beta: float) -> None:
    rng = np.random.default_rng(3)
    for batch in (1, 2):
        spec = make_spec(
            batch,
            31,
            45,
            27,
            "t",
            "t",
            "pad",
            runtime_alpha=True,
            post_ops=(PostOp("sum", beta),),
        )
        run_all_impls(
            dnnl,
            spec,
            rng,
            lambda a, b, bias, c: alpha * np.matmul(a, b) + beta * c,
            F32_TOL,
            alpha=alpha,
        )


def test_f32_alpha_does_not_scale_bias(dnnl: _dnnl.Dnnl) -> None:
    # oneDNN 3.x: dst = alpha * (src @ wei) + bias, then post-ops.
    rng = np.random.default_rng(4)
    spec = make_spec(
        1,
        20,
        30,
        40,
        bias_dtype="f32",
        runtime_alpha=True,
        post_ops=(PostOp("sum", 0.5),),
    )
    run_all_impls(
        dnnl,
        spec,
        rng,
        lambda a, b, bias, c: 3.0 * np.matmul(a, b) + bias + 0.5 * c,
        F32_TOL,
        alpha=3.0,
    )


def test_f32_post_op_order(dnnl: _dnnl.Dnnl) -> None:
    rng = np.random.default_rng(5)
    c0 = rand(rng, (24, 16)) * 4
    s1 = make_spec(1, 24, 32, 16, post_ops=(PostOp("sum", 1.0), PostOp("relu")))
    run_all_impls(
        dnnl,
        s1,
        rng,
        lambda a, b, bias, c: np.maximum(np.matmul(a, b) + c, 0),
        F32_TOL,
        c0=c0,
    )
    s2 = make_spec(1, 24, 32, 16, post_ops=(PostOp("relu"), PostOp("sum", 1.0)))
    run_all_impls(
        dnnl,
        s2,
        rng,
        lambda a, b, bias, c: np.maximum(np.matmul(a, b), 0) + c,
        F32_TOL,
        c0=c0,
    )


def test_primitive_reuse_with_new_buffers_and_alpha(dnnl: _dnnl.Dnnl) -> None:
    rng = np.random.default_rng(6)
    spec = make_spec(1, 50, 60, 70, "t", "n", runtime_alpha=True)
    with dnnl.matmul(spec) as prim:
        for alpha in (1.0, 2.5, -0.75, 1.0):
            a = Operand(spec, "src", rand(rng, spec.shape("src")))
            b = Operand(spec, "wei", rand(rng, spec.shape("wei")))
            c = Operand(spec, "dst")
            c.poison()
            prim.execute(a.ptr, b.ptr, c.ptr, alpha=alpha)
            ref = alpha * np.matmul(a.values64(), b.values64())
            assert rel_err(c.values64(), ref) < F32_TOL


def test_fpmath_bf16_runs(dnnl: _dnnl.Dnnl) -> None:
    rng = np.random.default_rng(7)
    spec = make_spec(1, 64, 96, 48, fpmath="bf16")
    run_all_impls(dnnl, spec, rng, plain_ref, 1e-2)


# ---------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------


def _bf16_impls(dnnl: _dnnl.Dnnl) -> list[str]:
    return dnnl.list_impls(MatmulSpec(1, 32, 32, 32, "bf16", "bf16", "f32"))


@pytest.mark.parametrize("dst_dtype,tol", [("f32", F32_TOL), ("bf16", 1e-2)])
@pytest.mark.parametrize("layout", LAYOUTS[:4], ids=lambda x: "".join(s[0] for s in x))
@pytest.mark.parametrize("shape", [(1, 7, 13, 5), (1, 129, 257, 65), (3, 17, 19, 23)], ids=str)
def test_bf16(
    dnnl: _dnnl.Dnnl,
    shape: tuple[int, int, int, int],
    layout: tuple[str, str, str],
    dst_dtype: str,
    tol: float,
) -> None:
    if not _bf16_impls(dnnl):
        pytest.skip("no bf16 matmul implementation on this CPU")
    rng = np.random.default_rng(8)
    spec = make_spec(*shape, *layout, src_dtype="bf16", wei_dtype="bf16", dst_dtype=dst_dtype)
    # The reference uses the bf16-rounded inputs; accumulation is f32 in oneDNN.
    run_all_impls(dnnl, spec, rng, plain_ref, tol)


def test_bf16_bias_relu_alpha_beta(dnnl: _dnnl.Dnnl) -> None:
    if not _bf16_impls(dnnl):
        pytest.skip("no bf16 matmul implementation on this CPU")
    rng = np.random.default_rng(9)
    spec = make_spec(
        1,
        33,
        64,
        20,
        "t",
        "n",
        src_dtype="bf16",
        wei_dtype="bf16",
        dst_dtype="f32",
        bias_dtype="f32",
        runtime_alpha=True,
        post_ops=(PostOp("sum", 0.5), PostOp("relu")),
    )

    def ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, c: np.ndarray | None) -> np.ndarray:
        return np.maximum(2.0 * np.matmul(a, b) + bias + 0.5 * c, 0.0)

    run_all_impls(dnnl, spec, rng, ref, F32_TOL, alpha=2.0)


# ---------------------------------------------------------------------------
# errors and lifetime
# ---------------------------------------------------------------------------


def test_unknown_impl_name(dnnl: _dnnl.Dnnl) -> None:
    spec = MatmulSpec(1, 8, 8, 8)
    offered = dnnl.list_impls(spec)
    with pytest.raises(_dnnl.ImplNotFoundError, match="no-such-impl") as info:
        dnnl.matmul(spec, "no-such-impl")
    assert info.value.offered == offered
    assert isinstance(info.value, ValueError)


def test_unimplemented_problem_raises_dnnl_error(dnnl: _dnnl.Dnnl) -> None:
    spec = MatmulSpec(1, 8, 8, 8, "f16", "f16", "f16")
    if dnnl.list_impls(spec):
        pytest.skip("f16 matmul is implemented on this CPU")
    with pytest.raises(_dnnl.DnnlError) as info:
        dnnl.matmul(spec)
    assert info.value.function == "dnnl_matmul_primitive_desc_create"
    assert info.value.status == 3 and info.value.status_name == "dnnl_unimplemented"
    assert "dnnl_matmul_primitive_desc_create" in str(info.value)


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        MatmulSpec(1, 0, 4, 4)
    with pytest.raises(ValueError):
        MatmulSpec(1, 4, 4, 4, src_dtype="f64")
    with pytest.raises(ValueError):
        MatmulSpec(2, 4, 4, 4, src_strides=(4, 1))
    with pytest.raises(ValueError):
        PostOp("tanh")
    with pytest.raises(ValueError):
        MatmulSpec(1, 4, 4, 4, post_ops=(PostOp("sum", 1.0), PostOp("sum", 2.0)))
    # batch == 1 accepts 3-D strides and drops the batch stride.
    assert MatmulSpec(1, 4, 5, 6, src_strides=(20, 1, 4)).src_strides == (1, 4)
    assert MatmulSpec(2, 4, 5, 6).extent("src") == 40


def test_execute_argument_checks_and_close(dnnl: _dnnl.Dnnl) -> None:
    spec = MatmulSpec(1, 4, 4, 4)
    a, b, c = (np.ones((4, 4), np.float32) for _ in range(3))
    prim = dnnl.matmul(spec)
    with pytest.raises(ValueError, match="runtime_alpha"):
        prim.execute(a.ctypes.data, b.ctypes.data, c.ctypes.data, alpha=2.0)
    with pytest.raises(ValueError, match="without a bias"):
        prim.execute(a.ctypes.data, b.ctypes.data, c.ctypes.data, bias=a.ctypes.data)
    prim.execute(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    assert np.all(c == 4.0)
    prim.close()
    prim.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        prim.execute(a.ctypes.data, b.ctypes.data, c.ctypes.data)

    with (
        dnnl.matmul(MatmulSpec(1, 4, 4, 4, bias_dtype="f32")) as p2,
        pytest.raises(ValueError, match="bias"),
    ):
        p2.execute(a.ctypes.data, b.ctypes.data, c.ctypes.data)
