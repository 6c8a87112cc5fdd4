"""Hugging Face generation: MoE experts keep the routed grouped products in decode.

transformers 5 runs the experts of MoE models through ``grouped_mm`` (its default
``experts_implementation``; ``aten::_grouped_mm``, which ``grouped_routing.py`` routes),
but ``generate()`` switches them to ``batched_mm`` for its decode steps on a GPU
(``GenerationMixin._optimize_model_for_decode``): every token's chosen experts' weights
are gathered into a copy, then multiplied by ``torch.bmm``. That copy writes and reads
again the weights of every (token, expert) pair, so decode moves several times the bytes
the grouped product reads, and routing's grouped kernels never see decode's experts.

While routing is on (mode not ``off``) and the grouped door takes the model's device and
dtype, ``UNIMATMUL_HF_DECODE`` says whether that switch is left out, so that decode runs the
experts as prefill does, through the routed grouped door:

- ``auto`` (the default): left out where ``generate()`` compiles its decode step (a static
  cache and a ``CompileConfig``, transformers' own test ``_valid_auto_compile_criteria``);
  kept otherwise. Compiled (CUDA graphs), the grouped door's decode is far ahead: on an
  H100, Qwen3-30B-A3B's first 16 layers generated 1.27x (batch 1) and 2.97x (batch 16) the
  tokens/s of routing off, where transformers' switch left 1.09x and 1.02x. Eager, it lost
  (0.85x tokens/s at batch 1 and 16, for 2.3x less GPU time: transformers' grouped path
  launches about twice the ops a layer, and eager decode is bound by the host);
- ``grouped``: always left out; ``transformers``: never.

Only the automatic switch changes: a model set to ``batched_mm`` (or any other
implementation) by its user keeps it. ``benchmarks/results/moe-h200/`` has the figures;
docs/torch.md says more.

The switch and the compile test are wrapped on ``GenerationMixin`` (class attributes;
:func:`uninstall` puts the originals back; the test's answer is kept per thread for the
switch that follows it in the same ``generate()``) when routing is enabled with
transformers imported, or at the grouped door's first call otherwise (a model's prefill
always comes before its decode). Where a transformers version has no such switch, nothing
is wrapped; where it has no such test, ``auto`` keeps transformers' switch.
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
_COMPILE_TEST = "_valid_auto_compile_criteria"
_MARK = "__unimatmul_original__"
_lock = threading.Lock()
_routes: Callable[[Any, Any], bool] = lambda device, dtype: False  # noqa: E731 - set by install()
# The compile test's last answer in this thread: (the model's id, compiled). generate()
# asks it just before it enters the switch, in the same thread.
_seen = threading.local()


def _mixin() -> Any:
    module = sys.modules.get(_MODULE)
    return getattr(module, "GenerationMixin", None) if module is not None else None


def install(routes: Callable[[Any, Any], bool]) -> bool:
    """Wrap transformers' decode switch (and its compile test) where transformers is
    imported (idempotent); True when the switch's wrapper is in place. ``routes(device,
    dtype)``: whether the grouped door takes a call there now (``grouped_routing.routes``)."""
    global _routes
    _routes = routes
    mixin = _mixin()
    if mixin is None:
        return False
    with _lock:
        if _NAME not in mixin.__dict__:
            return False
        for name, wrap in ((_NAME, _wrap), (_COMPILE_TEST, _wrap_test)):
            current = mixin.__dict__.get(name)
            if current is not None and getattr(current, _MARK, None) is None:
                setattr(mixin, name, wrap(current))
    return True


def uninstall() -> None:
    """Put transformers' own switch and test back (nothing where they were never wrapped)."""
    mixin = _mixin()
    if mixin is None:
        return
    with _lock:
        for name in (_NAME, _COMPILE_TEST):
            original = getattr(mixin.__dict__.get(name), _MARK, None)
            if original is not None:
                setattr(mixin, name, original)


def keeps_grouped(model: Any) -> bool:
    """Whether ``model``'s decode keeps its grouped experts: the setting allows it
    (``auto``: where generate() compiles the decode step), the grouped door is installed,
    the mode routes, and the door serves the model's device and dtype."""
    choice = settings.HF_DECODE.get()
    if choice == "transformers":
        return False
    if choice == "auto" and getattr(_seen, "compiled", None) != (id(model), True):
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

    return _marked(optimize_model_for_decode, original)


def _wrap_test(original: Callable[..., bool]) -> Callable[..., bool]:
    def valid_auto_compile_criteria(self: Any, *args: Any, **kwargs: Any) -> bool:
        answer = original(self, *args, **kwargs)
        _seen.compiled = (id(self), bool(answer))
        return answer

    return _marked(valid_auto_compile_criteria, original)


def _marked(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrapper`` with ``original``'s doc, marked as wrapping it (for idempotence and
    :func:`uninstall`)."""
    wrapper.__doc__ = original.__doc__
    setattr(wrapper, _MARK, original)
    return wrapper
