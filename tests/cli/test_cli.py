"""The ``unimatmul`` command: what it prints and the exit codes scripts rely on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from io import StringIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul.backend import DEFAULT
from unimatmul.cli import (
    EXIT_CLOSED_OUTPUT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    main,
)
from unimatmul.cli import output as cli_output
from unimatmul.cli import tune as tune_cli
from unimatmul.core.hookspecs import hookimpl
from unimatmul.core.plugins import PluginManager, reset_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.testing import fast_config
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector, set_selector
from unimatmul_backends.onednn import OneDNNBackend

# Without oneDNN (a GPU machine's image) the tests that need it fail on their own, not at collection.
ONEDNN_VERSIONS = OneDNNBackend().versions() if OneDNNBackend().availability() is None else {}
ONEDNN_VERSION = ONEDNN_VERSIONS.get("onednn", "")


def run(argv: list[str]) -> tuple[int, str]:
    out = StringIO()
    code = main(argv, out=out)
    return code, out.getvalue()


class _TinyPresets:
    @hookimpl
    def unimatmul_register_presets(self, register: Callable[[str, str, Sequence[str]], None]) -> None:
        register("tiny", "small shapes for tests", ["16x8x24", "2x8x8x8"])


# --- info ---------------------------------------------------------------------------


def test_info_lists_onednn_with_its_version(isolated: Any) -> None:
    code, text = run(["info"])
    assert code == EXIT_OK
    assert re.search(rf"onednn\s+available\s+onednn {re.escape(ONEDNN_VERSION)}", text), text
    assert f"cache:     {isolated.cache_path} (0 entries)" in text
    assert "platform:  cpu/" in text and text.rstrip().count("\n") >= 4


def test_info_json(isolated: Any) -> None:
    code, text = run(["info", "--json"])
    assert code == EXIT_OK
    data = json.loads(text)
    onednn = next(b for b in data["backends"] if b["name"] == "onednn")
    assert onednn["available"] and onednn["versions"] == ONEDNN_VERSIONS
    assert data["platform"]["namespace"].endswith("/numpy")
    assert data["cache"] == {"path": str(isolated.cache_path), "entries": 0}
    assert {"onednn", "presets"} <= set(data["plugins"]["loaded"])


def test_the_console_script(tmp_path: Path) -> None:
    script = shutil.which("unimatmul", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the unimatmul console script is not installed next to this Python")
    # The library under test stays (UNIMATMUL_DNNL_LIB): the version must be its own.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_") or k == "UNIMATMUL_DNNL_LIB"}
    env["UNIMATMUL_CACHE"] = str(tmp_path / "cache.msgpack")
    done = subprocess.run([script, "info"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == EXIT_OK, done.stderr
    assert re.search(rf"onednn\s+available\s+onednn {re.escape(ONEDNN_VERSION)}", done.stdout), done.stdout
    bad = subprocess.run(
        [script, "tune", "--shape", "12x12"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert bad.returncode == EXIT_USAGE
    assert "unimatmul: error: bad shape '12x12:f32'" in bad.stderr


# --- tune ---------------------------------------------------------------------------


def _rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("shape"))
    rows = []
    for line in lines[start + 2 :]:
        if not line or line.startswith(("geometric", "cache:")):
            break
        rows.append(line.split())
    return rows


def test_tune_writes_the_cache_and_prints_the_table(isolated: Any) -> None:
    code, text = run(["tune", "--shape", "64x48x32", "--quiet"])
    assert code == EXIT_OK
    header = re.split(r"\s{2,}", text.splitlines()[0])
    assert header == [
        "shape",
        "array",
        "dtype",
        "epilogue",
        "default us",
        "best candidate",
        "best us",
        "speedup",
        "bound",
        "confidence",
        "tune s",
    ]  # no "in situ": nothing tuned here has been judged where it runs
    [row] = _rows(text)
    assert row[:4] == ["64x48x32", "numpy", "f32", "none"]
    [(_, key, record)] = list(isolated.selector.store.items())
    assert key == "gemm:f32.f32.f32:f32:NN:m64n48k32b1:ld32,48,48:st0,0,0:beta0:none:al16"
    assert row[5] == record.winner
    assert float(row[4].replace(",", "")) == pytest.approx(record.default_s * 1e6, abs=0.06)
    assert row[7] == f"{record.speedup:.2f}x"
    assert row[8] == cli_output.bound(record) and re.fullmatch(r"(>=|<=)\d+\.\d\dx|-", row[8])
    assert row[9] == record.settings["confidence"] == "high"  # fast_config judge nothing unstable
    assert re.fullmatch(r"\d+\.\d\d", row[10])  # seconds spent tuning
    assert "geometric-mean speedup over default: " in text and " on 1 shape\n" in text
    assert f"cache: {isolated.cache_path} (1 entry)" in text
    assert isolated.cache_path.exists()

    # Again: answered from the cache, nothing tuned.
    tuned = isolated.selector.stats.tuned
    code, again = run(["tune", "--shape", "64x48x32", "--quiet"])
    assert code == EXIT_OK
    [row2] = _rows(again)
    assert row2[10] == "cached" and row2[5] == record.winner
    assert isolated.selector.stats.tuned == tuned

    # --force tunes again.
    code, forced = run(["tune", "--shape", "64x48x32:f32", "--force", "--quiet"])
    assert code == EXIT_OK and _rows(forced)[0][10] != "cached"
    assert isolated.selector.stats.tuned == tuned + 1


def test_tune_a_preset_and_write_json(isolated: Any, tmp_path: Path) -> None:
    isolated.plugins.register(_TinyPresets(), "tiny-presets")
    report = tmp_path / "records.json"
    code, text = run(["tune", "--preset", "tiny", "--shape", "16x8x24", "--json", str(report), "--quiet"])
    assert code == EXIT_OK
    assert [r[0] for r in _rows(text)] == ["16x8x24", "2x8x8x8"]  # duplicates tuned once
    records = json.loads(report.read_text())
    assert [r["source"] for r in records] == ["tuned", "tuned"]
    assert all(r["results"][0]["identity"] == "default/default" for r in records)
    assert isolated.store_count() == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "--shape", "64x48"], "bad shape '64x48:f32'"),
        (["tune", "--shape", "0x4x4"], "bad shape"),
        (["tune", "--shape", "4x4x4:int8"], "unsupported dtype int8"),
        (
            ["tune", "--preset", "bert"],
            "unknown preset 'bert'; valid presets: bert-base, gpt2, llama3-8b, resnet50",
        ),
        (["tune"], "nothing to tune: give --shape MxNxK[:dtype]"),
        (["tune", "--shape", "8x8x8", "--device", "cuda"], "NumPy arrays live on the CPU"),
        (["info", "--device", "tpu"], "unknown device 'tpu'"),
        # dtypes NumPy cannot hold: refused before tuning, not a TypeError from inside it
        (["tune", "--shape", "4x5x5:bf16"], "cannot tune 4x5x5:bf16 here: NumPy has no bf16 arrays"),
        (["tune", "--shape", "4x5x5", "--dtype", "f8e4m3"], "NumPy has no f8e4m3 arrays"),
        (["tune", "--shape", "8x8x8", "--budget-ms", "0"], "--budget-ms must be a positive number"),
        (["tune", "--shape", "8x8x8", "--buckets", "--max-m", "0"], "--max-m must be at least 1"),
        (["tune", "--shape", "8x8x8", "--max-m", "64"], "--max-m only applies with --buckets"),
    ],
)
def test_bad_usage_exits_2_with_a_message(
    isolated: Any, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, text = run(argv)
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert text == ""
    assert not isolated.cache_path.exists()


def test_unknown_options_exit_2(isolated: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["tune", "--no-such-option"])
    assert info.value.code == EXIT_USAGE
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_no_backend_for_the_device_exits_3(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UNIMATMUL_DISABLE_PLUGINS", "onednn")
    set_selector(Selector(settings=isolated.selector.settings))
    code, text = run(["tune", "--shape", "8x8x8", "--quiet"])
    assert code == EXIT_UNAVAILABLE and text == ""
    err = capsys.readouterr().err
    assert "unimatmul: error: no backend is available for numpy on cpu" in err
    assert "plugins onednn blocked by UNIMATMUL_DISABLE_PLUGINS" in err  # says why
    assert not isolated.cache_path.exists()


# --- cache --------------------------------------------------------------------------


def test_cache_show(isolated: Any) -> None:
    assert run(["tune", "--shape", "32x16x8", "--shape", "2x8x8x8", "--quiet"])[0] == EXIT_OK
    code, text = run(["cache", "show", "--json"])
    assert code == EXIT_OK
    entries = json.loads(text)
    assert sorted(e["key"] for e in entries) == sorted(r[1] for r in isolated.selector.store.items())
    assert all(e["namespace"].endswith("/numpy") and e["winner"] and e["results"] for e in entries)

    code, text = run(["cache", "show"])
    assert code == EXIT_OK
    assert f"cache: {isolated.cache_path} (2 entries)" in text
    assert "m32n16k8b1" in text and "m8n8k8b2" in text

    code, text = run(["cache", "path"])
    assert code == EXIT_OK and text.strip() == str(isolated.cache_path)


# --- failures end in one line and a documented exit code ---------------------------


def test_a_bad_environment_variable_exits_2_with_its_message(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("UNIMATMUL_MODE", "fast")
    code, text = run(["info"])
    assert code == EXIT_USAGE and text == ""
    err = capsys.readouterr().err
    assert err.startswith("unimatmul: error: unknown unimatmul mode 'fast' in UNIMATMUL_MODE")
    assert err.count("\n") == 1


def test_a_shape_larger_than_memory_is_refused_before_tuning(
    isolated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run(["tune", "--shape", "99999999x99999999x99999999", "--quiet"])
    assert code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert re.search(
        r"99999999x99999999x99999999:f32 needs 106\.6 PiB for its operands alone; cpu has .* free", err
    )
    assert isolated.selector.stats.tuned == 0 and not isolated.cache_path.exists()


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_an_unwritable_json_file_is_refused_before_tuning(
    isolated: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    path = tmp_path / "no-such-dir" / "x.json" if where == "missing folder" else tmp_path
    code, _ = run(["tune", "--shape", "8x8x8", "--quiet", "--json", str(path)])
    # A folder that does not exist is bad input (the one rule of every file to write);
    # a folder where the file should be is a write that fails.
    assert code == (EXIT_USAGE if where == "missing folder" else EXIT_ERROR)
    err = capsys.readouterr().err
    assert f"unimatmul: error: cannot write --json {path}" in err
    if where == "missing folder":
        assert f"no directory {path.parent}" in err
    assert not path.parent.exists() or path == tmp_path
    assert isolated.selector.stats.tuned == 0 and not isolated.cache_path.exists()


def _fresh_selector() -> Selector:
    """A process-wide Selector that reads the environment as the test set it."""
    selector = Selector(settings=fast_config())
    set_selector(selector)
    return selector


def test_an_unwritable_cache_is_refused_before_tuning(
    isolated: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("UNIMATMUL_CACHE", str(blocker / "cache.msgpack"))
    selector = _fresh_selector()
    code, text = run(["tune", "--shape", "8x8x8", "--quiet"])
    assert code == EXIT_ERROR and "cache:" not in text
    err = capsys.readouterr().err
    assert f"cannot write the cache {blocker / 'cache.msgpack'}: {blocker} is a file, not a directory" in err
    assert selector.stats.tuned == 0


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes read-only folders")
def test_a_cache_in_a_read_only_folder_is_refused_before_tuning(
    isolated: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        monkeypatch.setenv("UNIMATMUL_CACHE", str(folder / "cache.msgpack"))
        selector = _fresh_selector()
        code, text = run(["tune", "--shape", "8x8x8", "--quiet"])
    finally:
        folder.chmod(0o755)
    assert code == EXIT_ERROR and "cache:" not in text
    assert "Permission denied" in capsys.readouterr().err
    assert selector.stats.tuned == 0


def test_a_read_only_cache_by_request_is_refused_unless_everything_is_cached(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["tune", "--shape", "8x8x8", "--quiet"])[0] == EXIT_OK
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    selector = _fresh_selector()
    # Everything asked for is cached: nothing to write, the table is shown.
    code, text = run(["tune", "--shape", "8x8x8", "--quiet"])
    assert code == EXIT_OK and _rows(text)[0][10] == "cached"
    code, text = run(["tune", "--shape", "8x8x8", "--shape", "8x8x16", "--quiet"])
    assert code == EXIT_ERROR and text == ""
    assert "UNIMATMUL_CACHE_READONLY is set; nothing would be saved" in capsys.readouterr().err
    assert selector.stats.tuned == 0


def test_a_cache_write_that_fails_during_tuning_fails_the_command(isolated: Any) -> None:
    # The lock file turned into a folder after the check: the store refuses the write.
    isolated.selector.store.lock_path.mkdir()
    problem = Problem.from_shape(8, 8, 8, "f32")
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        isolated.selector.tune(problem, cli_output.target(None, None))
    with pytest.raises(
        CliError, match=r"the results were not written to the cache .*cannot be written"
    ) as info:
        tune_cli.check_cache_written(isolated.selector)
    assert info.value.code == EXIT_ERROR
    assert not isolated.cache_path.exists()


def test_a_cache_lock_that_cannot_be_opened_is_refused_before_tuning(
    isolated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    isolated.selector.store.lock_path.mkdir()
    code, _ = run(["tune", "--shape", "8x8x8", "--quiet"])
    assert code == EXIT_ERROR
    assert "its lock file" in capsys.readouterr().err
    assert isolated.selector.stats.tuned == 0


def test_a_gpu_that_torch_cannot_reach_exits_3(isolated: Any, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch reaches a GPU")
    code, _ = run(["info", "--array", "torch", "--device", "cuda"])
    assert code == EXIT_UNAVAILABLE
    assert re.search(
        r"unimatmul: error: torch \S+ (was built without CUDA|sees no GPU)", capsys.readouterr().err
    )


class _Broken:
    """A plugin command with a bug: what main() makes of an unexpected exception."""

    @hookimpl
    def unimatmul_register_commands(self, register: Callable[..., None]) -> None:
        register("broken", "fails", lambda p: None, self.run)

    def run(self, args: Any, out: Any) -> int:
        return {}["missing"]  # type: ignore[no-any-return]


def test_an_unexpected_error_is_one_line_and_exit_1(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    manager = PluginManager()
    manager.register(_Broken(), "broken")
    reset_plugin_manager(manager)
    assert run(["broken"]) == (EXIT_ERROR, "")
    err = capsys.readouterr().err
    assert (
        err
        == "unimatmul: error: KeyError: 'missing' (an unexpected error; UNIMATMUL_DEBUG=1 shows its traceback)\n"
    )
    monkeypatch.setenv("UNIMATMUL_DEBUG", "1")
    assert run(["broken"])[0] == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "KeyError: 'missing'" in err
    assert err.endswith("unimatmul: error: KeyError: 'missing'\n")


# --- no backend at all ----------------------------------------------------------------


def test_info_and_tuning_say_why_no_backend_is_there(
    isolated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # As when unimatmul is imported from a source tree that was never installed: no
    # entry point of group 'unimatmul', so not even the built-in backends register.
    selector = Selector(plugins=PluginManager(load_entry_points=False), settings=fast_config())
    set_selector(selector)
    code, text = run(["info"])
    assert code == EXIT_OK
    assert re.search(
        r"backends:\n  none serves numpy on cpu, so tuning measures only Default: no plugin is "
        r"registered in the 'unimatmul' entry-point group.*pip install -e '\.\[cpu\]'",
        text,
    ), text
    code, text = run(["info", "--json"])
    assert "never installed" in json.loads(text)["no_backend_reason"]
    a = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    with unimatmul.mode("tune"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unimatmul.matmul(a, a)
        unimatmul.matmul(a[:, :4], a[:4])
    said = [str(w.message) for w in caught if "no backend serves" in str(w.message)]
    assert len(said) == 1 and "tuning measures only Default" in said[0] and "pip install" in said[0]
    assert selector.stats.tuned == 2


# --- the package's face --------------------------------------------------------------


def test_dir_of_the_package_shows_its_public_names() -> None:
    assert dir(unimatmul) == sorted(unimatmul.__all__)
    assert "__version__" in dir(unimatmul) and "importlib" not in dir(unimatmul)


def test_the_readme_lists_every_exit_code() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("Exit codes:") :].split("\n\n")[0]
    codes = [EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_INTERRUPTED, EXIT_CLOSED_OUTPUT]
    assert all(f"`{code}`" in paragraph for code in codes), paragraph


# --- what a newcomer meets -------------------------------------------------------------


def _noisy(isolated: Any) -> None:
    """Harness settings under which every measurement counts as unstable (a spread above -1):
    real tuning whose records are all low-confidence, each with the tuner's warning."""
    isolated.selector.settings = HarnessConfig(**{**fast_config().to_dict(), "noise_spread": -1.0})


