"""``unimatmul cache ...``: inspect, import and export the cache."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from unimatmul.cli import EXIT_OK, CliError, _fmt_us, _table


def cmd_cache_show(args: argparse.Namespace, out: TextIO) -> int:
    from unimatmul.cache import open_store

    store = open_store(args.cache)
    items = list(store.items(args.namespace))
    if args.json:
        json.dump([{"namespace": ns, "key": k, **r.to_dict()} for ns, k, r in items], out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"cache: {store.location} ({len(items)} entries)\n")
    by_ns: dict[str, list[list[str]]] = {}
    for ns, key, record in items:
        by_ns.setdefault(ns, []).append(
            [key, record.winner, _fmt_us(record.winner_s), _fmt_us(record.default_s), f"{record.speedup:.2f}x"]
        )
    for ns, rows in by_ns.items():
        out.write(f"\n[{ns}]\n")
        _table(rows, ["problem", "winner", "us", "default us", "speedup"], out)
    return EXIT_OK


def cmd_cache_path(args: argparse.Namespace, out: TextIO) -> int:
    from unimatmul.cache import open_store

    out.write(open_store(args.cache).location + "\n")
    return EXIT_OK


def cmd_cache_import(args: argparse.Namespace, out: TextIO) -> int:
    """``cache import FORMAT FILE``: delegate to the interop module of that format."""
    from unimatmul.interop import importer

    try:
        run = importer(args.format)
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    code: int = run(args, out)
    return code


def cmd_cache_export(args: argparse.Namespace, out: TextIO) -> int:
    from unimatmul.interop import exporter

    try:
        run = exporter(args.format)
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    code: int = run(args, out)
    return code


def add_cache_commands(sub: Any) -> None:
    p = sub.add_parser("cache", help="inspect, import and export the cache")
    cache_sub = p.add_subparsers(dest="cache_command", required=True)

    def common(c: argparse.ArgumentParser) -> None:
        c.add_argument("--cache", default=None, help="cache file (default: $UNIMATMUL_CACHE or the user's)")

    c = cache_sub.add_parser("show", help="list the entries")
    common(c)
    c.add_argument("--namespace", default=None, help="only this platform namespace")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache_show)

    c = cache_sub.add_parser("path", help="print the cache file's path")
    common(c)
    c.set_defaults(func=cmd_cache_path)

    c = cache_sub.add_parser("import", help="import another tool's results (e.g. tunableop FILE.csv)")
    common(c)
    c.add_argument("format", help="file format, e.g. tunableop")
    c.add_argument("file", help="the file to read")
    c.add_argument("--namespace", default=None, help="namespace to import into (default: this GPU's)")
    c.add_argument("--replace", action="store_true", help="overwrite entries the cache already holds")
    c.set_defaults(func=cmd_cache_import)

    c = cache_sub.add_parser("export", help="write the cache in another format")
    common(c)
    c.add_argument("--format", required=True, help="json or tunableop")
    c.add_argument("-o", "--output", required=True, help="file to write")
    c.add_argument("--namespace", default=None, help="only this platform namespace")
    c.set_defaults(func=cmd_cache_export)
