"""``unimatmul cache ...``: inspect, check, merge, prune, import and export the cache.

``verify`` prints a checksum of the entries (SHA-256 of a canonical form, independent
of compression and header times) to pin a deployed cache; it exits 1 when the file
or any entry cannot be read, or when ``--expect`` does not match.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path
from typing import Any, TextIO

from unimatmul import settings
from unimatmul.cache.codec import BadEntry, CacheFileError, Snapshot, compact, content_digest, iter_records
from unimatmul.cache.file_store import MsgpackFileStore, faster, read_file, record_signature
from unimatmul.cache.protocol import open_store
from unimatmul.cli import interop, output
from unimatmul.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, CliError, fmt_us
from unimatmul.core.backend import Target
from unimatmul.tuning import confirm
from unimatmul.tuning.selector import Selector


def _date(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or not seconds:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _selector_for(path: Path, args: argparse.Namespace, *, read_only: bool) -> tuple[Selector, Target]:
    """A Selector over this cache file and the Target ``--array``/``--device`` name, for
    validating entries against the libraries here."""
    store = MsgpackFileStore(path, read_only=read_only, quarantine=False, autoflush=0)
    return Selector(store=store), output.target(args.array, args.device)


# --- show / path -----------------------------------------------------------------------


def cmd_cache_show(args: argparse.Namespace, out: TextIO) -> int:
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
            [
                key,
                record.winner,
                fmt_us(record.winner_s),
                fmt_us(record.default_s),
                f"{record.speedup:.2f}x",
                confirm.describe(record),
            ]
        )
    for ns, rows in by_ns.items():
        out.write(f"\n[{ns}]\n")
        output.table(rows, ["problem", "winner", "us", "default us", "speedup", "in situ"], out)
    return EXIT_OK


def cmd_cache_path(args: argparse.Namespace, out: TextIO) -> int:
    out.write(open_store(args.cache).location + "\n")
    return EXIT_OK


# --- stats -----------------------------------------------------------------------------


def cmd_cache_stats(args: argparse.Namespace, out: TextIO) -> int:
    path = output.cache_path(args)
    store = MsgpackFileStore(path, read_only=True, quarantine=False)
    snapshot = store.snapshot()
    size = path.stat().st_size if path.exists() else 0
    namespaces: list[dict[str, Any]] = []
    bad = 0
    for name in sorted(snapshot.namespaces):
        ns = snapshot.namespaces[name]
        if not len(ns):
            continue
        dates: list[float] = []
        winners: dict[str, int] = {}
        for _, _, record in iter_records(snapshot, name):
            if isinstance(record, BadEntry):
                bad += 1
                continue
            dates.append(record.tuned_at)
            backend = record.winner.partition("/")[0]
            winners[backend] = winners.get(backend, 0) + 1
        namespaces.append(
            {
                "namespace": name,
                "entries": len(ns),
                "platform": ns.platform,
                "oldest": min(dates, default=0.0),
                "newest": max(dates, default=0.0),
                "winners_by_backend": dict(sorted(winners.items())),
                "tables": {"strings": len(ns.tables.strings), "maps": len(ns.tables.maps)},
            }
        )
    parent = path.parent
    leftovers = sorted(p.name for p in parent.glob(f".{path.name}.*.tmp")) if parent.is_dir() else []
    corrupt = sorted(p.name for p in parent.glob(f"{path.name}.corrupt-*")) if parent.is_dir() else []
    count = snapshot.count()
    data: dict[str, Any] = {
        "path": str(path),
        "exists": path.exists(),
        "file_bytes": size,
        "bytes_per_entry": round(size / count, 1) if count else None,
        "schema": snapshot.schema,
        "header": snapshot.header,
        "entries": count,
        "bad_entries": bad,
        "namespaces": namespaces,
        "problems": store.problems,
        "temp_files": leftovers,
        "corrupt_copies": corrupt,
        "read_only_env": settings.CACHE_READONLY.raw() or "",
    }
    if args.validate:
        selector, target = _selector_for(path, args, read_only=True)
        data["validation"] = selector.validate(target).to_dict()
    if args.json:
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return EXIT_OK
    out.write(f"cache:    {path}\n")
    if not path.exists():
        out.write("file:     none yet (it is created by the first tuning)\n")
    else:
        header = snapshot.header
        per = f", {data['bytes_per_entry']} bytes per entry" if count else ""
        out.write(f"file:     {_size(size)}{per}, schema {snapshot.schema}, by {header.get('writer', '?')}\n")
        out.write(
            f"dates:    created {_date(header.get('created'))}, updated {_date(header.get('updated'))}\n"
        )
    out.write(
        f"entries:  {count} in {len(namespaces)} namespace(s)" + (f", {bad} unreadable" if bad else "") + "\n"
    )
    for info in namespaces:
        libs = ", ".join(f"{k} {v}" for k, v in sorted(info["platform"].get("libraries", {}).items()))
        out.write(f"\n[{info['namespace']}]\n")
        out.write(
            f"  entries:   {info['entries']}, tuned {_date(info['oldest'])} .. {_date(info['newest'])}\n"
        )
        out.write(f"  winners:   {', '.join(f'{k} {v}' for k, v in info['winners_by_backend'].items())}\n")
        if libs:
            out.write(f"  libraries: {libs}\n")
    for line in store.problems:
        out.write(f"problem:  {line}\n")
    if leftovers:
        out.write(f"temp files of interrupted writers: {len(leftovers)} (removed by the next write)\n")
    if corrupt:
        out.write(f"broken files moved aside: {', '.join(corrupt)}\n")
    if "validation" in data:
        v = data["validation"]
        out.write(
            f"\nvalidation of [{v['namespace']}] against the libraries here: {v['matched']} matched, "
            f"{v['revalidated']} revalidated, {v['invalidated']} invalidated (retuned on demand; "
            f"`cache prune --invalid` removes them)\n"
        )
    return EXIT_OK


# --- verify ----------------------------------------------------------------------------


def cmd_cache_verify(args: argparse.Namespace, out: TextIO) -> int:
    path = output.cache_path(args)
    if not path.exists():
        out.write(f"no cache file at {path}\n")
        return EXIT_UNAVAILABLE
    try:
        snapshot = read_file(path)
    except (CacheFileError, OSError) as exc:
        out.write(f"INVALID {path}: {exc}\n")
        return EXIT_ERROR
    bad = [(ns, key, str(r)) for ns, key, r in iter_records(snapshot) if isinstance(r, BadEntry)]
    bad += snapshot.bad
    digest = content_digest(snapshot)
    result: dict[str, Any] = {
        "path": str(path),
        "valid": not bad,
        "schema": snapshot.schema,
        "entries": snapshot.count(),
        "namespaces": len([n for n in snapshot.namespaces.values() if len(n)]),
        "bad_entries": [{"namespace": ns, "key": key, "why": why} for ns, key, why in bad],
        "sha256": digest,
    }
    code = EXIT_OK if not bad else EXIT_ERROR
    if args.expect is not None:
        result["expected"] = args.expect
        result["matches"] = args.expect.lower() == digest
        if not result["matches"]:
            code = EXIT_ERROR
    if args.validate:
        selector, target = _selector_for(path, args, read_only=True)
        result["validation"] = selector.validate(target).to_dict()
    if args.json:
        json.dump(result, out, indent=2)
        out.write("\n")
        return code
    state = "ok" if not bad else f"{len(bad)} unreadable entries"
    out.write(
        f"{state}: {result['entries']} entries in {result['namespaces']} namespace(s), schema {snapshot.schema}\n"
    )
    for ns, key, why in bad[:20]:
        out.write(f"  bad entry [{ns}] {key}: {why}\n")
    out.write(f"sha256 {digest}\n")
    if "matches" in result:
        out.write(
            "matches the expected checksum\n" if result["matches"] else f"MISMATCH: expected {args.expect}\n"
        )
    if "validation" in result:
        v = result["validation"]
        out.write(
            f"validation of [{v['namespace']}]: {v['matched']} matched, {v['revalidated']} revalidated, "
            f"{v['invalidated']} invalidated\n"
        )
    return code


# --- merge -----------------------------------------------------------------------------


def cmd_cache_merge(args: argparse.Namespace, out: TextIO) -> int:
    merged = Snapshot()
    conflicts = 0
    skipped = 0
    total = 0
    for name in args.inputs:
        if not Path(name).exists():
            raise CliError(f"no cache file at {name}", EXIT_UNAVAILABLE)
        try:
            snapshot = read_file(Path(name))
        except (CacheFileError, OSError) as exc:
            raise CliError(f"cannot read {name}: {exc}", EXIT_UNAVAILABLE) from exc
        for ns_name, ns in snapshot.namespaces.items():
            if ns.platform:
                merged.namespace(ns_name).platform.update(ns.platform)
        for ns_name, key, record in iter_records(snapshot):
            if isinstance(record, BadEntry):
                skipped += 1
                continue
            total += 1
            target = merged.namespace(ns_name)
            mine = target.fresh.get(key)
            if mine is not None:
                conflicts += 1
                record = faster(mine, record)
            target.fresh[key] = record
        skipped += len(snapshot.bad)
    output = Path(args.output)
    store = MsgpackFileStore(output, read_only=False, quarantine=False)
    try:
        store.rewrite(lambda _disk: merged)
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc}", EXIT_ERROR) from exc
    out.write(
        f"merged {total} entries from {len(args.inputs)} files into {output}: {merged.count()} entries, "
        f"{conflicts} keys in several files (the faster record kept)"
        + (f", {skipped} unreadable entries skipped" if skipped else "")
        + "\n"
    )
    return EXIT_OK


# --- prune -----------------------------------------------------------------------------


def cmd_cache_prune(args: argparse.Namespace, out: TextIO) -> int:
    if args.older_than is None and not args.namespace and not args.invalid and not args.bad:
        raise CliError("nothing to prune: give --older-than DAYS, --namespace NS, --invalid or --bad")
    path = output.cache_path(args)
    if not path.exists():
        out.write(f"no cache file at {path}\n")
        return EXIT_OK
    invalid: dict[tuple[str, str], Any] = {}
    if args.invalid:
        selector, target = _selector_for(path, args, read_only=True)
        summary = selector.validate(target)
        for key in summary.invalidated:
            record = selector.store.get(summary.namespace, key)
            invalid[(summary.namespace, key)] = record_signature(record)
    cutoff = time.time() - args.older_than * 86400 if args.older_than is not None else None
    drop_ns = set(args.namespace or [])
    removed: list[tuple[str, str, str]] = []

    def change(disk: Snapshot) -> Snapshot:
        removed.clear()
        for ns_name, key, record in list(iter_records(disk)):
            why = ""
            if ns_name in drop_ns:
                why = "namespace"
            elif isinstance(record, BadEntry):
                why = "unreadable" if args.bad else ""
            elif cutoff is not None and record.tuned_at < cutoff:
                why = f"tuned {_date(record.tuned_at)}"
            elif invalid.get((ns_name, key), "none") == record_signature(record):
                why = "invalid here"
            if why:
                removed.append((ns_name, key, why))
                disk.namespaces[ns_name].delete(key)
        # Rewritten with tables holding only what the remaining entries use.
        fresh, dropped = compact(disk)
        if args.bad:
            removed.extend((ns, key, "unreadable") for ns, key, _ in dropped)
        return fresh

    if args.dry_run:
        change(read_file(path))
        verb = "would remove"
    else:
        store = MsgpackFileStore(path, read_only=False, quarantine=False)
        try:
            store.rewrite(change)
        except OSError as exc:
            raise CliError(f"cannot write {path}: {exc}", EXIT_ERROR) from exc
        verb = "removed"
    reasons: dict[str, int] = {}
    for _, _, why in removed:
        kind = why.split(" ")[0]
        reasons[kind] = reasons.get(kind, 0) + 1
    detail = ", ".join(f"{n} {k}" for k, n in sorted(reasons.items()))
    out.write(f"{verb} {len(removed)} entries from {path}" + (f" ({detail})" if detail else "") + "\n")
    if args.verbose:
        for ns_name, key, why in removed:
            out.write(f"  [{ns_name}] {key}: {why}\n")
    return EXIT_OK


# --- import / export -------------------------------------------------------------------


def cmd_cache_import(args: argparse.Namespace, out: TextIO) -> int:
    """``cache import FORMAT FILE``: the command of that format (:mod:`unimatmul.cli.interop`)."""
    return interop.find(interop.IMPORTERS, args.format, "import")(args, out)


def cmd_cache_export(args: argparse.Namespace, out: TextIO) -> int:
    """``cache export --format FORMAT -o FILE``: likewise."""
    return interop.find(interop.EXPORTERS, args.format, "export")(args, out)


# --- parser ----------------------------------------------------------------------------


def add_command(sub: Any) -> None:
    p = sub.add_parser("cache", help="inspect, check, merge, prune, import and export the cache")
    cache_sub = p.add_subparsers(dest="cache_command", required=True)

    def common(c: argparse.ArgumentParser) -> None:
        c.add_argument("--cache", default=None, help="cache file (default: $UNIMATMUL_CACHE or the user's)")

    def target(c: argparse.ArgumentParser) -> None:
        c.add_argument("--array", default="numpy", choices=["numpy", "torch", "cupy"], help="for validation")
        c.add_argument("--device", default="cpu", help="for validation: cpu, cuda[:N] or hip[:N]")

    c = cache_sub.add_parser("show", help="list the entries")
    common(c)
    c.add_argument("--namespace", default=None, help="only this platform namespace")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache_show)

    c = cache_sub.add_parser("path", help="print the cache file's path")
    common(c)
    c.set_defaults(func=cmd_cache_path)

    c = cache_sub.add_parser("stats", help="size, entries per namespace, dates, problems")
    common(c)
    target(c)
    c.add_argument(
        "--validate", action="store_true", help="check entries against the libraries installed here"
    )
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache_stats)

    c = cache_sub.add_parser("verify", help="check every entry and print a checksum to pin")
    common(c)
    target(c)
    c.add_argument("--expect", metavar="SHA256", default=None, help="fail unless the checksum is this")
    c.add_argument("--validate", action="store_true", help="also check entries against the libraries here")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cache_verify)

    c = cache_sub.add_parser("merge", help="merge cache files into one (the faster record wins)")
    c.add_argument("inputs", nargs="+", metavar="FILE", help="cache files to merge")
    c.add_argument("-o", "--output", required=True, help="file to write (replaced atomically)")
    c.set_defaults(func=cmd_cache_merge)

    c = cache_sub.add_parser("prune", help="remove entries by age, namespace, or validity; compacts")
    common(c)
    target(c)
    c.add_argument("--older-than", type=float, metavar="DAYS", default=None, help="tuned more than DAYS ago")
    c.add_argument("--namespace", action="append", metavar="NS", help="a whole namespace (repeatable)")
    c.add_argument("--invalid", action="store_true", help="winners that no longer exist or check here")
    c.add_argument("--bad", action="store_true", help="entries that cannot be read")
    c.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    c.add_argument("-v", "--verbose", action="store_true", help="list every removed entry")
    c.set_defaults(func=cmd_cache_prune)

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
    c.add_argument("-o", "--output", required=True, help="file to write ('-': standard output for json)")
    c.add_argument("--namespace", default=None, help="only this platform namespace")
    c.set_defaults(func=cmd_cache_export)
