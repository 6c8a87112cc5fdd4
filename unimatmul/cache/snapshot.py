"""What one cache file holds once read: its header and namespaces, the entries of each kept
as encoded rows until asked for, and what could not be read."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from unimatmul.cache.columns import Blocks, Column, Tables
from unimatmul.cache.errors import BadEntry
from unimatmul.cache.record import TuningRecord
from unimatmul.cache.rows import decode_row

SCHEMA = 4


@dataclass
class Namespace:
    """The entries of one Platform: rows read from a file, plus records added since.

    Rows stay encoded until an entry is asked for; ``fresh`` holds records that no
    row on disk backs yet (put in this process, or merged from another file).
    """

    platform: dict[str, Any] = field(default_factory=dict)
    tables: Tables = field(default_factory=Tables)
    index: dict[str, int] = field(default_factory=dict)
    rows: Column | Blocks = field(default_factory=Column)
    fresh: dict[str, TuningRecord] = field(default_factory=dict)
    memo: dict[str, TuningRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index) + len(self.fresh)

    def __contains__(self, key: str) -> bool:
        return key in self.fresh or key in self.index

    def sorted_keys(self) -> list[str]:
        return sorted([*self.index, *self.fresh])

    def row(self, key: str) -> bytes | None:
        i = self.index.get(key)
        return None if i is None else self.rows[i]

    def get(self, key: str, *, memo: bool = True) -> TuningRecord | None:
        """The record for ``key``; BadEntry if its row is malformed."""
        found = self.fresh.get(key) or self.memo.get(key)
        if found is not None:
            return found
        row = self.row(key)
        if row is None:
            return None
        record = decode_row(key, row, self.tables)
        if memo:
            self.memo[key] = record
        return record

    def put(self, key: str, record: TuningRecord) -> None:
        self.index.pop(key, None)
        self.memo.pop(key, None)
        self.fresh[key] = record

    def delete(self, key: str) -> bool:
        self.memo.pop(key, None)
        gone = self.fresh.pop(key, None) is not None
        return self.index.pop(key, None) is not None or gone


@dataclass
class Snapshot:
    """What one cache file holds: its header and its namespaces, and what was wrong with it.

    ``bad``: entries that could not be read while loading (schema 1), as (ns, key, why).
    ``damage``: parts of the file that were lost (a block whose checksum failed, an outer
    structure that no longer parses), each a sentence; ``lost`` counts the entries they
    held where that is known. ``problems``: fields that were dropped (fields.py).
    ``unreadable``: why nothing at all could be read (the store's empty stand-in).
    ``carried``: intact frames this reader could not use (a namespace whose description
    it cannot read, and that namespace's blocks), written again byte for byte by every
    rewrite; ``unread`` says what they are, a sentence each.
    """

    header: dict[str, Any] = field(default_factory=dict)
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    schema: int = SCHEMA
    bad: list[tuple[str, str, str]] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)
    lost: int = 0
    problems: list[str] = field(default_factory=list)
    unreadable: str = ""
    carried: list[tuple[int, bytes]] = field(default_factory=list)  # (namespace number, frame)
    unread: list[str] = field(default_factory=list)

    @property
    def damaged(self) -> bool:
        """Whether rewriting this file would drop something that is in it now (what is
        carried is not dropped)."""
        return bool(self.damage or self.unreadable or self.bad)

    def count(self) -> int:
        return sum(len(ns) for ns in self.namespaces.values())

    def namespace(self, name: str) -> Namespace:
        found = self.namespaces.get(name)
        if found is None:
            found = self.namespaces[name] = Namespace()
        return found

    def get(self, namespace: str, key: str) -> TuningRecord | None:
        found = self.namespaces.get(namespace)
        return found.get(key) if found is not None else None


def iter_records(
    snapshot: Snapshot, namespace: str | None = None
) -> Iterator[tuple[str, str, TuningRecord | BadEntry]]:
    """Every (namespace, key, record or the BadEntry error), sorted, without memoising."""
    for name in sorted(snapshot.namespaces):
        if namespace is not None and name != namespace:
            continue
        ns = snapshot.namespaces[name]
        for key in ns.sorted_keys():
            try:
                record = ns.get(key, memo=False)
            except BadEntry as exc:
                yield name, key, exc
                continue
            if record is not None:
                yield name, key, record


def compact(snapshot: Snapshot) -> tuple[Snapshot, list[tuple[str, str, str]]]:
    """A copy whose tables hold only what its entries use; entries that fail to decode are dropped."""
    out = Snapshot(header=dict(snapshot.header), schema=SCHEMA)
    out.carried, out.unread = list(snapshot.carried), list(snapshot.unread)
    dropped: list[tuple[str, str, str]] = []
    for name, ns in snapshot.namespaces.items():
        target = out.namespace(name)
        target.platform = dict(ns.platform)
        target.fresh = compact_namespace(name, ns, dropped)
    return out, dropped


def compact_namespace(
    name: str, ns: Namespace, dropped: list[tuple[str, str, str]]
) -> dict[str, TuningRecord]:
    """Every entry of ``ns`` decoded (to be encoded against fresh tables); failures go to ``dropped``."""
    records: dict[str, TuningRecord] = {}
    for key in ns.sorted_keys():
        try:
            record = ns.get(key, memo=False)
        except BadEntry as exc:
            dropped.append((name, key, str(exc)))
            continue
        if record is not None:
            records[key] = record
    return records
