"""Plugins: entry-point loading, blocking by environment, validation at load, every hook tested."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul.core import hookspecs
from unimatmul.core.errors import PluginError
from unimatmul.core.hookspecs import hookimpl
from unimatmul.core.plugins import ENTRY_POINT_GROUP, PluginManager
from unimatmul.core.problem import Problem
from unimatmul.presets import PRESETS
from unimatmul.tuning.selector import Selector, set_selector

REPO = Path(__file__).resolve().parents[2]


def test_entry_points_load_the_builtin_backends_and_presets() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {"onednn", "presets"} <= names
    pm = PluginManager()
    assert {"onednn", "presets"} <= set(pm.report.loaded)
    assert not pm.report.failed
    assert pm.backends()["onednn"].availability() is None
    presets = pm.presets()
    assert {"bert-base", "gpt2", "llama3-8b", "resnet50"} <= set(presets)
    assert presets["bert-base"].plugin == "presets"
    for preset in presets.values():
        assert preset.description and preset.shapes
        for shape in preset.shapes:
            Problem.parse_shape(shape)  # every preset shape is valid CLI input


@pytest.mark.parametrize(
    ("variable", "value", "loaded", "skipped", "why"),
    [
        (
            "UNIMATMUL_DISABLE_PLUGINS",
            "onednn",
            {"presets"},
            "onednn",
            "blocked by UNIMATMUL_DISABLE_PLUGINS",
        ),
        ("UNIMATMUL_DISABLE_PLUGINS", " onednn , presets", set(), "presets", "blocked"),
        ("UNIMATMUL_PLUGINS", "presets", {"presets"}, "onednn", "not listed in UNIMATMUL_PLUGINS"),
        ("UNIMATMUL_PLUGINS", "none", set(), "onednn", "not listed"),
    ],
)
def test_environment_blocks_plugins(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, loaded: set[str], skipped: str, why: str
) -> None:
    monkeypatch.setenv(variable, value)
    pm = PluginManager()
    assert loaded <= set(pm.report.loaded)
    assert skipped not in pm.report.loaded
    assert why in pm.report.skipped[skipped]
    assert "onednn" not in pm.backends()
    assert ("bert-base" in pm.presets()) == ("presets" in loaded)


def test_a_blocked_backend_is_not_a_candidate(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_DISABLE_PLUGINS", "onednn")
    set_selector(Selector(settings=isolated.selector.settings))
    a = np.random.default_rng(0).standard_normal((30, 20)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((20, 10)).astype(np.float32)
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    from unimatmul.tuning.selector import get_selector

    [(_, _, record)] = list(get_selector().store.items())
    assert [r.identity for r in record.results] == ["default/default"]


def test_an_entry_point_that_fails_to_import_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.metadata.entry_points

    def with_a_broken_one(**kwargs: Any) -> Any:
        found = list(real(**kwargs))
        if kwargs.get("group") == ENTRY_POINT_GROUP:
            found.append(
                importlib.metadata.EntryPoint("broken", "no_such_module_anywhere", ENTRY_POINT_GROUP)
            )
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", with_a_broken_one)
    with pytest.warns(RuntimeWarning, match="plugin 'broken' rejected: import of 'no_such_module_anywhere'"):
        pm = PluginManager()
    assert "broken" in pm.report.failed
    assert "onednn" in pm.backends()  # the others still load


# --- validation at load -------------------------------------------------------------


class _MisspelledMarked:
    @hookimpl
    def unimatmul_register_backend(self, register: Callable[[Any], None]) -> None:  # 's' missing
        raise AssertionError("never called")


class _MisspelledPlain:
    def unimatmul_regsiter_presets(self, register: Callable[..., None]) -> None:
        raise AssertionError("never called")


class _BadSignature:
    @hookimpl
    def unimatmul_register_backends(self, registr: Callable[[Any], None]) -> None:
        raise AssertionError("never called")


@pytest.mark.parametrize(
    ("plugin", "match"),
    [
        (_MisspelledMarked(), "defines 'unimatmul_register_backend', which is not a unimatmul hook"),
        (
            _MisspelledPlain(),
            "defines 'unimatmul_regsiter_presets', which is not a unimatmul hook; known hooks:",
        ),
        (_BadSignature(), "(?s)is invalid: .*registr"),
    ],
    ids=["misspelled", "misspelled-undecorated", "bad-signature"],
)
def test_an_invalid_plugin_is_rejected_at_load_and_named(plugin: object, match: str) -> None:
    pm = PluginManager(load_entry_points=False)
    with pytest.raises(PluginError, match=match) as info:
        pm.register(plugin, "acme-typo")
    assert info.value.plugin == "acme-typo"
    assert "'acme-typo'" in str(info.value)
    assert "acme-typo" not in pm.plugin_names() and "acme-typo" not in pm.report.loaded


class _Registers:
    """A plugin whose backend hook registers whatever it is given."""

    def __init__(self, *things: Any) -> None:
        self.things = things

    @hookimpl
    def unimatmul_register_backends(self, register: Callable[[Any], None]) -> None:
        for thing in self.things:
            register(thing)


class _Raises:
    @hookimpl
    def unimatmul_register_backends(self, register: Callable[[Any], None]) -> None:
        raise ImportError("libvendor.so.1: cannot open shared object file")


class _NamedBackend:
    """Not a Backend subclass, only shaped like one."""

    name = "impostor"


@pytest.mark.parametrize(
    ("plugin", "match"),
    [
        (_Registers(_NamedBackend()), "registered .* which is not a unimatmul Backend"),
        (_Registers("onednn"), "which is not a unimatmul Backend"),
        (_Raises(), "unimatmul_register_backends raised ImportError"),
    ],
    ids=["not-a-backend", "a-string", "hook-raises"],
)
def test_a_plugin_registering_garbage_is_rejected_and_named(plugin: object, match: str) -> None:
    pm = PluginManager()
    pm.register(plugin, "acme")
    with pytest.warns(RuntimeWarning, match=f"plugin 'acme' rejected: .*{match}"):
        backends = pm.backends()
    assert re.search(match, pm.report.failed["acme"])
    assert "onednn" in backends  # the others' registrations stay


def test_backend_names_are_checked(
    isolated: Any, fake_backend: Callable[..., Any], unregistered_backend: Callable[..., Any], registered: Any
) -> None:
    for bad, why in [
        ("default", "invalid name 'default'"),
        ("a/b", "invalid name 'a/b'"),
        ("", "invalid name ''"),
    ]:
        with (
            registered(isolated.plugins, unregistered_backend(bad), name="acme"),
            pytest.warns(RuntimeWarning, match=why),
        ):
            assert bad not in isolated.plugins.backends()
    fake_backend("twice")
    with registered(isolated.plugins, unregistered_backend("twice"), name="copycat"):
        with pytest.warns(
            RuntimeWarning, match="registered backend 'twice', which another plugin already registered"
        ):
            backends = isolated.plugins.backends()
        assert "twice" in backends  # one of the two keeps the name; the other is named as rejected
        assert len({"copycat", "test-twice"} & set(isolated.plugins.report.failed)) == 1


# --- every hook: documented and exercised -------------------------------------------


class _PresetPlugin:
    @hookimpl
    def unimatmul_register_presets(self, register: Callable[[str, str, Sequence[str]], None]) -> None:
        register("tiny", "two small shapes for tests", ["8x8x8", "2x4x4x4"])


class _BackendPlugin:
    def __init__(self, backend: Any) -> None:
        self.backend = backend

    @hookimpl
    def unimatmul_register_backends(self, register: Callable[[Any], None]) -> None:
        register(self.backend)


def test_unimatmul_register_presets() -> None:
    pm = PluginManager()
    pm.register(_PresetPlugin(), "tiny-presets")
    preset = pm.presets()["tiny"]
    assert preset.shapes == ("8x8x8", "2x4x4x4") and preset.plugin == "tiny-presets"
    assert set(PRESETS) <= set(pm.presets())
    pm.unregister("tiny-presets")
    assert "tiny" not in pm.presets()


def test_unimatmul_register_backends(isolated: Any, unregistered_backend: Callable[..., Any]) -> None:
    backend = unregistered_backend("thirdparty")
    isolated.plugins.register(_BackendPlugin(backend), "thirdparty-plugin")
    try:
        assert isolated.plugins.backends()["thirdparty"] is backend
        record = isolated.selector.tune(Problem.from_shape(8, 8, 8), _numpy_target())
        assert "thirdparty/k0" in [r.identity for r in record.results]
    finally:
        isolated.plugins.unregister("thirdparty-plugin")
    assert "thirdparty" not in isolated.plugins.backends()


def _numpy_target() -> Any:
    from unimatmul.backend import Target
    from unimatmul.core.arrays import CPU, adapter_for_kind

    return Target(adapter_for_kind("numpy"), CPU)


def _hookspecs() -> list[Callable[..., Any]]:
    return [
        fn
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT}_spec")
    ]


def test_every_hook_is_documented_and_tested() -> None:
    specs = _hookspecs()
    assert len(specs) >= 2
    this_file = Path(__file__).read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for spec in specs:
        name = spec.__name__
        assert name.startswith("unimatmul_")
        assert spec.__doc__ and len(spec.__doc__.strip()) > 40, f"{name} has no docstring"
        assert f"def test_{name}(" in this_file, f"{name} has no test named test_{name} here"
        assert f"`{name}" in readme, f"{name} is not documented in README.md"


class _Commands:
    """A plugin that adds one command, and one that tries to take a built-in name."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def unimatmul_register_commands(self, register: Callable[..., None]) -> None:
        def configure(p: Any) -> None:
            p.add_argument("--times", type=int, default=1)

        def run(args: Any, out: Any) -> int:
            out.write("hello " * args.times + "\n")
            return 0 if args.times < 3 else 3

        register(self.name, "say hello", configure, run)


def test_unimatmul_register_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from unimatmul import cli

    plugins = PluginManager(load_entry_points=False)
    plugins.register(_Commands("hello"), "hello-plugin")
    monkeypatch.setattr(cli, "get_plugin_manager", lambda: plugins)
    out = io.StringIO()
    assert cli.main(["hello", "--times", "2"], out=out) == 0
    assert out.getvalue() == "hello hello \n"
    assert cli.main(["hello", "--times", "3"], out=io.StringIO()) == 3  # its own exit code
    # A built-in name, or one another plugin took first, is refused and named.
    plugins.register(_Commands("tune"), "greedy")
    with pytest.warns(RuntimeWarning, match="greedy.*'tune', which the CLI already has"):
        assert set(plugins.commands()) == {"hello"}
    # The conformance suite adds its command through this hook (its entry point).
    assert "conformance" in PluginManager().commands()


def test_loading_again_is_quiet() -> None:
    # A second manager in one process (tests, reloads) warns about nothing when nothing is wrong.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PluginManager().backends()
        PluginManager().backends()
