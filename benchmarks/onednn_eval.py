"""oneDNN 3.2 (``onednn-cpu-gomp``) against oneDNN 3.13 (``onednn``): candidates, start-up, tuned speed.

The two wheels write the same ``<prefix>/lib/libdnnl.so.3``, so they live in two
environments; each library runs in a worker process of its own (``UNIMATMUL_DNNL_LIB``),
driven from here so that the measurements interleave::

    python benchmarks/onednn_eval.py --lib 3.2=installed --lib 3.13=../venv-onednn313/lib/libdnnl.so.3 \\
        [--presets bert-base gpt2 ...] [--cpus all 1] [--rounds 7] [--out benchmarks/results/onednn-eval]

``installed`` means the library this environment finds by itself. What it measures:

- **candidates**: the implementation names each library lists for f32 and bf16 problems,
  on this CPU and with ``ONEDNN_MAX_CPU_ISA=AVX2`` (an AVX2-only CPU, emulated);
- **start-up**: in fresh processes, alternating libraries, the time to import the
  backend and load the library, to create the CPU engine and to list the first problem;
- **presets**: per shape (f32, NumPy), a tuning run (the harness of ``unimatmul tune``,
  with pruning off so that every candidate gets a median), then ``--reps`` confirmation
  runs of Default (numpy.matmul) against the best oneDNN candidate of that library; the
  median of those is the number. Both libraries' workers stay alive and take turns,
  run by run, the order swapped each time, so slow drift in the machine's load hits
  both alike; the Default time measured in each worker is the check on that (its ratio
  between the workers should stay near 1).
  ``--cpus 1`` pins both workers to one core (both runtimes then run one thread), which
  takes the other tenants' threads out of oneDNN's barriers.

Writes ``onednn-eval.json`` (every number) and ``onednn-eval.md`` (tables) under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_presets, beside this file

SMALL = ("8x8x8", "32x32x32", "1x768x768", "1x3072x768")  # per-call overhead dominates


# --- the worker: one library, commands on stdin, one JSON line per answer ---------------


def _impl_problems() -> dict[str, Any]:
    from unimatmul.problem import Problem

    problems: dict[str, Any] = {}
    for dtype in ("f32", "bf16"):
        problems[f"128x768x768:{dtype}"] = Problem.parse_shape(f"128x768x768:{dtype}")
        problems[f"12x128x128x64:{dtype}"] = Problem.parse_shape(f"12x128x128x64:{dtype}")
        problems[f"1x4096x4096:{dtype}"] = Problem.parse_shape(f"1x4096x4096:{dtype}")
        # torch.nn.Linear's layout: x @ W.T with W stored [n, k], plus bias and GELU.
        linear = Problem.from_shape(128, 3072, 768, dtype, epilogue="bias_gelu")
        problems[f"128x3072x768:{dtype} NT bias_gelu"] = dataclasses.replace(linear, trans_b=True, ldb=768)
    return problems


class Worker:
    """Answers the driver's commands for the library this process loaded."""

    def __init__(self) -> None:
        from cpu_presets import machine_facts  # noqa: F401  (fails early if missing)

        from unimatmul.arrays import CPU, adapter_for_kind
        from unimatmul.backend import Target
        from unimatmul.cache import open_store
        from unimatmul.harness import HarnessConfig
        from unimatmul.plugins import PluginManager
        from unimatmul.selector import Selector
        from unimatmul_backends.onednn import OneDNNBackend

        self.tmp = tempfile.TemporaryDirectory(prefix="unimatmul-onednn-eval-")
        self.plugins = PluginManager()
        # Unpruned: every oneDNN candidate gets a median, also where Default is far ahead
        # (the question here is how the two libraries compare, not whether to use them).
        self.settings = HarnessConfig(prune_ratio=math.inf, first_prune_ratio=math.inf)
        self.target = Target(adapter_for_kind("numpy"), CPU)
        store = open_store(Path(self.tmp.name) / "cache.msgpack")
        self.selector = Selector(plugins=self.plugins, store=store, settings=self.settings)
        backend = self.plugins.backends()["onednn"]
        assert isinstance(backend, OneDNNBackend)
        self.backend = backend

    def facts(self) -> dict[str, Any]:
        from cpu_presets import machine_facts

        reason = self.backend.availability()
        facts: dict[str, Any] = {"available": reason is None, "reason": reason}
        if reason is None:
            dnnl = self.backend._library()
            facts.update(path=dnnl.path, versions=self.backend.versions(), machine=None)
            facts["machine"] = machine_facts(self.selector, self.target)
        facts["affinity"] = sorted(os.sched_getaffinity(0))
        return facts

    def impls(self) -> dict[str, list[str]]:
        from unimatmul.errors import UnsupportedProblem

        out: dict[str, list[str]] = {}
        for name, problem in _impl_problems().items():
            try:
                out[name] = self.backend.impls(problem)
            except UnsupportedProblem as exc:
                out[name] = [f"unsupported: {exc}"]
        return out

    def tune(self, shape: str) -> dict[str, Any]:
        """Tune ``shape`` (f32) with every candidate measured to the end (no pruning)."""
        from cpu_presets import best_backend

        from unimatmul.problem import Problem

        problem = Problem.parse_shape(f"{shape}:f32")
        started = time.perf_counter()
        record = self.selector.tune(problem, self.target, force=True)
        best_id, best_us = best_backend(record)
        return {
            "tune_s": time.perf_counter() - started,
            "winner": record.winner,
            "tuning_us": {r.identity: r.median_s * 1e6 for r in record.results if r.median_s},
            "best_onednn": best_id,
            "best_onednn_tuning_us": best_us,
        }

    def confirm(self, shape: str, identity: str) -> tuple[float, float]:
        """Median us per call of Default and of ``identity``, measured afresh."""
        from cpu_presets import confirm

        from unimatmul.problem import Problem

        problem = Problem.parse_shape(f"{shape}:f32")
        default_s, candidate_s = confirm(problem, self.target, self.selector, identity, self.settings)
        return default_s * 1e6, candidate_s * 1e6


