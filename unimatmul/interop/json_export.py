"""``unimatmul cache export --format json``: the cache as plain JSON, for people and tools.

One document: the source file's header, then per namespace its platform facts and
every entry (``TuningRecord.to_dict()``), sorted. JSON has no infinity or NaN, so a
non-finite number is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``.
"""

from __future__ import annotations

import math
import time
from typing import Any

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
