"""The hooks a unimatmul plugin implements. Every hook is prefixed ``unimatmul_``.

Hooks register; the core decides. Each hook is handed a ``register`` callable and
returns nothing, so a plugin never needs to know what other plugins did.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

import pluggy

if TYPE_CHECKING:
    from unimatmul.core._backend import Backend

PROJECT = "unimatmul"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def unimatmul_register_backends(register: Callable[[Backend], None]) -> None:
    """Register kernel sources: call ``register(backend)`` once per Backend instance.

    Called once, when the plugin manager first loads. A backend whose vendor library
    is missing still registers and reports why through ``availability()``; import the
    vendor library lazily, never at module import.
    """


@hookspec
def unimatmul_register_presets(register: Callable[[str, str, Sequence[str]], None]) -> None:
    """Register named shape suites: ``register(name, description, shapes)``.

    ``shapes`` are ``MxNxK`` or ``BxMxNxK`` strings (dtype given by the caller), as
    ``unimatmul tune --preset NAME`` uses them.
    """


@hookspec
def unimatmul_register_commands(
    register: Callable[
        [str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace, TextIO], int]],
        None,
    ],
) -> None:
    """Add ``unimatmul`` subcommands: ``register(name, help, configure, run)``.

    ``configure(parser)`` adds the command's arguments; ``run(args, out)`` does the work,
    writes to ``out`` and returns the exit code (0 success, 1 failure, 2 bad usage, 3
    nothing could be done here). To end with a message, raise
    :class:`unimatmul.core.errors.CommandError` (message, code). A name the CLI already
    has, or that another plugin registered first, is refused.
    """
