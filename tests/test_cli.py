"""The ``unimatmul`` command: what it prints and the exit codes scripts rely on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from unimatmul.cli import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main
from unimatmul.hookspecs import hookimpl
from unimatmul.selector import Selector, set_selector
from unimatmul_backends.onednn import OneDNNBackend

ONEDNN_VERSIONS = OneDNNBackend().versions()
ONEDNN_VERSION = ONEDNN_VERSIONS["onednn"]


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
    header = text.splitlines()[0].split()
    assert header == [
        "shape",
        "dtype",
        "default",
        "us",
        "best",
        "candidate",
        "best",
        "us",
        "speedup",
        "tune",
        "s",
    ]
    [row] = _rows(text)
    assert row[:2] == ["64x48x32", "f32"]
    [(_, key, record)] = list(isolated.selector.store.items())
    assert key == "gemm:f32.f32.f32:f32:NN:m64n48k32b1:ld32,48,48:st0,0,0:beta0:none:al16"
    assert row[3] == record.winner
    assert float(row[2].replace(",", "")) == pytest.approx(record.default_s * 1e6, abs=0.06)
    assert row[5] == f"{record.speedup:.2f}x"
    assert re.fullmatch(r"\d+\.\d\d", row[6])  # seconds spent tuning
    assert "geometric-mean speedup over default" in text
    assert f"cache: {isolated.cache_path} (1 entries)" in text
    assert isolated.cache_path.exists()

    # Again: answered from the cache, nothing tuned.
    tuned = isolated.selector.stats.tuned
    code, again = run(["tune", "--shape", "64x48x32", "--quiet"])
    assert code == EXIT_OK
    [row2] = _rows(again)
    assert row2[6] == "cached" and row2[3] == record.winner
    assert isolated.selector.stats.tuned == tuned

    # --force tunes again.
    code, forced = run(["tune", "--shape", "64x48x32:f32", "--force", "--quiet"])
    assert code == EXIT_OK and _rows(forced)[0][6] != "cached"
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


def test_no_backend_for_the_device_exits_3(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_DISABLE_PLUGINS", "onednn")
    set_selector(Selector(settings=isolated.selector.settings))
    code, text = run(["tune", "--shape", "8x8x8", "--quiet"])
    assert code == EXIT_UNAVAILABLE
    assert "no backend is available for numpy on cpu" in text
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
