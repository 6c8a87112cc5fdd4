"""``unimatmul info``: the platform (the cache namespace), every backend, plugins, the cache,
and where torch is installed, whether the native routing kernels are built."""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from typing import Any, TextIO

from unimatmul import __version__
from unimatmul.cli import output
from unimatmul.cli.output import EXIT_OK, entries, plural
from unimatmul.core.modes import get_mode
from unimatmul.tuning.selector import get_selector


def add_command(sub: Any) -> None:
    p = sub.add_parser("info", help="platform, backends and their versions, cache")
    output.add_target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    output.add_verbosity(p)
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace, out: TextIO) -> int:
    selector = get_selector()
    target = output.target(args.array, args.device)
    platform = selector.platform(target)
    backends: list[dict[str, Any]] = []
    for name, backend in sorted(selector.plugins.backends().items()):
        reason = backend.availability()
        versions: dict[str, str] = {}
        if reason is None:
            try:
                versions = backend.versions()
            except Exception as exc:
                reason = f"versions failed: {exc!r}"
        backends.append(
            {
                "name": name,
                "available": reason is None,
                "reason": reason,
                "versions": versions,
                "devices": sorted(backend.device_kinds),
                "serves_target": backend.serves(target),
            }
        )
    report = selector.plugins.report
    store = selector.store
    # Said outright: without it an empty list reads as "this machine has nothing to offer".
    no_backend = None if selector.backends_for(target) else selector.tuner.why_no_backend(target)
    data: dict[str, Any] = {
        "unimatmul": __version__,
        "mode": get_mode(),
        "target": {"array": target.array_kind, "device": str(target.device)},
        "platform": platform.to_dict() | {"namespace": platform.namespace},
        "backends": backends,
        "no_backend_reason": no_backend,
        "plugins": {"loaded": report.loaded, "skipped": report.skipped, "failed": report.failed},
        "cache": {"path": store.location, "entries": store.count()},
        "torch_native": torch_native(),
        "presets": {
            p.name: {"description": p.description, "shapes": len(p.shapes), "plugin": p.plugin}
            for p in selector.plugins.presets().values()
        },
    }
    if args.json:
        json.dump(data, out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"unimatmul {__version__}   mode: {data['mode']}\n")
    out.write(f"platform:  {platform.namespace}\n")
    libs = ", ".join(f"{k} {v}" for k, v in platform.libraries)
    out.write(f"libraries: {libs}\n")
    out.write("backends:\n")
    shortened = False
    for b in backends:
        if b["available"]:
            names = ", ".join(f"{k} {v}" for k, v in b["versions"].items())
            out.write(f"  {b['name']:<10} available    {names}   devices: {', '.join(b['devices'])}\n")
        else:
            reason = b["reason"] if args.verbose else short_reason(b["reason"])
            shortened = shortened or reason != b["reason"]
            out.write(f"  {b['name']:<10} unavailable  {reason}\n")
    if shortened:
        out.write("  (`unimatmul info -v` says in full why a backend is unavailable)\n")
    if no_backend is not None:
        where = f"{target.array_kind} on {target.device}"
        out.write(f"  none serves {where}, so tuning measures only Default: {no_backend}\n")
    if report.failed:
        out.write("plugins rejected:\n")
        for name, why in report.failed.items():
            out.write(f"  {name}: {why}\n")
    if report.skipped:
        out.write("plugins skipped: " + ", ".join(f"{k} ({v})" for k, v in report.skipped.items()) + "\n")
    presets = ", ".join(f"{name} ({plural(p['shapes'], 'shape')})" for name, p in data["presets"].items())
    out.write(f"presets:   {presets or 'none'} (`unimatmul tune --preset NAME`)\n")
    out.write(f"cache:     {store.location} ({entries(data['cache']['entries'])})\n")
    if data["torch_native"] is not None:
        out.write(f"torch:     native routing kernels {native_line(data['torch_native'])}\n")
    return EXIT_OK


def torch_native() -> dict[str, Any] | None:
    """Where the native routing kernels stand (``unimatmul.torch.native.status``); None
    without torch, which is then imported only to tell."""
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        from unimatmul.torch import native
    except Exception as exc:  # a torch that does not import: say so, never a traceback
        return {"build": None, "state": "unknown", "path": None, "reason": f"{type(exc).__name__}: {exc}"}
    return native.status()


def native_line(status: dict[str, Any]) -> str:
    """``info``'s words for :func:`torch_native`'s status."""
    state, build = status["state"], status["build"]
    what = f" ({build.upper()} build)" if build else ""
    if state == "off":
        return "off (UNIMATMUL_TORCH_NATIVE=0)"
    if state in ("built", "loaded"):
        return f"built{what}: {status['path']}"
    if state == "building":
        since = time.strftime("%H:%M:%S", time.localtime(status["since"]))
        lock = f" (if no build runs, remove its lock file {status['lock']})" if status.get("lock") else ""
        return f"building{what} since {since}{lock}"
    if state == "not built":
        return f"not built{what}: the first enable() builds them in the background (`python -m unimatmul.torch --build-native` now)"
    return f"{state}{what}: {status.get('reason', '')}"


#: The longest reason ``info`` prints for an unavailable backend without ``-v``.
REASON_WIDTH = 90


def short_reason(reason: str) -> str:
    """The first clause of why a backend is unavailable (the search of every library
    path it tried is for ``-v``), at most :data:`REASON_WIDTH` characters."""
    cut = min((i for i in (reason.find(" ("), reason.find("; ")) if i > 0), default=len(reason))
    first = reason[:cut].rstrip(" .:;")
    if len(first) > REASON_WIDTH:
        first = first[: REASON_WIDTH - 3].rstrip() + "..."
    return first
