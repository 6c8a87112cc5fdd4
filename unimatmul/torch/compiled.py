"""torch.compile: keep routed products in compiled graphs.

Eager mode, ``backend="eager"`` and ``backend="aot_eager"`` run aten ops, which reach
the routed kernels by themselves. Inductor instead lowers ``aten.mm`` and friends
into its own kernels or calls their ``out=`` forms, which are PyTorch's. So while
routing is on, a post-grad pass (``torch._inductor.config.post_grad_custom_pre_pass``,
chained after any pass already set there) rewrites the graph's mm, addmm, bmm and
baddbmm nodes on CPU/CUDA floating tensors into the custom op ``unimatmul::mm``.
Inductor keeps a custom op as an opaque call; at run time it calls the routed aten
kernel, so the compiled model runs the tuned kernels, forward and backward (AOT
autograd has already split the backward into its own graph, which the pass also
sees). Shapes come from the op's fake implementation.

``unimatmul::mm(a, b, c=None, alpha=1, beta=1)`` is ``alpha * a @ b + beta * c``
(``c`` broadcast as addmm's input, absent for mm), 2-D or batched 3-D.

Two aten ops become a custom op of the same signature which calls the routed aten op
(Inductor would otherwise call their ``out=`` forms or its own templates):

- ``aten._scaled_mm`` (fp8 with scales) nodes writing bf16, f16 or f32 become
  ``unimatmul::scaled_mm``, which calls the routed ``torch._scaled_mm``
  (``scaled_routing.py``);
- ``aten._grouped_mm`` (MoE experts: ``torch._grouped_mm``, ``F.grouped_mm``) nodes on
  the dtypes the grouped door serves (bf16, f16, f32) become
  ``unimatmul::grouped_mm(a, b, offs=None, bias=None, out_dtype=None)``, which calls the
  routed ``torch._grouped_mm`` (``grouped_routing.py``). The backward's products
  (``grad @ b^T``, ``a^T @ grad`` with ``offs`` over K) are ``_grouped_mm`` nodes of the
  backward graph, rewritten alike. Its fake implementation gives torch's shape and dtype
  for each of the four forms (``unimatmul.core.grouped.grouped_shapes``), contiguous, and
  the op's result is contiguous too (torch's own kernel pads rows to 16 bytes, a copy
  then). Not torch's meta kernel: torch 2.13's refuses f32 and f16, which its CPU kernel
  runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from unimatmul._version import __version__
from unimatmul.core.grouped import grouped_shapes
from unimatmul.torch import grouped_routing


class _Registration:
    """What this process registered with torch: the ``unimatmul`` op library (defined once)
    and the Inductor pass, with the one it chained after."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.library: Any = None
        self.previous_pass: Any = None
        self.installed = False


_registered = _Registration()


def _mm(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 1.0
) -> torch.Tensor:
    # The functional aten ops: routed while routing is on, PyTorch's own otherwise.
    if a.dim() == 3:
        if c is None:
            if alpha == 1.0:
                return torch.bmm(a, b)
            return torch.baddbmm(a.new_zeros(()), a, b, beta=0, alpha=alpha)
        return torch.baddbmm(c, a, b, beta=beta, alpha=alpha)
    if c is None:
        if alpha == 1.0:
            return torch.mm(a, b)
        return torch.addmm(a.new_zeros(()), a, b, beta=0, alpha=alpha)
    return torch.addmm(c, a, b, beta=beta, alpha=alpha)


def _mm_fake(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0, beta: float = 1.0
) -> torch.Tensor:
    if a.dim() == 3:
        return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
    return a.new_empty((a.shape[0], b.shape[1]))


def _scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    # The functional aten op: routed while routing is on, PyTorch's own otherwise.
    return torch._scaled_mm(
        a,
        b,
        scale_a,
        scale_b,
        bias=bias,
        scale_result=scale_result,
        out_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
    )


def _scaled_mm_fake(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype if out_dtype is not None else a.dtype)


