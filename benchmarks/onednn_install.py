"""What installing a oneDNN wheel costs: download, disk, time, and what its libdnnl needs.

For each requirement, a fresh venv in a temporary folder: ``du`` of the venv before and
after ``pip install`` (the wheels install into ``<prefix>/lib``, so site-packages alone
would miss them), the install's wall-clock time, each installed distribution's size
(from its RECORD), and for the libdnnl it installed: its DT_NEEDED libraries, whether a
plain ``ctypes.CDLL`` loads it, and whether the backend's loader does::

    python benchmarks/onednn_install.py onednn-cpu-gomp==2023.2.0 onednn==2026.1.0 \\
        "onednn-cpu-tbb==2023.2.0 intel-cmplr-lib-rt==2026.2.0" \\
        [--wheels DIR] [--out benchmarks/results/onednn-eval/install.json]

(one argument, one venv; requirements separated by spaces go into the same venv).

``--wheels DIR``: install from wheels already downloaded there (``pip download -d DIR
REQ``), with no index, so the time is the install's own and not the network's; the
wheel files' sizes are then reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import ctypes, importlib.metadata as md, json, os, sys
import importlib.util
spec = importlib.util.spec_from_file_location("_dnnl", os.path.join(sys.argv[1], "backends", "onednn", "_dnnl.py"))
dnnl_mod = importlib.util.module_from_spec(spec)
sys.modules["_dnnl"] = dnnl_mod  # dataclasses look their module up there
spec.loader.exec_module(dnnl_mod)
fresh = {"pip", "setuptools", "wheel"}
dists = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    if name in fresh:
        continue
    size = 0
    for f in dist.files or []:
        try:
            size += os.path.getsize(f.locate())
        except OSError:
            pass
    dists[name] = {"version": dist.version, "mib": round(size / 2**20, 1)}
lib = os.path.join(sys.prefix, "lib", "libdnnl.so.3")
out = {"distributions": dists, "libdnnl": lib if os.path.exists(lib) else None}
if out["libdnnl"]:
    out["needed"] = dnnl_mod._elf_needed(lib)
    try:
        ctypes.CDLL(lib)
        out["plain_dlopen"] = "ok"
    except OSError as exc:
        out["plain_dlopen"] = str(exc)
    d = dnnl_mod.Dnnl(lib)
    out["version"] = d.version()
    out["cpu_runtime"] = d.cpu_runtime
    try:
        d.engine
        out["cpu_engine"] = "ok"
    except Exception as exc:
        out["cpu_engine"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def du_kib(path: Path) -> int:
    return int(
        subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


def measure(requirement: str, wheels: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="unimatmul-onednn-install-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        before = du_kib(venv)
        site_before = du_kib(next((venv / "lib").glob("python3*/site-packages")))
        cmd = [str(python), "-m", "pip", "install", "-q", *requirement.split()]
        if wheels is not None:
            cmd += ["--no-index", "--find-links", str(wheels)]
        started = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        install_s = time.perf_counter() - started
        after = du_kib(venv)
        site_after = du_kib(next((venv / "lib").glob("python3*/site-packages")))
        # cwd: not the repository, whose unimatmul.egg-info would count as installed.
        probe = subprocess.run(
            [str(python), "-c", _PROBE, str(REPO)], capture_output=True, text=True, cwd=tmp
        )
        if probe.returncode != 0:
            msg = f"probing the {requirement} venv failed:\n{probe.stderr}"
            raise RuntimeError(msg)
        result: dict[str, Any] = {
            "requirement": requirement,
            "install_s": round(install_s, 1),
            "from": "local wheels, no index" if wheels is not None else "the package index",
            "venv_growth_mib": round((after - before) / 1024, 1),
            "site_packages_growth_mib": round((site_after - site_before) / 1024, 1),
            **json.loads(probe.stdout.strip().splitlines()[-1]),
        }
    if wheels is not None:
        # A wheel's file name starts with its normalised name and version.
        installed = {(n.lower().replace("-", "_"), d["version"]) for n, d in result["distributions"].items()}
        files = [w for w in wheels.glob("*.whl") if tuple(w.name.split("-")[:2]) in installed]
        result["wheels"] = {w.name: round(w.stat().st_size / 2**20, 1) for w in sorted(files)}
        result["download_mib"] = round(sum(w.stat().st_size for w in files) / 2**20, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("requirements", nargs="+")
    parser.add_argument("--wheels", type=Path, default=None, help="install from these downloaded wheels")
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "onednn-eval" / "install.json"
    )
    args = parser.parse_args(argv)
    results = []
    for requirement in args.requirements:
        result = measure(requirement, args.wheels)
        results.append(result)
        print(
            f"{requirement}: {result['venv_growth_mib']:,.0f} MiB installed "
            f"({result.get('download_mib', '?')} MiB of wheels) in {result['install_s']} s; "
            f"plain dlopen: {result.get('plain_dlopen')}; CPU engine: {result.get('cpu_engine')}",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    platform = {"python": sys.version.split()[0], "os": os.uname().sysname + " " + os.uname().release}
    args.out.write_text(
        json.dumps({"platform": platform, "results": results}, indent=2) + "\n", encoding="utf-8"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
