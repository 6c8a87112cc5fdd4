"""Runners kept for the process's life because a CUDA/HIP graph captured one of their calls."""

from __future__ import annotations

import threading
from typing import Any

# Runners a CUDA graph may still use: one of their calls ran under capture, so a graph
# holds the addresses of their kept buffers (workspaces, padded copies) and writes there at
# every replay. Nothing says when that graph is gone, so they are kept for the process's
# life, whatever forgets them otherwise (a plan retired, a signature evicted). Freed, they
# let the compiled `generate` graphs of Hugging Face models, replayed later, write split-K
# sums and padded copies into memory that by then held other tensors.
_graph_held: dict[int, Any] = {}
_graph_held_lock = threading.Lock()


def hold_for_graphs(runner: Any) -> None:
    """Keep ``runner`` (and what it owns) for the process's life: a graph captured its call."""
    with _graph_held_lock:
        _graph_held.setdefault(id(runner), runner)


def held_for_graphs() -> int:
    """How many runners are kept for CUDA graphs (``unimatmul.torch.stats()`` shows it)."""
    return len(_graph_held)