def worker_main(cpus: str) -> int:
    if cpus != "all":
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})  # before any thread pool starts
    # oneDNN 3.13 prints its verbose errors on stdout: answers go through a private fd.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    worker = Worker()
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            break
        try:
            result: Any = getattr(worker, op)(*command.get("args", []))
            answers.write(json.dumps({"ok": result}) + "\n")
        except Exception as exc:  # report, keep serving: one bad shape is not the run
            answers.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
    return 0


# --- the driver --------------------------------------------------------------------------


class Client:
    def __init__(self, label: str, lib: str, cpus: str = "all", isa: str | None = None) -> None:
        env = dict(os.environ)
        env.pop("UNIMATMUL_DNNL_LIB", None)
        if lib != "installed":
            env["UNIMATMUL_DNNL_LIB"] = lib
        if isa:
            env["ONEDNN_MAX_CPU_ISA"] = isa
        env.pop("OCL_ICD_FILENAMES", None)  # each worker finds its own, as a user's process would
        self.label = label
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--cpus", cpus],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, op: str, *args: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            msg = f"worker {self.label} died (exit {self.proc.wait()})"
            raise RuntimeError(msg)
        answer = json.loads(line)
        if "error" in answer:
            msg = f"worker {self.label}: {op}{args}: {answer['error']}"
            raise RuntimeError(msg)
        return answer["ok"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_STARTUP = """
import json, time
t0 = time.perf_counter()
from unimatmul_backends.onednn import _dnnl
from unimatmul_backends.onednn.backend import OneDNNBackend
t1 = time.perf_counter()
dnnl = _dnnl.get_dnnl()
t2 = time.perf_counter()
dnnl.engine
t3 = time.perf_counter()
dnnl.list_impls(_dnnl.MatmulSpec(1, 128, 768, 768))
t4 = time.perf_counter()
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "load_ms": 1e3 * (t2 - t1),
                  "engine_ms": 1e3 * (t3 - t2), "first_list_ms": 1e3 * (t4 - t3)}))
"""


def startup(libs: dict[str, str], rounds: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, float]]] = {label: [] for label in libs}
    order = list(libs)
    for i in range(rounds):
        for label in order if i % 2 == 0 else order[::-1]:
            env = {
                k: v for k, v in os.environ.items() if k not in ("UNIMATMUL_DNNL_LIB", "OCL_ICD_FILENAMES")
            }
            if libs[label] != "installed":
                env["UNIMATMUL_DNNL_LIB"] = libs[label]
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", _STARTUP], env=env, capture_output=True, text=True, check=True
            )
            sample = json.loads(done.stdout.strip().splitlines()[-1])
            sample["process_ms"] = 1e3 * (time.perf_counter() - started)
            samples[label].append(sample)
    return {
        label: {key: statistics.median(s[key] for s in runs) for key in runs[0]} | {"rounds": len(runs)}
        for label, runs in samples.items()
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lib", action="append", default=[], help="LABEL=PATH or LABEL=installed (twice)")
    parser.add_argument("--presets", nargs="*", default=["bert-base", "gpt2", "llama3-8b", "resnet50"])
    parser.add_argument(
        "--small", action=argparse.BooleanOptionalAction, default=True, help="tiny shapes too"
    )
    parser.add_argument(
        "--cpus",
        nargs="+",
        default=["all", "1"],
        help="configurations to run the presets in: 'all' cores or a core count to pin to, each with an "
        "optional ':ISA' for ONEDNN_MAX_CPU_ISA (e.g. 1:AVX2)",
    )
    parser.add_argument("--rounds", type=int, default=7, help="start-up measurements per library")
    parser.add_argument("--reps", type=int, default=3, help="confirmation runs per shape and library")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "onednn-eval")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.cpus[0])
    libs = dict(item.split("=", 1) for item in args.lib)
    if len(libs) < 1:
        parser.error("give --lib LABEL=PATH at least once")

    from unimatmul.plugins import PluginManager

    presets = PluginManager().presets()
    shapes = [(name, shape) for name in args.presets for shape in presets[name].shapes]
    if args.small:
        shapes += [("small", shape) for shape in SMALL]
    args.out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "note": args.note,
        "libs": libs,
        "load_start": os.getloadavg(),
    }

    def save() -> None:
        data["load_end"] = os.getloadavg()
        (args.out / "onednn-eval.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        (args.out / "onednn-eval.md").write_text(markdown(data), encoding="utf-8")

    data["facts"] = {}
    data["impls"] = {}
    for isa in (None, "AVX2"):
        for label, lib in libs.items():
            client = Client(label, lib, isa=isa)
            if isa is None:
                data["facts"][label] = client.call("facts")
            data["impls"].setdefault(isa or "native", {})[label] = client.call("impls")
            client.close()
    print("candidates listed", flush=True)
    data["startup"] = startup(libs, args.rounds)
    print("start-up measured", flush=True)
    save()

    data["presets"] = {}
    for config in args.cpus:
        cpus, _, isa = config.partition(":")
        pin = (
            "all" if cpus == "all" else ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[: int(cpus)])
        )
        clients = {label: Client(label, lib, cpus=pin, isa=isa or None) for label, lib in libs.items()}
        rows: list[dict[str, Any]] = []
        data["presets"][config] = {"pinned_to": pin, "max_cpu_isa": isa or None, "rows": rows}
        try:
            order = list(clients)
            for i, (preset, shape) in enumerate(shapes):
                row: dict[str, Any] = {
                    "preset": preset,
                    "shape": shape,
                    "load": os.getloadavg()[0],
                    "by_lib": {},
                }
                turn = order if i % 2 == 0 else order[::-1]
                for label in turn:
                    row["by_lib"][label] = clients[label].call("tune", shape)
                # Confirmation rounds, alternating libraries: a burst of load from the other
                # tenants lands on one round of one library, and the median drops it.
                for rep in range(args.reps):
                    for label in turn if rep % 2 else turn[::-1]:
                        result = row["by_lib"][label]
                        if result["best_onednn"] is not None:
                            result.setdefault("confirm", []).append(
                                clients[label].call("confirm", shape, result["best_onednn"])
                            )
                for result in row["by_lib"].values():
                    if result.get("confirm"):
                        result["default_us"] = statistics.median(d for d, _ in result["confirm"])
                        result["onednn_us"] = statistics.median(c for _, c in result["confirm"])
                rows.append(row)
                print(
                    f"[{config}] {preset:<10} {shape:<16} "
                    + "  ".join(
                        f"{label}: {r.get('onednn_us', float('nan')):,.1f} us ({r['best_onednn']})"
                        for label, r in row["by_lib"].items()
                    ),
                    flush=True,
                )
                save()
        finally:
            for client in clients.values():
                client.close()
    save()
    print(f"wrote {args.out / 'onednn-eval.json'} and {args.out / 'onednn-eval.md'}")
    return 0