_SCALED_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _grouped_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    # The aten op through the grouped door: routed while routing is on, PyTorch's own otherwise.
    out = grouped_routing.call(a, b, offs, bias, out_dtype)
    # The fake's layout: torch's own kernel pads rows to 16 bytes (N of 4 bf16: stride 8).
    return out if out.is_contiguous() else out.contiguous()


def _grouped_mm_fake(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    # torch's shape and dtype for each form, contiguous. Not torch's meta kernel: torch
    # 2.13's refuses f32 and f16, which its CPU kernel runs.
    if bias is not None:
        raise RuntimeError("unimatmul::grouped_mm: bias is not supported (torch._grouped_mm takes none)")
    groups = offs.shape[0] if offs is not None else 0
    shape = grouped_shapes(tuple(a.shape), tuple(b.shape), groups)[1]
    return a.new_empty(shape, dtype=out_dtype if out_dtype is not None else a.dtype)


def define_ops() -> None:
    """Define ``unimatmul::mm``, ``unimatmul::scaled_mm`` and ``unimatmul::grouped_mm`` once
    per process (a library cannot be defined twice)."""
    with _registered.lock:
        if _registered.library is not None:
            return
        library = torch.library.Library("unimatmul", "DEF")
        library.define("mm(Tensor a, Tensor b, Tensor? c=None, float alpha=1.0, float beta=1.0) -> Tensor")
        library.impl("mm", _mm, "CompositeExplicitAutograd")
        torch.library.register_fake("unimatmul::mm", _mm_fake, lib=library)
        library.define(
            "scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
            "Tensor? scale_result=None, ScalarType? out_dtype=None, bool use_fast_accum=False) -> Tensor"
        )
        library.impl("scaled_mm", _scaled_mm, "CompositeExplicitAutograd")
        torch.library.register_fake("unimatmul::scaled_mm", _scaled_mm_fake, lib=library)
        library.define(
            "grouped_mm(Tensor a, Tensor b, Tensor? offs=None, Tensor? bias=None, "
            "ScalarType? out_dtype=None) -> Tensor"
        )
        library.impl("grouped_mm", _grouped_mm, "CompositeExplicitAutograd")
        torch.library.register_fake("unimatmul::grouped_mm", _grouped_mm_fake, lib=library)
        _registered.library = library


_ATEN: dict[Any, str] = {}


def _aten_targets() -> dict[Any, str]:
    if not _ATEN:
        aten = torch.ops.aten
        _ATEN.update(
            {
                aten.mm.default: "mm",
                aten.bmm.default: "bmm",
                aten.addmm.default: "addmm",
                aten.baddbmm.default: "baddbmm",
            }
        )
    return _ATEN


def _eligible(node: Any) -> bool:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    return value.dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64) and (
        value.device.type in ("cpu", "cuda")
    )


_SAME: dict[Any, tuple[Any, tuple[torch.dtype, ...]]] = {}


def _same_signature() -> dict[Any, tuple[Any, tuple[torch.dtype, ...]]]:
    """aten op -> (the custom op of its signature that calls it routed, the output dtypes
    it is taken for)."""
    if not _SAME:
        aten, ops = torch.ops.aten, torch.ops.unimatmul
        _SAME.update(
            {
                aten._scaled_mm.default: (ops.scaled_mm.default, _SCALED_OUT_DTYPES),
                aten._grouped_mm.default: (ops.grouped_mm.default, tuple(grouped_routing.DTYPES)),
            }
        )
    return _SAME


def _rewrite_same(graph: torch.fx.Graph) -> int:
    """Replace ``aten._scaled_mm`` and ``aten._grouped_mm`` nodes on CPU/CUDA tensors of
    the dtypes their doors serve by the custom op of the same signature."""
    same = _same_signature()
    count = 0
    for node in list(graph.nodes):
        entry = same.get(node.target) if node.op == "call_function" else None
        if entry is None:
            continue
        op, dtypes = entry
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype not in dtypes:
            continue
        if value.device.type not in ("cpu", "cuda"):
            continue
        with graph.inserting_before(node):
            new = graph.call_function(op, tuple(node.args), dict(node.kwargs))
        new.meta = dict(node.meta)
        if op is torch.ops.unimatmul.grouped_mm.default and not value.is_contiguous():
            # torch's meta kernel pads rows on CUDA builds; this op's result is contiguous
            new.meta["val"] = value.new_empty(value.shape)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    return count


