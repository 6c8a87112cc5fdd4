"""Files of other tools that unimatmul reads and writes.

Each format lives in its own module and is found here by name, lazily, so that the
CLI never imports a format it does not use. A command function takes the parsed
``argparse`` arguments and the output stream and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TextIO

Command = Callable[[argparse.Namespace, TextIO], int]

# format name -> "module:function"
IMPORTERS: dict[str, str] = {
    "tunableop": "unimatmul.interop.tunableop_cache:cmd_import",
}
EXPORTERS: dict[str, str] = {
    "tunableop": "unimatmul.interop.tunableop_cache:cmd_export",
    "json": "unimatmul.interop.json_export:cmd_export",
}


def _load(table: dict[str, str], name: str, what: str) -> Command:
    try:
        target = table[name]
    except KeyError:
        msg = f"unknown {what} format {name!r}; valid: {', '.join(sorted(table))}"
        raise LookupError(msg) from None
    module, _, function = target.partition(":")
    command: Command = getattr(importlib.import_module(module), function)
    return command


def importer(name: str) -> Command:
    return _load(IMPORTERS, name, "import")


def exporter(name: str) -> Command:
    return _load(EXPORTERS, name, "export")
