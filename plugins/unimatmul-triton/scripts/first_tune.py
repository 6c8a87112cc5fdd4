"""First-time tuning per product on a GPU, with an empty Triton cache: compiled at prepare, or ahead.

    OUT=some/dir python plugins/unimatmul-triton/scripts/first_tune.py [--modes serial,ahead] [--timeout-s 240]

Modes, each in its own child process (``gpu_check.py --tune-child``) with a fresh
``TRITON_CACHE_DIR`` and a fresh unimatmul cache, tuning the shapes of gpu_check's tuning
part in order (later shapes share binaries of earlier ones, as a model's products do):

- ``serial``: ``UNIMATMUL_TRITON_PRECOMPILE=0``: each candidate's kernel and launcher are
  compiled when the harness prepares it, one after another (what Triton's JIT does);
- ``ahead``: the default: every offered config's specialisation not compiled yet is
  compiled in the plugin's thread pool as soon as the candidates are listed, each new
  launcher built there too (``unimatmul_triton/compiler.py``).

Per shape: seconds of ``unimatmul.matmul`` in tune mode, the specialisations compiled and
the launchers built for it (the others were shared with earlier shapes), and the phases of
the tuning ("prepare" holds what compiling was not done ahead). Writes
``first-tune.json`` and ``first-tune.md`` under $OUT (default ./first-tune-out) and prints
the table. Run it after scripts/gpu_install.sh and scripts/gpu_install_triton.sh (the
plugin's entry point must exist).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_check import TUNE_DECODE, TUNE_GENERAL  # noqa: E402

MODES = {
    "serial": {"UNIMATMUL_TRITON_PRECOMPILE": "0"},
    "ahead": {"UNIMATMUL_TRITON_PRECOMPILE": "1"},
}


def run_mode(mode: str, shapes: list[tuple[int, int, int, bool]], timeout_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"umm-first-tune-{mode}-") as tmp:
        env = dict(os.environ)
        env.update(
            TRITON_CACHE_DIR=str(Path(tmp) / "triton-cache"),
            UNIMATMUL_CACHE=str(Path(tmp) / "cache.msgpack"),
            UNIMATMUL_MODE="tune",
            TUNE_PHASES="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(MODES[mode])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE / "gpu_check.py"), "--tune-child", json.dumps(shapes)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            output, rc, tail = proc.stdout, proc.returncode, proc.stderr[-2000:]
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            rc, tail = -1, "timed out"
    lines = [json.loads(x[5:]) for x in output.splitlines() if x.startswith("TUNE ")]
    found: dict[str, Any] = {
        "rc": rc,
        "wall_s": time.perf_counter() - t0,
        "shapes": lines,
        "stderr_tail": tail,
    }
    if lines:
        found["median_tune_s"] = statistics.median(x["tune_s"] for x in lines)
        found["total_tune_s"] = sum(x["tune_s"] for x in lines)
    return found


def markdown(data: dict[str, Any]) -> str:
    modes = [m for m in data["modes"] if data["modes"][m].get("shapes")]
    rows = ["# First-time tuning per product (empty Triton cache)", ""]
    head = (
        "| shape | layout | "
        + " | ".join(f"{m} s | {m} compiles/launchers | {m} prepare s" for m in modes)
        + " |"
    )
    rows += [head, "|" + "---|" * (2 + 3 * len(modes))]
    by_mode = {m: {x["shape"] + str(x["linear"]): x for x in data["modes"][m]["shapes"]} for m in modes}
    for m_, n_, k_, linear in data["shapes"]:
        key = f"{m_}x{n_}x{k_}{linear}"
        cells = [f"{m_}x{n_}x{k_}", "x @ W.T" if linear else "plain"]
        for m in modes:
            x = by_mode[m].get(key)
            if x is None:
                cells += ["-", "-", "-"]
                continue
            phases = x.get("phases_s", {})
            cells += [
                f"{x['tune_s']:.2f}",
                f"{x.get('triton_compiles', '?')}/{x.get('triton_launchers', '?')}",
                f"{phases.get('prepare', float('nan')):.2f}",
            ]
        rows.append("| " + " | ".join(cells) + " |")
    rows.append("")
    for m in modes:
        part = data["modes"][m]
        rows.append(
            f"- {m}: median {part['median_tune_s']:.2f} s, total {part['total_tune_s']:.2f} s (rc {part['rc']})"
        )
    return "\n".join(rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="serial,ahead", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per mode")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; the modes are {', '.join(MODES)}")
    shapes = [(m, n, k, True) for m, n, k in TUNE_DECODE] + [(m, n, k, False) for m, n, k in TUNE_GENERAL]
    out = Path(os.environ.get("OUT") or "first-tune-out")
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"shapes": shapes, "modes": {}}
    for mode in modes:
        data["modes"][mode] = run_mode(mode, shapes, args.timeout_s)
        (out / "first-tune.json").write_text(json.dumps(data, indent=1))
        part = data["modes"][mode]
        print(
            f"{mode}: rc {part['rc']}, {len(part['shapes'])} shapes, median {part.get('median_tune_s', float('nan')):.2f} s"
        )
        if part["rc"] != 0:
            print(part["stderr_tail"])
    text = markdown(data)
    (out / "first-tune.md").write_text(text)
    print(text)
    return 0 if all(data["modes"][m]["rc"] == 0 for m in modes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
