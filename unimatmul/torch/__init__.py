"""Route PyTorch's matrix products through unimatmul, with no change to model code.

>>> import unimatmul.torch
>>> unimatmul.torch.enable()          # or: with unimatmul.torch.enabled(): ...
>>> model(x)                          # mm, addmm, bmm, baddbmm, matmul, @, Linear: routed
>>>                                   # (and torch._scaled_mm, fp8: scaled_routing.py)

Which kernel a routed call runs follows the mode (``UNIMATMUL_MODE`` or
:func:`unimatmul.mode`): ``cached`` (the default) runs tuned choices and PyTorch's
own kernel for the rest, ``tune`` tunes each new problem on first call, ``record``
writes each new problem to the record file for ``unimatmul tune --from``, ``off``
routes nothing. ``UNIMATMUL_TORCH=1`` turns routing on at ``import torch`` (through
PyTorch's backend autoloading) or at ``import unimatmul.torch``;
``python -m unimatmul.torch script.py`` runs a script with routing on. See
docs/torch.md.

This module imports nothing heavy: PyTorch imports it at start-up (see ``autoload``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from unimatmul.torch.autoload import ENV, wanted

if TYPE_CHECKING:
    from unimatmul.calls import Plan
    from unimatmul.torch.model_tuning import WarmupResult
    from unimatmul.tuning.agreement import Agreement

__all__ = [
    "ENV",
    "WarmupResult",
    "agree",
    "clear_plans",
    "disable",
    "enable",
    "enabled",
    "grouped_stats",
    "is_enabled",
    "plans",
    "reset_stats",
    "scaled_stats",
    "stats",
    "totals",
    "warmup",
]


def enable() -> None:
    """Route eligible products from now on, in every thread (idempotent).

    Reads ``UNIMATMUL_MODE`` now; change the mode later with :func:`unimatmul.mode`.
    Without torch installed: :class:`~unimatmul.core.errors.MissingDependency` (an ImportError).
    """
    _need_torch()
    from unimatmul.torch import compiled, grouped_routing, routing, scaled_routing
    from unimatmul.tuning import agreement

    routing.install()
    scaled_routing.install()
    grouped_routing.install()
    compiled.install()
    agreement.install()  # inert unless UNIMATMUL_DISTRIBUTED=1 in a process group


def _need_torch() -> None:
    """Say what to install where torch is missing (the CLI's words), not a bare ModuleNotFoundError."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        from unimatmul.core.errors import MissingDependency

        msg = (
            f"unimatmul.torch needs torch installed ({exc}): pip install torch, or the torch extra "
            "from the source tree: pip install -e '.[torch]'"
        )
        raise MissingDependency(msg, name="torch") from exc


def disable() -> None:
    """Give every product back to PyTorch: its own kernels and Inductor pass return."""
    from unimatmul.torch import compiled, grouped_routing, routing, scaled_routing

    routing.uninstall()
    scaled_routing.uninstall()
    grouped_routing.uninstall()
    compiled.uninstall()


def is_enabled() -> bool:
    from unimatmul.torch import routing

    return routing.is_enabled()


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """Routing inside a ``with`` block; the state before it comes back after."""
    was = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was:
            disable()


def stats() -> dict[str, Any]:
    """Counts of routed calls; see :func:`unimatmul.torch.routing.stats`."""
    from unimatmul.torch import routing

    return routing.stats()


def totals() -> dict[str, Any]:
    """Like :func:`stats`, but never reset (what unimatmul.torch.metrics exports)."""
    from unimatmul.torch import routing

    return routing.totals()


def scaled_stats() -> dict[str, Any]:
    """Counts of routed ``torch._scaled_mm`` calls; see :func:`unimatmul.torch.scaled_routing.stats`."""
    from unimatmul.torch import scaled_routing

    return scaled_routing.stats()


def grouped_stats() -> dict[str, Any]:
    """Counts of routed ``torch._grouped_mm`` calls (MoE experts); see
    :func:`unimatmul.torch.grouped_routing.stats`."""
    from unimatmul.torch import grouped_routing

    return grouped_routing.stats()


def reset_stats() -> None:
    from unimatmul.torch import grouped_routing, routing, scaled_routing

    routing.reset_stats()
    scaled_routing.reset_stats()
    grouped_routing.reset_stats()


def clear_plans() -> None:
    """Forget every operand key's plan: the next calls ask the Selector again.

    Needed after another process tuned problems this one already resolved.
    """
    from unimatmul.torch import grouped_routing, routing, scaled_routing

    routing.clear_plans()
    scaled_routing.clear_plans()
    grouped_routing.clear_plans()


def plans() -> list[Plan]:
    from unimatmul.torch import routing

    return routing.plans()


def warmup(model: Any, example_inputs: Any, **options: Any) -> WarmupResult:
    """Run the model once and tune every problem it met; see :mod:`unimatmul.torch.model_tuning`."""
    from unimatmul.torch.model_tuning import warmup as run

    return run(model, example_inputs, **options)


def agree(**options: Any) -> Agreement:
    """With ``UNIMATMUL_DISTRIBUTED=1`` in a process group: settle, together with every
    rank, the choice of each problem met since the last call (collective: every rank calls
    it at the same point, e.g. a step boundary). See :mod:`unimatmul.tuning.agreement`."""
    from unimatmul.tuning.agreement import agree as run

    return run(**options)


def __getattr__(name: str) -> Any:
    if name == "WarmupResult":
        from unimatmul.torch.model_tuning import WarmupResult

        return WarmupResult
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


if wanted():
    enable()
