"""Finding the backend to check: a registered name, or ``module:attribute``.

``module:attribute`` lets a plugin author run the suite on a backend before packaging
it: the attribute is a Backend instance, a Backend class (called with no
arguments) or a function returning a Backend.
"""

from __future__ import annotations

import importlib

from unimatmul.backend import Backend
from unimatmul.core.plugins import PluginManager, get_plugin_manager


class BackendNotFound(LookupError):
    """No backend answers to the name given; the message lists the valid ones."""


def load_backend(spec: str, manager: PluginManager | None = None) -> Backend:
    """The backend called ``spec`` by the plugin manager, or found at ``module:attribute``."""
    manager = manager or get_plugin_manager()
    backends = manager.backends()
    if spec in backends:
        return backends[spec]
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            msg = f"cannot import {module_name!r} for backend {spec!r}: {exc}"
            raise BackendNotFound(msg) from exc
        obj: object = module
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                msg = f"{module_name!r} has no attribute {attribute!r} (backend {spec!r})"
                raise BackendNotFound(msg) from None
        if not isinstance(obj, Backend) and callable(obj):
            obj = obj()
        if not isinstance(obj, Backend):
            msg = f"{spec!r} is {obj!r}, not a unimatmul Backend"
            raise BackendNotFound(msg)
        return obj
    valid = ", ".join(sorted(backends)) or "none registered"
    failed = manager.report.failed
    hint = f"; rejected plugins: {failed}" if failed else ""
    msg = f"unknown backend {spec!r}; registered backends: {valid}{hint} (or give module:attribute)"
    raise BackendNotFound(msg)


def recreate_specs(backend: Backend, spec: str | None) -> list[str]:
    """How a fresh process finds the same backend: its spec, then its class path.

    The class path serves backends registered in-process (a test fixture, a script)
    that a fresh process cannot find by name.
    """
    specs = [spec] if spec is not None else []
    cls = type(backend)
    if cls.__module__ != "__main__" and "<locals>" not in cls.__qualname__:
        specs.append(f"{cls.__module__}:{cls.__qualname__}")
    return specs
