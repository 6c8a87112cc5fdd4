"""``unimatmul cache export --format json``: the cache as plain JSON, for people and tools.

One document: the source file's header, then per namespace its platform facts and
every entry (``TuningRecord.to_dict()``), sorted. JSON has no infinity or NaN, so a
non-finite number is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, TextIO

FORMAT = "unimatmul-cache-json"
SCHEMA = 2


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def export_document(store: Any, namespace: str | None = None) -> dict[str, Any]:
    """The JSON document of a store (a MsgpackFileStore or any CacheStore)."""
    platforms: dict[str, dict[str, Any]] = {}
    header: dict[str, Any] = {}
    if hasattr(store, "namespaces"):
        platforms = store.namespaces()
        header = dict(store.snapshot().header)
    namespaces: dict[str, dict[str, Any]] = {}
    for ns, key, record in store.items(namespace):
        entry = namespaces.setdefault(ns, {"platform": platforms.get(ns, {}), "entries": {}})
        entry["entries"][key] = record.to_dict()
    return _plain(
        {
            "format": FORMAT,
            "schema": SCHEMA,
            "source": store.location,
            "exported": time.time(),
            "header": header,
            "namespaces": namespaces,
        }
    )


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from unimatmul.cache.file_store import MsgpackFileStore
    from unimatmul.cli import EXIT_OK
    from unimatmul.cli.cache import cache_path

    path = cache_path(args)
    store = MsgpackFileStore(path, read_only=True, quarantine=False)
    document = export_document(store, args.namespace)
    count = sum(len(ns["entries"]) for ns in document["namespaces"].values())
    if args.output == "-":
        json.dump(document, sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
        return EXIT_OK
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=1, allow_nan=False)
        fh.write("\n")
    out.write(f"exported {count} entries from {path} to {args.output}\n")
    return EXIT_OK
