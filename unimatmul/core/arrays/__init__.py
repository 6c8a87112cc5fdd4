"""Array adapters: one face over NumPy arrays, torch tensors and CuPy arrays.

Dispatch is by the array's type, cached per type (:func:`adapter_of`), and each
library's adapter lives in a module of its own (``numpy``, ``torch``, ``cupy``) that
imports its library only when an array of it reaches it (so ``import unimatmul`` never
imports torch or cupy). The protocol and the registry are in ``adapter``; operands laid
out as a Problem says in ``operands``; runners held for CUDA graphs in ``graphs``.
Backends use adapters for pointers and devices; the harness uses them to make operands,
references and checks in the caller's own array kind.
"""

from __future__ import annotations

from unimatmul.core.arrays.adapter import (
    BY_TYPE,
    CPU,
    SCREEN_ELEMENTS,
    ArrayAdapter,
    Device,
    adapter_for_kind,
    adapter_of,
    host_available_bytes,
)
from unimatmul.core.arrays.cupy import CupyAdapter
from unimatmul.core.arrays.graphs import held_for_graphs, hold_for_graphs
from unimatmul.core.arrays.numpy import NumpyAdapter
from unimatmul.core.arrays.operands import Operands, make_operands, operand_bytes, operand_layouts
from unimatmul.core.arrays.torch import TorchAdapter, kept_torch_buffer

__all__ = [
    "BY_TYPE",
    "CPU",
    "SCREEN_ELEMENTS",
    "ArrayAdapter",
    "CupyAdapter",
    "Device",
    "NumpyAdapter",
    "Operands",
    "TorchAdapter",
    "adapter_for_kind",
    "adapter_of",
    "held_for_graphs",
    "hold_for_graphs",
    "host_available_bytes",
    "kept_torch_buffer",
    "make_operands",
    "operand_bytes",
    "operand_layouts",
]