def rewrite(graph: torch.fx.Graph) -> int:
    """Replace eligible aten products by ``unimatmul::mm`` (and ``unimatmul::scaled_mm``,
    ``unimatmul::grouped_mm``); returns how many."""
    targets = _aten_targets()
    op = torch.ops.unimatmul.mm.default
    count = _rewrite_same(graph)
    for node in list(graph.nodes):
        kind = targets.get(node.target) if node.op == "call_function" else None
        if kind is None or not _eligible(node):
            continue
        if kind in ("mm", "bmm"):
            a, b = node.args[:2]
            args: tuple[Any, ...] = (a, b)
            kwargs: dict[str, Any] = {}
        else:
            c, a, b = node.args[:3]
            beta = node.kwargs.get("beta", node.args[3] if len(node.args) > 3 else 1)
            alpha = node.kwargs.get("alpha", node.args[4] if len(node.args) > 4 else 1)
            if not isinstance(alpha, (int, float)) or not isinstance(beta, (int, float)):
                continue  # symbolic scalars: leave the node to Inductor
            args = (a, b, c)
            kwargs = {"alpha": float(alpha), "beta": float(beta)}
        with graph.inserting_before(node):
            new = graph.call_function(op, args, kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    return count


def _make_pass(previous: Any) -> Any:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    source = Path(__file__).read_bytes()

    class RoutePass(CustomGraphPass):
        """Inductor post-grad pass: aten products -> unimatmul's custom ops (see module docs)."""

        def __call__(self, graph: torch.fx.Graph) -> None:
            if previous is not None:
                previous(graph)
            rewrite(graph)

        def uuid(self) -> Any:
            # Part of Inductor's cache key: a graph compiled with the pass is not one without.
            digest = hashlib.sha256(source + __version__.encode()).hexdigest()
            inner = previous.uuid() if previous is not None and hasattr(previous, "uuid") else None
            return (digest, inner)

    return RoutePass()


def install() -> None:
    """Define the op and set the Inductor pass (chained after an existing one): now where
    Inductor's config is imported, else once it is (importing it takes 2-9 s, most of an
    ``enable()`` that set the pass at once, and a program that never compiles never needs it)."""
    define_ops()
    with _registered.lock:
        if _registered.installed or _hook in sys.meta_path:
            return
        if _INDUCTOR_CONFIG not in sys.modules:
            sys.meta_path.insert(0, _hook)
            return
    _set_pass()


_INDUCTOR_CONFIG = "torch._inductor.config"


def _set_pass() -> None:
    try:
        import torch._inductor.config as inductor_config
    except Exception:  # a torch without Inductor: eager and aot_eager still route
        return
    with _registered.lock:
        if _registered.installed:
            return
        _registered.previous_pass = inductor_config.post_grad_custom_pre_pass
        inductor_config.post_grad_custom_pre_pass = _make_pass(_registered.previous_pass)
        _registered.installed = True


class _WhenInductorLoads(importlib.abc.MetaPathFinder):
    """Sets the pass right after ``torch._inductor.config`` is first imported (by
    ``torch.compile`` or anyone), before any graph is compiled."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != _INDUCTOR_CONFIG:
            return None
        _unhook()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _set_pass()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_hook = _WhenInductorLoads()


def _unhook() -> None:
    with _registered.lock:
        if _hook in sys.meta_path:
            sys.meta_path.remove(_hook)


def uninstall() -> None:
    """Put back the pass that was there before :func:`install` (or set none, if Inductor
    was not imported meanwhile)."""
    _unhook()
    with _registered.lock:
        if not _registered.installed:
            return
        import torch._inductor.config as inductor_config

        inductor_config.post_grad_custom_pre_pass = _registered.previous_pass
        _registered.previous_pass = None
        _registered.installed = False
