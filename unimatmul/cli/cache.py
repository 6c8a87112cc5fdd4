"""``unimatmul cache ...``: inspect, check, merge, prune, recover, import and export the cache.

Reading commands (``show``, ``stats``, ``verify``, ``export``, ``path``, ``prune
--dry-run``) never change a file, whatever state it is in. Writing commands (``merge``,
``prune``, ``recover``, ``import``) honour ``UNIMATMUL_CACHE_READONLY`` and keep a copy
of a damaged file before they replace it (``<name>.corrupt-<time>``).

Exit codes (:mod:`unimatmul.cli.output`): 0 done; 1 a write that failed (a read-only
cache, a folder that cannot be written, a lock held too long) or an unexpected error, and
for ``verify`` a file that is damaged or does not match ``--expect``; 2 bad usage; 3
nothing could be done here (no such file, a file that cannot be read at all, something
that is not a regular file). ``verify`` prints a checksum of the entries (SHA-256 of a
canonical form, independent of schema, compression and header times) to pin a deployed
cache.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from pathlib import Path
from typing import Any, TextIO

from unimatmul import settings
from unimatmul.cache.codec import BadEntry, CacheFileError, Snapshot, compact, content_digest, iter_records
from unimatmul.cache.errors import CacheWriteError, NotRegularFile
from unimatmul.cache.fields import is_date
from unimatmul.cache.file_store import MsgpackFileStore, faster, kept_copies, read_file, record_signature
from unimatmul.cache.record import mark_from_elsewhere
from unimatmul.cli import interop, output
from unimatmul.cli.interop import reader
from unimatmul.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, CliError, entries, fmt_us, plural
from unimatmul.core._backend import Target
from unimatmul.core.notices import size_text
from unimatmul.tuning import confirm
from unimatmul.tuning.harness import LOW
from unimatmul.tuning.selector import Selector


def _date(seconds: Any) -> str:
    if not is_date(seconds) or not seconds:
        return "-"
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _read_or_exit(path: Path, *, verify: bool = True, recovering: bool = False) -> Snapshot:
    """The snapshot of a file a command was given; CliError (exit 3) when there is none or
    nothing in it can be read (``recovering``: by ``cache recover`` itself)."""
    if not path.exists() and not path.is_symlink():
        raise CliError(f"no cache file at {path}", EXIT_UNAVAILABLE)
    try:
        return read_file(path, verify=verify)
    except NotRegularFile as exc:
        raise CliError(f"{path}: {exc}", EXIT_UNAVAILABLE) from exc
    except (CacheFileError, OSError) as exc:
        raise _unreadable(path, exc, recovering=recovering) from exc


def _unreadable(path: Path, exc: Exception, *, recovering: bool = False) -> CliError:
    if recovering:
        hint = "nothing in it can be salvaged: it is not a unimatmul cache file, or every entry is damaged"
        if "checksum" in str(exc):
            hint += " (`--unverified` also reads a schema 2 body whose checksum fails)"
        return CliError(f"{path} cannot be read ({exc}); {hint}", EXIT_UNAVAILABLE)
    return CliError(
        f"{path} cannot be read ({exc}); it is left in place "
        f"(`unimatmul cache recover {path}` salvages what can be read of a damaged file)",
        EXIT_UNAVAILABLE,
    )


def _write(store: MsgpackFileStore, change: Any) -> Snapshot:
    """``store.rewrite(change)``, a refused or failed write becoming exit 1 with its reason
    (and a file found unreadable under the lock, exit 3)."""
    try:
        new: Snapshot = store.rewrite(change)
    except CacheWriteError as exc:
        raise CliError(str(exc), EXIT_ERROR) from exc
    except CacheFileError as exc:
        raise _unreadable(store.path, exc) from exc
    return new


def _refuse_unreadable(disk: Snapshot) -> None:
    """Inside a rewrite: a command that edits entries never replaces a file it could not read."""
    if disk.unreadable:
        raise CacheFileError(disk.unreadable)


def _damage_lines(snapshot: Snapshot, limit: int = 5) -> list[str]:
    lines = [f"damage:   {line}" for line in snapshot.damage[:limit]]
    if len(snapshot.damage) > limit:
        lines.append(f"damage:   ... and {len(snapshot.damage) - limit} more")
    if snapshot.damage:
        lost = entries(snapshot.lost) if snapshot.lost else "an unknown number of entries"
        lines.append(f"damage:   {lost} could not be read; the rest can")
    return lines


def _selector_for(path: Path, args: argparse.Namespace) -> tuple[Selector, Target]:
    """A read-only Selector over this cache file and the Target ``--array``/``--device``
    name, for validating entries against the libraries here."""
    store = MsgpackFileStore(path, read_only=True, autoflush=0)
    return Selector(store=store), output.target(args.array, args.device)


def _validation_counts(v: dict[str, Any]) -> str:
    return (
        f"{v['matched']} matched, {v['revalidated']} revalidated, {v['invalidated']} invalidated, "
        f"{v['unavailable']} not available here"
    )


# --- show / path -----------------------------------------------------------------------


def cmd_cache_show(args: argparse.Namespace, out: TextIO) -> int:
    store = reader(args)
    items = list(store.items(args.namespace))
    if args.json:
        json.dump([{"namespace": ns, "key": k, **r.to_dict()} for ns, k, r in items], out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"cache: {store.location} ({entries(len(items))})\n")
    by_ns: dict[str, list[list[str]]] = {}
    for ns, key, record in items:
        by_ns.setdefault(ns, []).append(
            [
                key,
                record.winner,
                fmt_us(record.winner_s),
                fmt_us(record.default_s),
                f"{record.speedup:.2f}x",
                output.bound(record),
                output.confidence(record),
                confirm.describe(record),
            ]
        )
    headers = ["problem", "winner", "us", "default us", "speedup", "bound", "confidence", "in situ"]
    for ns, rows in by_ns.items():
        out.write(f"\n[{ns}]\n")
        output.table(rows, headers, out, optional=["in situ"])
    low = sum(1 for _, _, r in items if output.confidence(r) == LOW)
    if low:
        out.write(
            f"\n{entries(low)} of low confidence (measured on a busy or noisy "
            "machine): tune them again on a quieter one with `unimatmul tune --force`\n"
        )
    return EXIT_OK


def cmd_cache_path(args: argparse.Namespace, out: TextIO) -> int:
    out.write(reader(args).location + "\n")
    return EXIT_OK


# --- stats -----------------------------------------------------------------------------


def cmd_cache_stats(args: argparse.Namespace, out: TextIO) -> int:
    path = output.cache_path(args)
    store = MsgpackFileStore(path, read_only=True)
    snapshot = store.snapshot()
    target = store.target
    size = target.stat().st_size if target.is_file() else 0
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
    parent = target.parent
    leftovers = sorted(p.name for p in parent.glob(f".{target.name}.*.tmp")) if parent.is_dir() else []
    corrupt = [p.name for p in kept_copies(target)] if parent.is_dir() else []
    count = snapshot.count()
    data: dict[str, Any] = {
        "path": str(path),
        "file": str(target),
        "exists": target.exists(),
        "file_bytes": size,
        "bytes_per_entry": round(size / count, 1) if count else None,
        "schema": snapshot.schema,
        "header": snapshot.header,
        "entries": count,
        "bad_entries": bad,
        "damage": snapshot.damage,
        "lost_entries": snapshot.lost,
        "namespaces": namespaces,
        "problems": store.problems,
        "temp_files": leftovers,
        "corrupt_copies": corrupt,
        "read_only_env": settings.CACHE_READONLY.raw() or "",
    }
    if args.validate:
        selector, validation_target = _selector_for(path, args)
        data["validation"] = selector.validate(validation_target).to_dict()
    if args.json:
        json.dump(data, out, indent=2, default=str)
        out.write("\n")
        return EXIT_OK
    out.write(f"cache:    {path}" + (f" -> {target}" if target != path.absolute() else "") + "\n")
    if not target.exists():
        out.write("file:     none yet (it is created by the first tuning)\n")
    else:
        header = snapshot.header
        per = f", {data['bytes_per_entry']} bytes per entry" if count else ""
        out.write(
            f"file:     {size_text(size)}{per}, schema {snapshot.schema}, by {header.get('writer', '?')}\n"
        )
        out.write(
            f"dates:    created {_date(header.get('created'))}, updated {_date(header.get('updated'))}\n"
        )
    out.write(
        f"entries:  {count} in {plural(len(namespaces), 'namespace')}"
        + (f", {bad} unreadable" if bad else "")
        + "\n"
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
    if snapshot.damage:
        out.write(
            f"damage:   {entries(snapshot.lost)} could not be read "
            "(`cache prune --bad` rewrites without them)\n"
        )
    if leftovers:
        out.write(f"temp files of interrupted writers: {len(leftovers)} (removed by the next write)\n")
    if corrupt:
        out.write(f"copies of damaged files kept: {', '.join(corrupt)} (`cache recover FILE` reads them)\n")
    if "validation" in data:
        v = data["validation"]
        out.write(
            f"\nvalidation of [{v['namespace']}] against the libraries here: {_validation_counts(v)} "
            "(invalidated: retuned on demand, `cache prune --invalid` removes them; not available "
            "here: kept, `cache prune --unavailable` removes them)\n"
        )
    return EXIT_OK


# --- verify ----------------------------------------------------------------------------


def cmd_cache_verify(args: argparse.Namespace, out: TextIO) -> int:
    path = output.cache_path(args)
    if not path.exists() and not path.is_symlink():
        out.write(f"no cache file at {path}\n")
        return EXIT_UNAVAILABLE
    try:
        snapshot = read_file(path)
    except NotRegularFile as exc:
        out.write(f"INVALID {path}: {exc}\n")
        return EXIT_UNAVAILABLE
    except (CacheFileError, OSError) as exc:
        out.write(f"INVALID {path}: {exc}\n")
        return EXIT_ERROR
    bad = [(ns, key, str(r)) for ns, key, r in iter_records(snapshot) if isinstance(r, BadEntry)]
    bad += snapshot.bad
    digest = content_digest(snapshot)
    result: dict[str, Any] = {
        "path": str(path),
        "valid": not bad and not snapshot.damage and not snapshot.unread,
        "schema": snapshot.schema,
        "entries": snapshot.count(),
        "namespaces": len([n for n in snapshot.namespaces.values() if len(n)]),
        "bad_entries": [{"namespace": ns, "key": key, "why": why} for ns, key, why in bad],
        "damage": snapshot.damage,
        "lost_entries": snapshot.lost,
        "unread": snapshot.unread,
        "sha256": digest,
    }
    code = EXIT_OK if result["valid"] else EXIT_ERROR
    if args.expect is not None:
        result["expected"] = args.expect
        result["matches"] = args.expect.lower() == digest
        if not result["matches"]:
            code = EXIT_ERROR
    if args.validate:
        selector, target = _selector_for(path, args)
        result["validation"] = selector.validate(target).to_dict()
    if args.json:
        json.dump(result, out, indent=2)
        out.write("\n")
        return code
    if result["valid"]:
        state = "ok"
    else:
        parts = [plural(len(bad), "unreadable entry", "unreadable entries")] if bad else []
        parts += [f"damaged ({entries(snapshot.lost)} lost)"] if snapshot.damage else []
        parts += (
            [plural(len(snapshot.unread), "namespace") + " this version cannot read"]
            if snapshot.unread
            else []
        )
        state = ", ".join(parts)
    out.write(
        f"{state}: {entries(result['entries'])} in {plural(result['namespaces'], 'namespace')}, "
        f"schema {snapshot.schema}\n"
    )
    for ns, key, why in bad[:20]:
        out.write(f"  bad entry [{ns}] {key}: {why}\n")
    for line in _damage_lines(snapshot):
        out.write(f"  {line}\n")
    for line in snapshot.unread:
        out.write(f"  unread:   {line}\n")
    out.write(f"sha256 {digest}\n")
    if "matches" in result:
        out.write(
            "matches the expected checksum\n" if result["matches"] else f"MISMATCH: expected {args.expect}\n"
        )
    if "validation" in result:
        out.write(
            f"validation of [{result['validation']['namespace']}]: {_validation_counts(result['validation'])}\n"
        )
    return code


# --- merge and recover -----------------------------------------------------------------


def _gather(
    names: list[str], *, verify: bool, out: TextIO, recovering: bool = False, home: Path | None = None
) -> tuple[Snapshot, int, int, int]:
    """The entries of several files in one snapshot (the faster record on a key in several):
    (snapshot, entries read, conflicts, entries that could not be read). With ``home`` (a
    merge's output), entries of the other files are marked as come by merge: checked on
    their first call wherever they serve (docs/trust.md)."""
    merged = Snapshot()
    conflicts = skipped = total = 0
    for name in names:
        snapshot = _read_or_exit(Path(name), verify=verify, recovering=recovering)
        elsewhere = home is not None and not _same_file(Path(name), home)
        for ns_name, ns in snapshot.namespaces.items():
            if ns.platform:
                merged.namespace(ns_name).platform.update(ns.platform)
        for ns_name, key, record in iter_records(snapshot):
            if isinstance(record, BadEntry):
                skipped += 1
                continue
            total += 1
            if elsewhere:
                record = mark_from_elsewhere(record, "merge")
            target = merged.namespace(ns_name)
            mine = target.fresh.get(key)
            if mine is not None:
                conflicts += 1
                record = faster(mine, record)
            target.fresh[key] = record
        skipped += len(snapshot.bad) + snapshot.lost
        if snapshot.damage:
            out.write(
                f"{name}: damaged, {entries(snapshot.lost)} could not be read; {snapshot.count()} could\n"
            )
            for line in _damage_lines(snapshot, limit=3)[:-1]:
                out.write(f"  {line}\n")
    return merged, total, conflicts, skipped


def _merge_into(disk: Snapshot, found: Snapshot) -> tuple[int, int, int]:
    """Put the records of ``found`` (gathered: all readable) into ``disk``, the faster record
    on a key both hold; (records put, keys both held, keys where disk's was faster)."""
    put = both = kept = 0
    for ns_name, key, record in iter_records(found):
        assert not isinstance(record, BadEntry)
        try:
            mine = disk.get(ns_name, key)
        except BadEntry:
            mine = None
        both += mine is not None
        if mine is None or faster(mine, record) is record:
            disk.namespace(ns_name).put(key, record)
            put += 1
        else:
            kept += 1
        if found.namespaces[ns_name].platform and not disk.namespace(ns_name).platform:
            disk.namespace(ns_name).platform = dict(found.namespaces[ns_name].platform)
    return put, both, kept


def _kept_lines(store: MsgpackFileStore, out: TextIO) -> None:
    for copy in store.kept:
        out.write(f"the damaged file it replaced was kept as {copy}\n")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return a.absolute() == b.absolute()


def cmd_cache_merge(args: argparse.Namespace, out: TextIO) -> int:
    output.check_writable(args.output, "-o")
    destination = Path(args.output)
    store = MsgpackFileStore(destination)  # honours UNIMATMUL_CACHE_READONLY
    others = [name for name in args.inputs if not _same_file(Path(name), store.target)]
    into_itself = len(others) < len(args.inputs)
    for name in others:  # a missing input is said before anything is locked
        if not Path(name).exists() and not Path(name).is_symlink():
            raise CliError(f"no cache file at {name}", EXIT_UNAVAILABLE)
    counts = [0, 0, 0, 0]  # entries, conflicts, unreadable, of the destination

    def change(disk: Snapshot) -> Snapshot:
        # Under the lock, with the file as other writers left it: the inputs are read here,
        # so that nothing written before the lock was taken is lost.
        # Entries of the other files are marked as come by merge (checked on first call).
        merged, total, conflicts, skipped = _gather(others, verify=True, out=out, home=store.target)
        if not into_itself:
            counts[:] = [total, conflicts, skipped, 0]
            # What the replaced file held that this version cannot read stays in it.
            merged.carried, merged.unread = disk.carried, disk.unread
            return merged
        _refuse_unreadable(disk)
        own = disk.count()
        _, both, _ = _merge_into(disk, merged)
        counts[:] = [total + own, conflicts + both, skipped + disk.lost, own]
        return disk

    new = _write(store, change)
    total, conflicts, skipped, _ = counts
    out.write(
        f"merged {entries(total)} from {plural(len(args.inputs), 'file')} into "
        f"{destination}: {entries(new.count())}, "
        f"{plural(conflicts, 'key')} in several files (the faster record kept)"
        + (f", {plural(skipped, 'unreadable entry', 'unreadable entries')} skipped" if skipped else "")
        + "\n"
    )
    _kept_lines(store, out)
    return EXIT_OK


def cmd_cache_recover(args: argparse.Namespace, out: TextIO) -> int:
    """Read back what can be read of damaged files (kept copies) into the cache."""
    found, total, _, skipped = _gather(args.files, verify=not args.unverified, out=out, recovering=True)
    path = output.cache_path(args)
    store = MsgpackFileStore(path)  # honours UNIMATMUL_CACHE_READONLY
    added: list[int] = [0, 0]

    def change(disk: Snapshot) -> Snapshot:
        taken, _, theirs = _merge_into(disk, found)
        added[:] = [taken, theirs]
        return disk

    _write(store, change)
    out.write(
        f"recovered {entries(added[0])} into {path} from {plural(len(args.files), 'file')} "
        f"({total} read, {added[1]} already there with a faster record"
        + (f", {skipped} could not be read" if skipped else "")
        + ")\n"
    )
    _kept_lines(store, out)
    return EXIT_OK


# --- prune -----------------------------------------------------------------------------


def cmd_cache_prune(args: argparse.Namespace, out: TextIO) -> int:
    if args.older_than is None and not (args.namespace or args.invalid or args.unavailable or args.bad):
        raise CliError(
            "nothing to prune: give --older-than DAYS, --namespace NS, --invalid, --unavailable or --bad"
        )
    if args.older_than is not None and not (0 <= args.older_than < math.inf):
        raise CliError(f"--older-than must be a number of days, 0 or more, got {args.older_than:g}")
    path = output.cache_path(args)
    if not path.exists() and not path.is_symlink():
        out.write(f"no cache file at {path}\n")
        return EXIT_OK
    invalid: dict[tuple[str, str], tuple[Any, str]] = {}
    if args.invalid or args.unavailable:
        selector, target = _selector_for(path, args)
        summary = selector.validate(target)
        chosen = (summary.invalidated if args.invalid else []) + (
            summary.unavailable if args.unavailable else []
        )
        for key in chosen:
            record = selector.store.get(summary.namespace, key)
            why = "invalid here" if key in summary.invalidated else "unavailable here"
            invalid[(summary.namespace, key)] = (record_signature(record), why)
    cutoff = time.time() - args.older_than * 86400 if args.older_than is not None else None
    drop_ns = set(args.namespace or [])
    removed: list[tuple[str, str, str]] = []
    lost = [0]

    def change(disk: Snapshot) -> Snapshot:
        _refuse_unreadable(disk)
        removed.clear()
        lost[0] = disk.lost + len(disk.bad)
        for ns_name, key, record in list(iter_records(disk)):
            why = ""
            if ns_name in drop_ns:
                why = "namespace"
            elif isinstance(record, BadEntry):
                why = "unreadable" if args.bad else ""
            elif cutoff is not None and record.tuned_at < cutoff:
                why = f"tuned {_date(record.tuned_at)}"
            elif (found := invalid.get((ns_name, key))) and found[0] == record_signature(record):
                why = found[1]
            if why:
                removed.append((ns_name, key, why))
                disk.namespaces[ns_name].delete(key)
        # Rewritten with tables holding only what the remaining entries use.
        fresh, dropped = compact(disk)
        if args.bad:
            removed.extend((ns, key, "unreadable") for ns, key, _ in dropped)
        return fresh

    store = MsgpackFileStore(path)  # honours UNIMATMUL_CACHE_READONLY
    current = _read_or_exit(path)  # a file that cannot be read is left before anything is locked
    if args.dry_run:
        change(current)
        verb = "would remove"
    else:
        _write(store, change)
        verb = "removed"
    reasons: dict[str, int] = {}
    for _, _, why in removed:
        kind = why.split(" ")[0]
        reasons[kind] = reasons.get(kind, 0) + 1
    detail = ", ".join(f"{n} {k}" for k, n in sorted(reasons.items()))
    out.write(f"{verb} {entries(len(removed))} from {path}" + (f" ({detail})" if detail else "") + "\n")
    if lost[0]:
        out.write(
            f"{entries(lost[0])} of the file could not be read (damaged); "
            + (
                "a rewrite keeps a copy of the damaged file\n"
                if args.dry_run
                else "they are not in the new file\n"
            )
        )
    _kept_lines(store, out)
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
    p = sub.add_parser("cache", help="inspect, check, merge, prune, recover, import and export the cache")
    p.set_defaults(func=output.help_of(p))
    cache_sub = p.add_subparsers(dest="cache_command", metavar="COMMAND")

    def common(c: argparse.ArgumentParser, *, verbose: bool = True) -> None:
        c.add_argument("--cache", default=None, help="cache file (default: $UNIMATMUL_CACHE or the user's)")
        if verbose:
            output.add_verbosity(c)

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
    output.add_verbosity(c)
    c.add_argument("inputs", nargs="+", metavar="FILE", help="cache files to merge")
    c.add_argument(
        "-o", "--output", required=True, help="file to write (replaced atomically), in a folder that exists"
    )
    c.set_defaults(func=cmd_cache_merge)

    c = cache_sub.add_parser(
        "recover", help="read back the readable entries of damaged files (kept copies) into the cache"
    )
    common(c)
    c.add_argument(
        "files", nargs="+", metavar="FILE", help="damaged cache files, e.g. <cache>.corrupt-<time>"
    )
    c.add_argument(
        "--unverified",
        action="store_true",
        help="also read a schema 2 file whose checksum fails (what it yields cannot be verified)",
    )
    c.set_defaults(func=cmd_cache_recover)

    c = cache_sub.add_parser("prune", help="remove entries by age, namespace, or validity; compacts")
    common(c, verbose=False)  # its own -v also lists what it removes
    target(c)
    c.add_argument("--older-than", type=float, metavar="DAYS", default=None, help="tuned more than DAYS ago")
    c.add_argument("--namespace", action="append", metavar="NS", help="a whole namespace (repeatable)")
    c.add_argument("--invalid", action="store_true", help="winners that no longer exist or check here")
    c.add_argument(
        "--unavailable",
        action="store_true",
        help="winners whose backend is not available here (kept otherwise)",
    )
    c.add_argument(
        "--bad",
        action="store_true",
        help="entries that cannot be read (a damaged file is kept as a copy first)",
    )
    c.add_argument("--dry-run", action="store_true", help="say what would go, change nothing")
    c.add_argument(
        "-v", "--verbose", action="store_true", help="list every removed entry; show every warning in full"
    )
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