# --- the report --------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    labels = list(data["libs"])
    lines = ["# oneDNN versions on this CPU: candidates, start-up, tuned speed", ""]
    lines.append(
        f"- Date: {data['date']}; load average (1, 5, 15 min) at start {_load(data['load_start'])}, "
        f"at end {_load(data.get('load_end', data['load_start']))}"
    )
    for label in labels:
        facts = data["facts"].get(label, {})
        versions = ", ".join(f"{k} {v}" for k, v in (facts.get("versions") or {}).items())
        lines.append(f"- `{label}`: {versions or facts.get('reason')}")
    machine = next((f["machine"] for f in data["facts"].values() if f.get("machine")), None)
    if machine:
        lines.append(
            f"- CPU: {machine['cpu']} ({machine['arch']}), {machine['cpus_online']} online; NumPy BLAS "
            f"{machine['numpy_blas']}; Python {machine['python']}; {machine['os']}"
        )
    if data.get("note"):
        lines += ["", f"> {data['note']}"]

    lines += ["", "## Candidates (implementation names, best first)", ""]
    lines += ["| problem | CPU | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for isa, by_lib in data["impls"].items():
        for problem in next(iter(by_lib.values())):
            cells = [", ".join(f"`{n}`" for n in by_lib[label][problem]) or "(none)" for label in labels]
            lines.append(f"| {problem} | {isa} | " + " | ".join(cells) + " |")

    if "startup" in data:
        lines += [
            "",
            f"## Start-up (median of {next(iter(data['startup'].values()))['rounds']} fresh processes, ms)",
            "",
        ]
        keys = ["import_ms", "load_ms", "engine_ms", "first_list_ms", "process_ms"]
        lines += [
            "| library | " + " | ".join(k.removesuffix("_ms") for k in keys) + " |",
            "|---|" + "---:|" * len(keys),
        ]
        for label, s in data["startup"].items():
            lines.append(f"| {label} | " + " | ".join(f"{s[k]:,.1f}" for k in keys) + " |")

    for config, run in data.get("presets", {}).items():
        cpus, _, isa = config.partition(":")
        rows = [r for r in run["rows"] if all("onednn_us" in r["by_lib"][lb] for lb in labels)]
        if not rows:
            continue
        a, others = labels[0], labels[1:]

        def ratio(r: dict[str, Any], b: str, key: str = "onednn_us", a: str = a) -> float:
            return float(r["by_lib"][b][key] / r["by_lib"][a][key])

        lines += [
            "",
            f"## Tuned speed, {'all cores' if cpus == 'all' else f'pinned to {cpus} core(s)'}"
            f"{f', ONEDNN_MAX_CPU_ISA={isa}' if isa else ''} "
            f"(confirmation runs, us per call)",
            "",
            f"`X/{a}` is the best oneDNN candidate's time under library X over that under {a} "
            f"(below 1: X is faster). `Default X/{a}`: numpy.matmul measured in each worker, "
            "the check on noise (1.00 when both saw the same machine).",
            "",
        ]
        by_preset: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_preset.setdefault(r["preset"], []).append(r)
        head = "".join(f" geomean {b}/{a} | geomean Default {b}/{a} |" for b in others)
        lines += ["| preset | shapes |" + head, "|---|---:|" + "---:|---:|" * len(others)]
        for preset, prs in [*by_preset.items(), ("**all**", rows)]:
            summary = "".join(
                f" {geomean([ratio(r, b) for r in prs]):.2f} | {geomean([ratio(r, b, 'default_us') for r in prs]):.2f} |"
                for b in others
            )
            lines.append(f"| {preset} | {len(prs)} |" + summary)
        lines += [
            "",
            "| preset | shape | load | "
            + " | ".join(f"{lb} best oneDNN | {lb} us | {lb} Default us" for lb in labels)
            + "".join(f" | {b}/{a}" for b in others)
            + " |",
            "|---|---|---:|" + "---|---:|---:|" * len(labels) + "---:|" * len(others),
        ]
        for r in rows:
            cells = []
            for lb in labels:
                x = r["by_lib"][lb]
                cells += [
                    f"`{x['best_onednn'].removeprefix('onednn/')}`",
                    f"{x['onednn_us']:,.1f}",
                    f"{x['default_us']:,.1f}",
                ]
            cells += [f"{ratio(r, b):.2f}" for b in others]
            lines.append(f"| {r['preset']} | {r['shape']} | {r['load']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _load(values: Any) -> str:
    return "/".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    sys.exit(main())
