"""How long does the first ``unimatmul.torch.enable()`` take on a fresh machine?

Each run is a new process with an empty extension folder (``TORCH_EXTENSIONS_DIR``), so no
build of the native routing kernels exists, as on a machine that never ran unimatmul:

- ``wait``: ``UNIMATMUL_TORCH_NATIVE_BUILD=wait``, the behaviour before the background build
  (``enable()`` compiles the kernels before it returns);
- ``background`` (the default): ``enable()`` returns while a process of its own builds them;
- ``built``: a process after a ``background`` run, the build present (every later process).

Per run: ``import torch``, ``enable()``, the first routed ``torch.mm`` (from before
``enable()``: what a program waits for), and the time until the native kernels serve the
CPU key; every product is checked against a float64 reference. The load average at the
start of each run is kept: the CI machine is shared.

    python benchmarks/native_build.py --runs 3 --out benchmarks/results/native-build-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROGRAM = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import unimatmul.torch as ut
from unimatmul.torch import native, routing
gen = torch.Generator().manual_seed(0)
a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
ref = (a.double() @ b.double()).float()
right = True
t2 = time.perf_counter()
ut.enable()
t3 = time.perf_counter()
state = native.status()["state"]
right &= torch.allclose(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
t4 = time.perf_counter()
calls = 1
while not routing._router.native_keys and time.perf_counter() - t2 < 1800:
    right &= torch.allclose(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
    calls += 1
    time.sleep(0.02)
t5 = time.perf_counter()
right &= torch.allclose(torch.mm(a, b), ref, rtol=1e-4, atol=1e-4)
print(json.dumps({"import_torch_s": t1 - t0, "enable_s": t3 - t2, "first_call_s": t4 - t2,
                  "native_s": t5 - t2, "state_at_enable": state, "calls_before_native": calls,
                  "right": bool(right), "native": bool(routing._router.native_keys)}))
"""


def run_once(folder: Path, how: str) -> dict[str, Any]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    environment |= {
        "TORCH_EXTENSIONS_DIR": str(folder),
        "UNIMATMUL_CACHE": str(folder / "cache.msgpack"),
        "UNIMATMUL_TORCH_NATIVE_BUILD": "background" if how == "built" else how,
    }
    load = os.getloadavg()[0]
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        capture_output=True,
        text=True,
        env=environment,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        msg = f"the {how} run failed:\n{done.stderr[-3000:]}"
        raise SystemExit(msg)
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found | {"how": how, "load_average": load}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--out", type=Path, help="folder for results.json and results.md")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for how in ("wait", "background"):
            with tempfile.TemporaryDirectory(prefix="unimatmul-native-") as name:
                runs.append(run_once(Path(name), how) | {"run": i})
                print(_row(runs[-1]), flush=True)
                if how == "background":
                    # The background build's process may still be writing: wait for its lock.
                    runs.append(run_once(Path(name), "built") | {"run": i})
                    print(_row(runs[-1]), flush=True)
    import torch

    data = {
        "what": "first unimatmul.torch.enable() in a process with no native build present",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "runs": runs,
    }
    table = _table(runs)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(data, indent=2) + "\n")
        (args.out / "results.md").write_text(table + "\n")
    if not all(r["right"] and r["native"] for r in runs):
        print("a run gave a wrong product or never reached the native kernels", file=sys.stderr)
        return 1
    return 0


HEADER = (
    "| run | how | load avg | import torch s | enable() s | first routed mm s | native kernels serve after s |",
    "|---|---|---|---|---|---|---|",
)


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['run']} | {r['how']} | {r['load_average']:.1f} | {r['import_torch_s']:.2f} | {r['enable_s']:.2f} "
        f"| {r['first_call_s']:.2f} | {r['native_s']:.2f} |"
    )


def _table(runs: list[dict[str, Any]]) -> str:
    lines = list(HEADER) + [_row(r) for r in runs]
    for how in ("wait", "background", "built"):
        mine = sorted(r["enable_s"] for r in runs if r["how"] == how)
        native = sorted(r["native_s"] for r in runs if r["how"] == how)
        if mine:
            lines.append(
                f"\n{how}: enable() median {mine[len(mine) // 2]:.2f} s (range {mine[0]:.2f}-{mine[-1]:.2f}), "
                f"native kernels serving after median {native[len(native) // 2]:.2f} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