def test_tune_warnings_are_one_line_per_kind_after_the_table(
    isolated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _noisy(isolated)
    code, text = run(["tune", "--shape", "16x8x24", "--shape", "8x16x8", "--shape", "24x8x16"])
    assert code == EXIT_OK
    err = capsys.readouterr().err
    # One short line for the three warnings, none of Python's "<path>:<line>: RuntimeWarning".
    assert err == (
        "unimatmul: 3 warnings: measurements were unstable: records marked low-confidence (-v shows them)\n"
    )
    rows = _rows(text)
    assert [r[9] for r in rows] == ["low", "low", "low"]
    records = [r for _, _, r in isolated.selector.store.items()]
    assert len(records) == 3 and all(r.settings["confidence"] == "low" for r in records)
    assert "3 shapes of low confidence" in text

    # -v: each warning in full, still after the table and without Python's decoration.
    code, text = run(["tune", "--shape", "16x8x32", "--shape", "8x16x16", "-v"])
    assert code == EXIT_OK and len(_rows(text)) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("unimatmul: warning: measurements of ") for line in lines)
    assert "16x8x32 f32 were unstable" in lines[0] and "8x16x16 f32 were unstable" in lines[1]
    assert not any("RuntimeWarning" in line or ".py:" in line for line in lines)

    # --quiet: nothing at all on stderr.
    code, text = run(["tune", "--shape", "16x8x40", "--quiet"])
    assert code == EXIT_OK and _rows(text)[0][9] == "low"
    assert capsys.readouterr().err == ""


