"""``unimatmul cache import FORMAT FILE`` and ``cache export --format FORMAT -o FILE``.

The formats themselves live in :mod:`unimatmul.interop` and return data; these
commands read and write the files, choose namespaces with what this machine knows
(the GPU torch sees), and report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from unimatmul import settings
from unimatmul.cache.errors import CacheWriteError
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.protocol import CacheStore, MemoryStore
from unimatmul.cache.record import TuningRecord
from unimatmul.cli import output
from unimatmul.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, CliError
from unimatmul.core._backend import Target
from unimatmul.core.arrays import Device, adapter_for_kind
from unimatmul.core.text_input import InputFileError
from unimatmul.interop import json_export
from unimatmul.interop.tunableop import TunableOpValidators, parse, write
from unimatmul.interop.tunableop_cache import (
    choose_validators,
    entries_of,
    namespace_for_export,
    namespace_for_import,
    rows_of,
)
from unimatmul.tuning.selector import get_selector

if TYPE_CHECKING:
    from unimatmul.core.platform import Platform

Command = Callable[[argparse.Namespace, TextIO], int]


def current_gpu_platform() -> Platform | None:
    """The Platform of the GPU torch uses now, or None (no torch, no GPU, any failure)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        kind = "hip" if getattr(torch.version, "hip", None) else "cuda"
        target = Target(adapter_for_kind("torch"), Device(kind, torch.cuda.current_device()))
        return get_selector().platform(target)
    except Exception:
        return None


def current_cpu_platform() -> Platform | None:
    """The Platform of torch tensors on this CPU, or None (no torch, any failure): where a
    TunableOp file that names no GPU goes on a machine where torch sees none."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    try:
        return get_selector().platform(Target(adapter_for_kind("torch"), Device("cpu", 0)))
    except Exception:
        return None


def current_platform() -> Platform | None:
    """The GPU torch uses now, else torch on this CPU (None without torch)."""
    return current_gpu_platform() or current_cpu_platform()


def reader(args: argparse.Namespace) -> CacheStore:
    """The cache a reading command looks at: a store that never writes (``--cache
    :memory:`` is an empty one). Shared with :mod:`unimatmul.cli.cache`."""
    if _in_memory(args):
        return MemoryStore()
    return MsgpackFileStore(output.cache_path(args), read_only=True)


def _in_memory(args: argparse.Namespace) -> bool:
    text = getattr(args, "cache", None)
    return text == ":memory:" or (text is None and settings.CACHE.get() == ":memory:")


def _writer(args: argparse.Namespace) -> CacheStore:
    """The cache an importing command writes, holding its records until one strict flush."""
    if _in_memory(args):
        return MemoryStore()
    return MsgpackFileStore(output.cache_path(args), autoflush=0)


def _put_all(store: CacheStore, namespace: str, entries: dict[str, TuningRecord]) -> None:
    put_many = getattr(store, "put_many", None)
    if put_many is not None:
        put_many({(namespace, key): record for key, record in entries.items()})
        return
    for key, record in entries.items():
        store.put(namespace, key, record)


def import_tunableop(args: argparse.Namespace, out: TextIO) -> int:
    """``cache import tunableop FILE.csv [--namespace NS] [--replace]``."""
    try:
        parsed = parse(Path(args.file))
    except InputFileError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc}", EXIT_UNAVAILABLE) from exc
    except ValueError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    requested = getattr(args, "namespace", None)
    try:
        namespace = namespace_for_import(
            parsed.validators, requested, None if requested else current_platform()
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    result = entries_of(parsed)
    store = _writer(args)
    replace = bool(getattr(args, "replace", False))
    kept = {key for key in result.entries if not replace and store.get(namespace, key) is not None}
    new = {key: record for key, record in result.entries.items() if key not in kept}
    _put_all(store, namespace, new)
    try:
        store.flush(strict=True)  # a command whose job is to write says when it could not
    except CacheWriteError as exc:
        raise CliError(str(exc), EXIT_ERROR) from exc

    shown = ", ".join(f"{k}={v}" for k, v in parsed.validators.items()) or "none"
    out.write(f"read {args.file}: {output.plural(result.rows, 'row')}; validators: {shown}\n")
    out.write(f"imported {output.entries(len(new))} into {namespace} ({store.location})\n")
    if kept:
        out.write(
            f"kept {output.plural(len(kept), 'existing entry', 'existing entries')} (--replace overwrites them)\n"
        )
    if result.skipped:
        out.write(f"skipped {output.plural(len(result.skipped), 'row')}:\n")
        for line, reason in result.skipped:
            out.write(f"  line {line}: {reason}\n")
    return EXIT_OK


def export_tunableop(args: argparse.Namespace, out: TextIO) -> int:
    """``cache export --format tunableop -o FILE.csv [--namespace NS]``."""
    store = reader(args)
    output.check_writable(args.output, "-o")
    current = current_platform()
    try:
        namespace = namespace_for_export(
            (ns for ns, _, _ in store.items()), getattr(args, "namespace", None), current
        )
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    entries = [(key, record) for _, key, record in store.items(namespace)]
    try:
        validators, source = choose_validators(namespace, [r for _, r in entries], current)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    result = rows_of(entries, validators)
    try:
        write(args.output, TunableOpValidators(validators), result.rows)
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc}", EXIT_ERROR) from exc
    out.write(f"wrote {output.plural(len(result.rows), 'row')} of {namespace} to {args.output}\n")
    out.write(f"validators ({source}): {', '.join(f'{k}={v}' for k, v in validators.items())}\n")
    if result.skipped:
        out.write(f"skipped {output.entries(sum(result.skipped.values()))}:\n")
        for reason, count in result.skipped.most_common():
            out.write(f"  {count} x {reason}\n")
    return EXIT_OK


def export_json(args: argparse.Namespace, out: TextIO) -> int:
    """``cache export --format json -o FILE`` (``-o -``: standard output)."""
    path = output.cache_path(args)
    store = MsgpackFileStore(path, read_only=True)
    document = json_export.export_document(store, args.namespace)
    count = sum(len(ns["entries"]) for ns in document["namespaces"].values())
    if args.output == "-":
        json.dump(document, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
        return EXIT_OK
    output.check_writable(args.output, "-o")
    try:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(document, fh, indent=1, allow_nan=False)
            fh.write("\n")
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc}", EXIT_ERROR) from exc
    out.write(f"exported {output.entries(count)} from {path} to {args.output}\n")
    return EXIT_OK


IMPORTERS: dict[str, Command] = {"tunableop": import_tunableop}
EXPORTERS: dict[str, Command] = {"tunableop": export_tunableop, "json": export_json}


def find(table: dict[str, Command], name: str, what: str) -> Command:
    try:
        return table[name]
    except KeyError:
        msg = f"unknown {what} format {name!r}; valid: {', '.join(sorted(table))}"
        raise CliError(msg) from None
