"""The plugin manager: loads the entry-point group ``unimatmul`` and validates plugins.

Built-in backends are registered by the same entry-point group that third-party
packages use. ``UNIMATMUL_PLUGINS`` (comma-separated entry-point names) restricts
loading to those names, ``UNIMATMUL_DISABLE_PLUGINS`` blocks the names it lists, and
``UNIMATMUL_PLUGINS=none`` loads no plugin at all.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TextIO

import pluggy

from unimatmul import settings
from unimatmul.core import hookspecs
from unimatmul.core._backend import Backend
from unimatmul.core.errors import PluginError

ENTRY_POINT_GROUP = "unimatmul"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    shapes: tuple[str, ...]
    plugin: str


@dataclass(frozen=True)
class Command:
    """A ``unimatmul`` subcommand a plugin added (see ``unimatmul_register_commands``)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]
    plugin: str


#: Subcommands of the CLI itself: a plugin cannot take these names.
BUILTIN_COMMANDS = frozenset({"info", "tune", "cache"})


@dataclass
class LoadReport:
    """What loading found: the plugins loaded, and those skipped or rejected and why."""

    loaded: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    #: Every entry point of the group that was found (loaded or not).
    entry_points: list[str] = field(default_factory=list)


class PluginManager:
    """A typed face over pluggy: every hook call site goes through a method here."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self.report = LoadReport()
        self._backends: dict[str, Backend] | None = None
        self._presets: dict[str, Preset] | None = None
        self._commands: dict[str, Command] | None = None
        self._lock = threading.Lock()
        if load_entry_points:
            self._load_entry_points()

    # --- loading ------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        found = settings.PLUGINS.get()
        allowed = None if found is None else set(found)
        blocked = settings.DISABLE_PLUGINS.get()
        if allowed is not None and allowed & {"none", "0"}:
            allowed = set()
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            self.report.entry_points.append(ep.name)
            if ep.name in blocked:
                self.report.skipped[ep.name] = "blocked by UNIMATMUL_DISABLE_PLUGINS"
                continue
            if allowed is not None and ep.name not in allowed:
                self.report.skipped[ep.name] = "not listed in UNIMATMUL_PLUGINS"
                continue
            if self._pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party import must not break ours
                self._fail(ep.name, f"import of {ep.value!r} failed: {exc!r}")
                continue
            try:
                self.register(plugin, ep.name)
            except PluginError as exc:
                self._fail(ep.name, str(exc))

    def _fail(self, name: str, why: str) -> None:
        self.report.failed[name] = why
        warnings.warn(f"unimatmul: plugin {name!r} rejected: {why}", RuntimeWarning, stacklevel=4)

    def register(self, plugin: ModuleType | object, name: str) -> None:
        """Register one plugin object, validating its hooks now, not at first call."""
        # pluggy ignores functions without the @hookimpl marker, so a misspelled,
        # undecorated hook would otherwise be skipped silently.
        prefix = f"{hookspecs.PROJECT}_"
        known = sorted(h for h in dir(hookspecs) if h.startswith(prefix))
        for attr in dir(plugin):
            value = getattr(plugin, attr, None)
            if attr.startswith(prefix) and attr not in known and inspect.isroutine(value):
                msg = f"plugin {name!r} defines {attr!r}, which is not a unimatmul hook; known hooks: {', '.join(known)}"
                raise PluginError(msg, plugin=name)
        try:
            self._pm.register(plugin, name=name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            msg = f"plugin {name!r} is invalid: {exc}"
            raise PluginError(msg, plugin=name) from exc
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._pm.unregister(name=name)
            msg = f"plugin {name!r} implements an unknown hook: {exc}"
            raise PluginError(msg, plugin=name) from exc
        self.report.loaded.append(name)
        self._forget()

    def unregister(self, name: str) -> None:
        self._pm.unregister(name=name)
        if name in self.report.loaded:
            self.report.loaded.remove(name)
        self._forget()

    def _forget(self) -> None:
        """Collect registrations again at the next call (a plugin came or went)."""
        self._backends = None
        self._presets = None
        self._commands = None

    # --- hook calls ---------------------------------------------------------------
    def backends(self) -> dict[str, Backend]:
        """Every registered backend by name, available or not."""
        with self._lock:
            if self._backends is None:
                self._backends = self._collect_backends()
            return self._backends

    def _collect_backends(self) -> dict[str, Backend]:
        found: dict[str, Backend] = {}
        current: list[str] = [""]

        def register(backend: Backend) -> None:
            if not isinstance(backend, Backend):
                msg = f"plugin {current[0]!r} registered {backend!r}, which is not a unimatmul Backend"
                raise PluginError(msg, plugin=current[0])
            name = getattr(backend, "name", None)
            if not isinstance(name, str) or not name or "/" in name or name == "default":
                msg = f"plugin {current[0]!r} registered a backend with an invalid name {name!r}"
                raise PluginError(msg, plugin=current[0])
            if name in found:
                msg = f"plugin {current[0]!r} registered backend {name!r}, which another plugin already registered"
                raise PluginError(msg, plugin=current[0])
            found[name] = backend

        self._call_each("unimatmul_register_backends", register, current)
        return found

    def presets(self) -> dict[str, Preset]:
        """Every registered shape suite by name."""
        with self._lock:
            if self._presets is None:
                found: dict[str, Preset] = {}
                current: list[str] = [""]

                def register(name: str, description: str, shapes: Sequence[str]) -> None:
                    found[name] = Preset(name, description, tuple(shapes), current[0])

                self._call_each("unimatmul_register_presets", register, current)
                self._presets = found
            return self._presets

    def commands(self) -> dict[str, Command]:
        """Every subcommand plugins registered, by name."""
        with self._lock:
            if self._commands is None:
                found: dict[str, Command] = {}
                current: list[str] = [""]

                def register(
                    name: str,
                    help: str,
                    configure: Callable[[argparse.ArgumentParser], None],
                    run: Callable[[argparse.Namespace, TextIO], int],
                ) -> None:
                    if not isinstance(name, str) or not name or name.startswith("-") or " " in name:
                        msg = f"plugin {current[0]!r} registered a command with an invalid name {name!r}"
                        raise PluginError(msg, plugin=current[0])
                    if name in BUILTIN_COMMANDS or name in found:
                        owner = "the CLI" if name in BUILTIN_COMMANDS else f"plugin {found[name].plugin!r}"
                        msg = f"plugin {current[0]!r} registered command {name!r}, which {owner} already has"
                        raise PluginError(msg, plugin=current[0])
                    if not callable(configure) or not callable(run):
                        msg = f"plugin {current[0]!r} registered command {name!r} without callables"
                        raise PluginError(msg, plugin=current[0])
                    found[name] = Command(name, help, configure, run, current[0])

                self._call_each("unimatmul_register_commands", register, current)
                self._commands = found
            return self._commands

    def _call_each(self, hook_name: str, register: Callable[..., None], current: list[str]) -> None:
        # Call implementations one by one so that a failure names its plugin and
        # leaves the other plugins' registrations in place.
        hook = getattr(self._pm.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):
            current[0] = impl.plugin_name
            try:
                impl.function(register=register)
            except PluginError as exc:
                self._fail(impl.plugin_name, str(exc))
            except Exception as exc:
                self._fail(impl.plugin_name, f"{hook_name} raised {exc!r}")

    def why_no_backends(self) -> str:
        """Why no backend is registered, and what to do about it (``unimatmul info`` and
        the warning of a tuning that finds no backend)."""
        report = self.report
        if not report.entry_points:
            return (
                f"no plugin is registered in the {ENTRY_POINT_GROUP!r} entry-point group, so not even "
                "the built-in backends load: unimatmul is imported from a source tree that was never "
                "installed; install it from the repository's checkout: `pip install -e '.[cpu]'` "
                "(unimatmul is not on a package index)"
            )
        why = self.load_notes()
        if report.loaded:
            why.append(f"plugins {', '.join(report.loaded)} loaded, registering no backend")
        return "; ".join(why)

    def load_notes(self) -> list[str]:
        """The plugins that were skipped or rejected, and why, grouped by reason."""
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.report.skipped.items():
            by_reason.setdefault(reason, []).append(name)
        notes = [f"plugins {', '.join(names)} {reason}" for reason, names in by_reason.items()]
        notes.extend(f"plugin {name} rejected ({reason})" for name, reason in self.report.failed.items())
        return notes

    def plugin_names(self) -> list[str]:
        return [name for name, _ in self._pm.list_name_plugin()]


class _ProcessManager:
    """The process-wide plugin manager (None until first use) and its lock."""

    def __init__(self) -> None:
        self.manager: PluginManager | None = None
        self.lock = threading.Lock()


_process = _ProcessManager()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, loaded on first use."""
    found = _process.manager
    if found is None:
        with _process.lock:
            if _process.manager is None:
                _process.manager = PluginManager()
            found = _process.manager
    return found


def reset_plugin_manager(manager: PluginManager | None = None) -> None:
    """Replace (or drop, to reload on next use) the process-wide plugin manager."""
    with _process.lock:
        _process.manager = manager


def available_backends(manager: PluginManager | None = None) -> dict[str, Any]:
    """Backend name -> None if usable, else the reason it is not."""
    manager = manager or get_plugin_manager()
    return {name: backend.availability() for name, backend in manager.backends().items()}