def test_a_warning_of_no_known_kind_is_cut_short() -> None:
    from unimatmul.cli import warning_summary

    long = "unimatmul: something odd happened " + "and went on " * 30
    with warning_summary.collecting() as caught:
        warnings.warn(long, RuntimeWarning, stacklevel=1)
        warnings.warn(long, RuntimeWarning, stacklevel=1)
        warnings.warn("unimatmul cache /x/c.msgpack: read-only", RuntimeWarning, stacklevel=1)
        warnings.warn("divide by zero", UserWarning, stacklevel=1)
    summary = warning_summary.lines(caught)
    assert len(summary) == 3
    assert summary[0].startswith("unimatmul: 2 warnings: something odd happened and went on")
    assert summary[0].endswith("... (-v shows them)") and len(summary[0]) < 160
    assert summary[1:] == [
        "unimatmul: warning: cache /x/c.msgpack: read-only",
        "unimatmul: warning: UserWarning: divide by zero",
    ]
    full = warning_summary.lines(caught, verbose=True)
    assert full[0] == f"unimatmul: warning: {long[len('unimatmul: ') :].strip()} (2 times)"
    assert warning_summary.lines(caught, verbose=True, quiet=True) == []


def test_bare_commands_print_their_help_and_version_is_there(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run([])
    assert code == EXIT_OK
    assert text.startswith("usage: unimatmul") and "info" in text and "tune" in text and "cache" in text
    code, text = run(["cache"])
    assert code == EXIT_OK
    assert text.startswith("usage: unimatmul cache") and "merge" in text and "recover" in text
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == EXIT_OK
    assert capsys.readouterr().out == f"unimatmul {unimatmul.__version__}\n"


def test_presets_are_listed_in_tune_help_and_info(isolated: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from unimatmul.core.plugins import get_plugin_manager

    presets = get_plugin_manager().presets()
    assert {"bert-base", "llama3-8b"} <= set(presets)
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = capsys.readouterr().out
    for preset in presets.values():
        assert re.search(rf"\n  {re.escape(preset.name)} +{len(preset.shapes)} shapes: ", text), text
    code, text = run(["info"])
    assert code == EXIT_OK
    line = next(line for line in text.splitlines() if line.startswith("presets:"))
    assert all(f"{p.name} ({len(p.shapes)} shapes)" in line for p in presets.values())
    code, text = run(["info", "--json"])
    assert json.loads(text)["presets"]["bert-base"]["shapes"] == len(presets["bert-base"].shapes)


class _Unloadable(OneDNNBackend):
    """A backend whose library search fails at length, as cuBLASLt's does on a CPU machine."""

    name = "unloadable"  # type: ignore[assignment]
    REASON = (
        "OSError: libunloadable could not be loaded (tried: "
        + ", ".join(f"/opt/lib{i}.so" for i in range(40))
        + ")"
    )

    def availability(self) -> str | None:
        return self.REASON


def test_info_says_why_a_backend_is_unavailable_in_a_few_words(isolated: Any, registered: Any) -> None:
    with registered(isolated.plugins, _Unloadable()):
        code, text = run(["info"])
        assert code == EXIT_OK
        line = next(line for line in text.splitlines() if "unloadable " in line)
        assert line.split(None, 2)[2] == "OSError: libunloadable could not be loaded"
        assert "`unimatmul info -v`" in text
        assert max(len(line) for line in text.splitlines() if "unavailable" in line) < 120
        code, text = run(["info", "-v"])
        assert code == EXIT_OK and _Unloadable.REASON in text
        code, text = run(["info", "--json"])
        [found] = [b for b in json.loads(text)["backends"] if b["name"] == "unloadable"]
        assert found["reason"] == _Unloadable.REASON


def test_the_tune_table_names_the_array_library_and_the_epilogue(
    isolated: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    code, text = run(["tune", "--shape", "24x16x8", "--array", "numpy", "--quiet"])
    assert code == EXIT_OK
    code, text = run(["tune", "--shape", "24x16x8", "--array", "torch", "--quiet"])
    assert code == EXIT_OK
    # Problems met with a bias and an activation, recorded, then tuned from the file.
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(tmp_path / "rec.jsonl"))
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((24, 8), (8, 16)))
    bias = rng.standard_normal(16).astype(np.float32)
    with unimatmul.mode("record"):
        out = unimatmul.matmul(a, b, bias=bias, activation="relu")
    expected = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    code, text = run(["tune", "--from", str(tmp_path / "rec.jsonl"), "--shape", "24x16x8", "--quiet"])
    assert code == EXIT_OK
    rows = _rows(text)
    assert [r[:4] for r in rows] == [
        ["24x16x8", "numpy", "f32", "none"],
        ["24x16x8", "numpy", "f32", "bias_relu"],
    ]
    assert [r[10] for r in rows] == ["cached", f"{float(rows[1][10]):.2f}"]
    code, text = run(["tune", "--shape", "24x16x8", "--array", "torch", "--quiet"])
    assert _rows(text)[0][:2] == ["24x16x8", "torch"]


def test_cache_show_has_a_confidence_column_and_in_situ_only_when_judged(
    isolated: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["tune", "--shape", "16x16x8", "--quiet"])[0] == EXIT_OK
    _noisy(isolated)
    assert run(["tune", "--shape", "8x16x16", "--quiet"])[0] == EXIT_OK
    code, text = run(["cache", "show"])
    assert code == EXIT_OK
    lines = text.splitlines()
    header = re.split(r"\s{2,}", next(line for line in lines if line.startswith("problem")))
    assert header == [
        "problem",
        "winner",
        "us",
        "default us",
        "speedup",
        "bound",
        "confidence",
    ]  # nothing judged
    confidence = {line.split()[0]: line.split()[-1] for line in lines if line.startswith("gemm:")}
    assert sorted(confidence.values()) == ["high", "low"]
    assert next(v for k, v in confidence.items() if "m8n16k16" in k) == "low"
    assert "1 entry of low confidence" in text
    data = json.loads(run(["cache", "show", "--json"])[1])
    assert sorted(e["settings"]["confidence"] for e in data) == ["high", "low"]


def test_a_cpu_tunableop_export_imports_back_without_a_namespace(
    isolated: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    assert run(["tune", "--shape", "16x24x8", "--array", "numpy", "--quiet"])[0] == EXIT_OK
    # Only numpy entries: TunableOp is PyTorch's, and the message says the array library is why.
    code, _ = run(["cache", "export", "--format", "tunableop", "-o", str(tmp_path / "n.csv")])
    assert code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert re.search(r"holds entries tuned on numpy arrays .* tuned with --array torch", err), err
    assert "with torch installed" not in err and not (tmp_path / "n.csv").exists()
    # A win must take no time at all (min_gain 1): Default wins, the one winner TunableOp names
    # on a CPU (a oneDNN winner would be skipped, rightly, and the file would be empty).
    isolated.selector.settings = HarnessConfig(**{**fast_config().to_dict(), "min_gain": 1.0})
    assert run(["tune", "--shape", "16x24x8", "--array", "torch", "--quiet"])[0] == EXIT_OK
    stored = {ns: (k, r) for ns, k, r in isolated.selector.store.items()}
    [torch_ns] = [ns for ns in stored if ns.endswith("/torch")]
    csv = tmp_path / "t.csv"
    # Two namespaces: the one of torch on this CPU is chosen; no --namespace either way.
    code, text = run(["cache", "export", "--format", "tunableop", "-o", str(csv)])
    assert code == EXIT_OK and f"wrote 1 row of {torch_ns}" in text, text
    other = tmp_path / "other.msgpack"
    code, text = run(["cache", "import", "tunableop", str(csv), "--cache", str(other)])
    assert code == EXIT_OK and f"imported 1 entry into {torch_ns}" in text, text
    from unimatmul.cache.file_store import MsgpackFileStore

    [(ns, key, record)] = list(MsgpackFileStore(other, read_only=True).items())
    assert (ns, key) == (torch_ns, stored[torch_ns][0])
    assert record.winner == stored[torch_ns][1].winner == DEFAULT.identity  # what TunableOp names here
    assert record.winner_s == pytest.approx(stored[torch_ns][1].winner_s, rel=1e-9)


def test_bad_settings_are_refused_before_any_command(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value, said in [
        ("UNIMATMUL_BUCKETS", "weird", "UNIMATMUL_BUCKETS='weird': bad bucket spec 'weird'"),
        ("UNIMATMUL_LRU_SIZE", "-1", "UNIMATMUL_LRU_SIZE='-1' is less than 1"),
        ("UNIMATMUL_LRU_SIZE", "abc", "UNIMATMUL_LRU_SIZE='abc' is not an integer"),
    ]:
        monkeypatch.setenv(name, value)
        for argv in (["info"], ["cache", "path"]):
            assert run(argv) == (EXIT_USAGE, "")
            err = capsys.readouterr().err
            assert err.startswith(f"unimatmul: error: {said}") and err.count("\n") == 1, err
        monkeypatch.delenv(name)


def test_tune_writes_the_cache_file_at_most_once_a_second_and_all_at_the_end(
    isolated: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each write re-reads, merges and replaces the whole file: during a run it is written
    # at most every FLUSH_EVERY_S (here an hour: the first record, then the rest at the end).
    from unimatmul.cli import tune as tune_cli

    monkeypatch.setattr(tune_cli, "FLUSH_EVERY_S", 3600.0)
    store = isolated.selector.store
    writes = []
    replace = store._replace_file

    def counted(*args: Any, **kwargs: Any) -> Any:
        writes.append(1)
        return replace(*args, **kwargs)

    monkeypatch.setattr(store, "_replace_file", counted)
    shapes = ["40x24x16", "24x40x16", "16x24x40", "32x32x8"]
    code, _ = run(["tune", *[x for s in shapes for x in ("--shape", s)], "--quiet"])
    assert code == EXIT_OK
    assert len(writes) == 2  # the first record, then the three others together
    from unimatmul.cache.file_store import read_file

    assert read_file(isolated.cache_path).count() == 4 and store.pending == 0  # all in the file
    assert store.autoflush_s is None  # the store is the process's: as it was after the run
