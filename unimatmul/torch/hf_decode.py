"""Hugging Face generation: MoE experts keep the routed grouped products in decode.

transformers 5 runs the experts of MoE models through ``grouped_mm`` (its default
``experts_implementation``; ``aten::_grouped_mm``, which ``grouped_routing.py`` routes),
but ``generate()`` switches them to ``batched_mm`` for its decode steps on a GPU
(``GenerationMixin._optimize_model_for_decode``): every token's chosen experts' weights
are gathered into a copy, then multiplied by ``torch.bmm``. That copy writes and reads
again the weights of every (token, expert) pair, so decode moves several times the bytes
the grouped product reads, and routing's grouped kernels never see decode's experts.

With ``UNIMATMUL_HF_DECODE=grouped``, while routing is on (mode not ``off``) and the
grouped door takes the model's device and dtype, that switch is left out: decode runs the
experts as prefill does, through the routed grouped door. That takes much less GPU time
(on the H200, Qwen3-30B-A3B's first 4 layers at batch 16: 118 ms of GPU time a 64-token
generate against 269 ms), but transformers' grouped path launches about twice the ops a
layer, and eager decode is bound by the host: there it lost (0.85x tokens/s at batch 1
and 16), so the default (``transformers``) keeps transformers' switch. Only the automatic
switch changes: a model set to ``batched_mm`` (or any other implementation) by its user
keeps it. ``benchmarks/results/moe-h200/`` has the figures; docs/torch.md says more.

The switch is wrapped on ``GenerationMixin`` (a class attribute; :func:`uninstall` puts
the original back) when routing is enabled with transformers imported, or at the grouped
door's first call otherwise (a model's prefill always comes before its decode). Where a
transformers version has no such method, nothing is wrapped.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from unimatmul import settings

_MODULE = "transformers.generation.utils"
_NAME = "_optimize_model_for_decode"
_MARK = "__unimatmul_original__"
_lock = threading.Lock()
_routes: Callable[[Any, Any], bool] = lambda device, dtype: False  # noqa: E731 - set by install()


def install(routes: Callable[[Any, Any], bool]) -> bool:
    """Wrap transformers' decode switch where transformers is imported (idempotent);
    True when the wrapper is in place. ``routes(device, dtype)``: whether the grouped door
    takes a call there now (``grouped_routing.routes``)."""
    global _routes
    _routes = routes
    module = sys.modules.get(_MODULE)
    mixin = getattr(module, "GenerationMixin", None) if module is not None else None
    if mixin is None:
        return False
    with _lock:
        current = mixin.__dict__.get(_NAME)
        if current is None:
            return False
        if getattr(current, _MARK, None) is not None:
            return True
        setattr(mixin, _NAME, _wrap(current))
    return True


def uninstall() -> None:
    """Put transformers' own switch back (nothing where it was never wrapped)."""
    module = sys.modules.get(_MODULE)
    mixin = getattr(module, "GenerationMixin", None) if module is not None else None
    if mixin is None:
        return
    with _lock:
        current = mixin.__dict__.get(_NAME)
        original = getattr(current, _MARK, None)
        if original is not None:
            setattr(mixin, _NAME, original)


def keeps_grouped(model: Any) -> bool:
    """Whether ``model``'s decode keeps its grouped experts: the setting allows it, the
    grouped door is installed, the mode routes, and the door serves the model's device
    and dtype."""
    if settings.HF_DECODE.get() != "grouped":  # the default: transformers decides
        return False
    device, dtype = getattr(model, "device", None), getattr(model, "dtype", None)
    return getattr(device, "type", "cpu") != "cpu" and _routes(device, dtype)


def _wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @contextlib.contextmanager
    def optimize_model_for_decode(self: Any) -> Iterator[None]:
        if keeps_grouped(self):
            yield
            return
        with original(self):
            yield

    optimize_model_for_decode.__doc__ = original.__doc__
    setattr(optimize_model_for_decode, _MARK, original)
    return optimize_model_for_decode
