"""The settings registry: every UNIMATMUL_* variable declared once, read through it, documented."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from unimatmul import settings
from unimatmul.settings import REGISTRY, SettingError

REPO = Path(__file__).resolve().parents[1]
SOURCES = [REPO / "unimatmul", REPO / "backends", REPO / "conformance", REPO / "plugins"]


def _documented_rows() -> dict[str, tuple[str, str]]:
    """The rows of the environment-variables table in docs/settings.md."""
    text = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    rows: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        match = re.match(r"^\| `(UNIMATMUL_[A-Z0-9_]+)` \| ([^|]+) \| (.+) \|$", line)
        if match:
            rows[match.group(1)] = (match.group(2).strip(), match.group(3).strip())
    return rows


def test_the_documented_table_is_the_registry() -> None:
    rows = _documented_rows()
    assert set(rows) == set(settings.BUILTIN), (
        "docs/settings.md's table and unimatmul/settings.py list different variables"
    )
    for name, setting in settings.BUILTIN.items():
        assert rows[name] == (setting.kind, setting.doc), (
            f"docs/settings.md's row of {name} differs from its declaration"
        )


def _python_sources() -> list[Path]:
    """The shipped code (tests may set variables for the code under test)."""
    return [
        p for root in SOURCES for p in root.rglob("*.py") if ".venv" not in p.parts and "tests" not in p.parts
    ]


def _declare_plugin_settings() -> None:
    """Import each plugin distribution's own settings module (plugins/*/src/*/settings.py),
    which declares its variables in the registry; nothing else of the plugin is imported."""
    for path in sorted((REPO / "plugins").glob("*/src/*/settings.py")):
        spec = importlib.util.spec_from_file_location(f"_plugin_settings_{path.parent.name}", path)
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_every_variable_named_in_the_code_is_declared() -> None:
    _declare_plugin_settings()
    named: dict[str, Path] = {}
    for path in _python_sources():
        for name in re.findall(r"UNIMATMUL_[A-Z][A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")):
            named.setdefault(name, path)
    undeclared = {name: str(path.relative_to(REPO)) for name, path in named.items() if name not in REGISTRY}
    assert not undeclared, (
        f"variables named in the code but not declared in unimatmul/settings.py: {undeclared}"
    )


def test_no_module_reads_a_variable_around_the_registry() -> None:
    reading = re.compile(r"(environ|getenv)\W[^\n]*[\"']UNIMATMUL_")
    offenders = [
        str(path.relative_to(REPO))
        for path in _python_sources()
        if path.name != "settings.py" and reading.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_the_test_suite_runs_with_every_variable_cleared() -> None:
    # conftest clears every registered variable, then points the cache at a session file.
    assert {name for name in REGISTRY if name in os.environ} <= {"UNIMATMUL_CACHE"}


@pytest.mark.parametrize(
    ("text", "value"), [("1", True), ("Yes", True), (" on ", True), ("0", False), ("off", False)]
)
def test_one_idea_of_true(monkeypatch: pytest.MonkeyPatch, text: str, value: bool) -> None:
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", text)
    assert settings.CACHE_READONLY.get() is value


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("UNIMATMUL_CACHE_READONLY", "maybe", "UNIMATMUL_CACHE_READONLY='maybe' is neither true"),
        ("UNIMATMUL_LT_HEURISTICS", "many", "UNIMATMUL_LT_HEURISTICS='many' is not an integer"),
        ("UNIMATMUL_LT_HEURISTICS", "0", "UNIMATMUL_LT_HEURISTICS='0' is less than 1"),
        ("UNIMATMUL_GPU_BUDGET_S", "nan", "UNIMATMUL_GPU_BUDGET_S='nan' is less than 0"),
        ("UNIMATMUL_GPU_BATCH_CALLS", "0", "UNIMATMUL_GPU_BATCH_CALLS='0' is less than 1"),
        (
            "UNIMATMUL_LT_LIBRARY",
            "cublas",
            "UNIMATMUL_LT_LIBRARY='cublas' is not one of auto, nvmath, ctypes",
        ),
    ],
)
def test_a_bad_value_names_the_variable_and_what_it_takes(
    monkeypatch: pytest.MonkeyPatch, name: str, text: str, message: str
) -> None:
    monkeypatch.setenv(name, text)
    with pytest.raises(SettingError, match=re.escape(message)) as caught:
        REGISTRY[name].get()
    assert caught.value.name == name


def test_unset_or_empty_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_LT_HEURISTICS", "  ")
    assert settings.LT_HEURISTICS.get() == 16
    monkeypatch.delenv("UNIMATMUL_LT_HEURISTICS")
    assert settings.LT_HEURISTICS.get() == 16


def test_a_variable_is_declared_once() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        settings.declare("UNIMATMUL_MODE", "text", "", settings.parse_text, "again", owner="someone")
    # The same declaration again (a module imported under two names) is the one setting.
    again = settings.declare("UNIMATMUL_MODE", "choice", "cached", settings.parse_text, "again")
    assert again is settings.MODE
    with pytest.raises(ValueError, match="must start with UNIMATMUL_"):
        settings.declare("OTHER_THING", "text", "", settings.parse_text, "not ours")
