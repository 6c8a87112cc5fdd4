"""The backend SDK: everything a kernel source (built-in or third-party) needs, in one place.

A backend imports from here (or from ``unimatmul`` itself) and from nothing deeper, so
that the core can be reorganised without breaking plugins. What each name is:

* :class:`Backend`, :class:`Candidate`, :class:`Runner`, :class:`Target`,
  :data:`DEFAULT`, :class:`DefaultRunner`, :class:`NativeCall`: the protocol.
* :class:`Problem`, :func:`matrix_layout`: what a backend is asked to run;
  :func:`group_bounds` and :func:`plain_grouped_call` for grouped runners
  (``docs/grouped.md``).
* :class:`Device`, :class:`ArrayAdapter`, :func:`adapter_for_kind`,
  :func:`operand_layouts`, :func:`make_operands`: arrays of the caller's library;
  :func:`kept_torch_buffer` for a torch GPU buffer a runner keeps across calls.
* :data:`ITEMSIZE`, :func:`canonical`, :func:`tolerance`: dtype names and the numeric
  check's tolerance.
* :class:`UnsupportedProblem`, :class:`BackendUnavailable`, :class:`UnknownCandidate`:
  the errors of the protocol; :class:`NotReady` and :func:`prepare_deadline` for a
  ``prepare()`` that waits for work started ahead (a compile): past the problem's tuning
  cap it gives up, and the candidate is left out as capped.
* :class:`LRU`: a bounded map (for prepared descriptors and the like);
  :func:`default_cache_folder`: unimatmul's folder (``$XDG_CACHE_HOME/unimatmul``), where a
  backend keeps files of its own.
* :data:`hookimpl`: the marker of plugin hooks; :mod:`unimatmul.settings` for
  ``UNIMATMUL_*`` variables (a plugin declares its own there).

``unimatmul.testing`` has fake backends and a registration helper to test a backend
the way unimatmul's own tests do; the conformance suite (``unimatmul conformance``)
says whether a backend is right.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unimatmul.cache.lru import LRU
    from unimatmul.cache.protocol import default_cache_folder
    from unimatmul.core._backend import (
        DEFAULT,
        Backend,
        Candidate,
        NativeCall,
        Runner,
        Target,
        prepare_deadline,
    )
    from unimatmul.core.arrays import (
        ArrayAdapter,
        Device,
        adapter_for_kind,
        kept_torch_buffer,
        make_operands,
        operand_layouts,
    )
    from unimatmul.core.dtypes import ITEMSIZE, canonical, tolerance
    from unimatmul.core.errors import BackendUnavailable, NotReady, UnknownCandidate, UnsupportedProblem
    from unimatmul.core.grouped import group_bounds, plain_grouped_call
    from unimatmul.core.hookspecs import hookimpl
    from unimatmul.core.problem import Problem, matrix_layout
    from unimatmul.core.runners import DefaultRunner

# Public name -> the module that defines it, imported on first use (PEP 562): a compile
# process or a plugin's registration that needs one name does not import them all.
_EXPORTS: dict[str, str] = {
    "LRU": "unimatmul.cache.lru",
    "default_cache_folder": "unimatmul.cache.protocol",
    "DEFAULT": "unimatmul.core._backend",
    "Backend": "unimatmul.core._backend",
    "Candidate": "unimatmul.core._backend",
    "NativeCall": "unimatmul.core._backend",
    "Runner": "unimatmul.core._backend",
    "Target": "unimatmul.core._backend",
    "prepare_deadline": "unimatmul.core._backend",
    "ArrayAdapter": "unimatmul.core.arrays",
    "Device": "unimatmul.core.arrays",
    "adapter_for_kind": "unimatmul.core.arrays",
    "kept_torch_buffer": "unimatmul.core.arrays",
    "make_operands": "unimatmul.core.arrays",
    "operand_layouts": "unimatmul.core.arrays",
    "ITEMSIZE": "unimatmul.core.dtypes",
    "canonical": "unimatmul.core.dtypes",
    "tolerance": "unimatmul.core.dtypes",
    "BackendUnavailable": "unimatmul.core.errors",
    "NotReady": "unimatmul.core.errors",
    "UnknownCandidate": "unimatmul.core.errors",
    "UnsupportedProblem": "unimatmul.core.errors",
    "group_bounds": "unimatmul.core.grouped",
    "plain_grouped_call": "unimatmul.core.grouped",
    "hookimpl": "unimatmul.core.hookspecs",
    "Problem": "unimatmul.core.problem",
    "matrix_layout": "unimatmul.core.problem",
    "DefaultRunner": "unimatmul.core.runners",
}

__all__ = [
    "DEFAULT",
    "ITEMSIZE",
    "LRU",
    "ArrayAdapter",
    "Backend",
    "BackendUnavailable",
    "Candidate",
    "DefaultRunner",
    "Device",
    "NativeCall",
    "NotReady",
    "Problem",
    "Runner",
    "Target",
    "UnknownCandidate",
    "UnsupportedProblem",
    "adapter_for_kind",
    "canonical",
    "default_cache_folder",
    "group_bounds",
    "hookimpl",
    "kept_torch_buffer",
    "make_operands",
    "matrix_layout",
    "operand_layouts",
    "plain_grouped_call",
    "prepare_deadline",
    "tolerance",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
