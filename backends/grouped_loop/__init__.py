"""The grouped-loop backend: a grouped GEMM as one dense GEMM per group.

Registered through the ``unimatmul`` entry-point group like any third-party plugin. It
offers one candidate for grouped problems with few groups (``backend.MAX_GROUPS``),
where a loop of the dense products each group needs, each sized for its own group, can
beat a grouped kernel that sizes its tiles for every group alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul.backend import hookimpl
from unimatmul_backends.grouped_loop.backend import GroupedLoopBackend

__all__ = ["GroupedLoopBackend", "unimatmul_register_backends"]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(GroupedLoopBackend())
