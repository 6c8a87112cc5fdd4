"""Offline tuning across processes: record -> ``unimatmul tune --from`` -> cached.

Every step runs in its own process, as a user would run them, with no model code
changed: routing comes from ``UNIMATMUL_TORCH=1`` or ``python -m unimatmul.torch``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
UNTUNED = REPO / "tests" / "interop" / "data" / "untuned.csv"

# The "model script": plain PyTorch, prints what the routed kernels saw.
MODEL = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 64))
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        y = model(x)
    import unimatmul.torch as ut
    print(json.dumps({"stats": ut.stats(), "enabled": ut.is_enabled(), "sum": float(y.double().sum())}))
    """
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(
        UNIMATMUL_CACHE=str(tmp_path / "cache.msgpack"),
        UNIMATMUL_RECORD_FILE=str(tmp_path / "recorded.jsonl"),
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _onednn() -> bool:
    from torch_helpers import onednn_available

    from unimatmul.core.plugins import PluginManager
    from unimatmul.tuning.selector import Selector

    return onednn_available(Selector(plugins=PluginManager()))


# These tune CPU problems in another process: they need a CPU backend (the GPU machine
# has no oneDNN).
needs_onednn = pytest.mark.skipif(not _onednn(), reason="oneDNN is not available here")


@needs_onednn
def test_record_then_tune_from_then_cached(tmp_path: Path) -> None:
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    # 1. Record: routing from the environment, nothing tuned, every problem written once.
    out = _run(
        [sys.executable, str(script)],
        _env(tmp_path, UNIMATMUL_TORCH="1", UNIMATMUL_MODE="record"),
        tmp_path,
    )
    recorded = json.loads(out.splitlines()[-1])
    assert recorded["enabled"] is True
    assert recorded["stats"]["by_op"]["addmm"]["routed"] == 2
    assert recorded["stats"]["kernel"] == 0
    lines = [json.loads(line) for line in (tmp_path / "recorded.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    assert all(line["array"] == "torch" and line["device"] == "cpu" for line in lines)
    assert not (tmp_path / "cache.msgpack").exists()  # record mode tunes nothing
    # Recording again (another process) adds nothing: the problems are already there.
    _run(
        [sys.executable, str(script)], _env(tmp_path, UNIMATMUL_TORCH="1", UNIMATMUL_MODE="record"), tmp_path
    )
    assert len((tmp_path / "recorded.jsonl").read_text().splitlines()) == 2
    # 2. Tune them in another process, on the array library and device they were met on.
    results = tmp_path / "tuned.json"
    _run(
        [
            sys.executable,
            "-m",
            "unimatmul.cli",
            "tune",
            "--from",
            "recorded.jsonl",
            "--budget-ms",
            "5",
            "--json",
            str(results),
            "--quiet",
        ],
        _env(tmp_path),
        tmp_path,
    )
    tuned = json.loads(results.read_text())
    assert sorted(r["problem"] for r in tuned) == sorted(line["problem"] for line in lines)
    assert all(r["source"] == "tuned" for r in tuned)
    # 3. Cached: the launcher, no environment switch; every call finds its record.
    out = _run([sys.executable, "-m", "unimatmul.torch", str(script)], _env(tmp_path), tmp_path)
    cached = json.loads(out.splitlines()[-1])
    assert cached["stats"]["by_source"] == {"cache": 2}
    # A kernel runs where it won, and where a Default record offers a tie: its confirmation
    # window's first call is the kernel's (tuning/confirm.py, tie_of).
    from unimatmul.cache.file_store import MsgpackFileStore
    from unimatmul.tuning.confirm import tie_of

    records = [r for _, _, r in MsgpackFileStore(tmp_path / "cache.msgpack", read_only=True).items()]
    assert len(records) == len(tuned)
    ties = {tie_of(r) for r in records} - {None}
    kernels = sum(1 for r in records if r.winner != "default/default" or tie_of(r) is not None)
    assert cached["stats"]["kernel"] == kernels
    assert set(cached["stats"]["by_label"]) <= {
        "unimatmul::addmm [default]",
        *(f"unimatmul::addmm [{r['winner']}]" for r in tuned),
        *(f"unimatmul::addmm [{t}]" for t in ties),
    }
    assert abs(cached["sum"] - recorded["sum"]) <= 1e-3 * max(1.0, abs(recorded["sum"]))


@needs_onednn
def test_tune_from_a_tunableop_untuned_file(tmp_path: Path) -> None:
    results = tmp_path / "tuned.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unimatmul.cli",
            "tune",
            "--from",
            str(UNTUNED),
            "--array",
            "torch",
            "--device",
            "cpu",
            "--budget-ms",
            "2",
            "--json",
            str(results),
            "--quiet",
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tuned = json.loads(results.read_text())
    shapes = sorted(r["problem"].split(":")[4] for r in tuned)
    assert shapes == ["m12288n64k2048b1", "m2n8192k3584b1", "m32n768k1024b1"]
    # The ScaledGemm row is a scaled (fp8, row-wise) problem, tuned with torch._scaled_mm as Default.
    (scaled,) = [r for r in tuned if r["problem"].startswith("scaled_gemm:")]
    assert scaled["problem"].endswith(":scales=rowwise,rowwise:fastaccum=0")
    assert scaled["default_s"] > 0


def test_tune_from_a_missing_file_is_exit_3(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "unimatmul.cli", "tune", "--from", str(tmp_path / "nope.jsonl")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3
    assert "nope.jsonl" in done.stderr
