"""A NumPy BERT-base layer through unimatmul.matmul against numpy.matmul, as a user runs it.

    python benchmarks/cpu_mixed.py --out DIR [--runs 4] [--rounds 15] [--pythonpath COPY]

Each run is a fresh process with a fresh cache file: the layer (BERT-base: hidden 768,
12 heads, FFN 3072, 128 tokens; random weights; f32; bias, softmax, GELU and layer norms in
NumPy between the products) is called once in mode ``tune`` (its six products tuned on
first sight, as a user's first call tunes them), then in mode ``cached`` until every
confirmation window has judged its choice, then timed: ``--rounds`` rounds of ten layers
with ``numpy.matmul`` and ten through ``unimatmul.matmul``, in turns (the order swapped
every round), the median round of each. The products that keep a oneDNN kernel run on GNU
OpenMP's threads, the others (and NumPy's own) on OpenBLAS's: a user's program with both.

``--chain`` measures the two thread pools alone instead, without tuning: the six products
back to back, each timed, with NumPy for all, oneDNN's ``gemm:jit:f32`` for all, and oneDNN
for the QKV and attention-score products only (mixed), taking turns, in a process per wait
policy of GNU OpenMP (as set, then ``OMP_WAIT_POLICY=passive``); writes ``cpu-chain.json``
and ``cpu-chain.md``.

``--pythonpath COPY`` also runs the package in that folder (the code before a change),
each run of it taking turns with one of this checkout's. Writes ``cpu-mixed.json`` (every
run: both medians, every round, each product's winner, tuning and in-situ verdict),
``cpu-mixed.md`` and, where matplotlib imports, ``cpu-mixed.png`` under ``--out``; prints the
table. Needs the oneDNN backend (``pip install 'unimatmul[cpu]'``).
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

import numpy as np

HIDDEN, HEADS, FFN, TOKENS = 768, 12, 3072, 128


def _layer(mm: Any, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """One BERT encoder layer (post-norm), every product through ``mm``."""

    def norm(h: np.ndarray) -> np.ndarray:
        mu = h.mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(h.var(-1, keepdims=True) + 1e-12)

    d = HIDDEN // HEADS
    qkv = mm(x, p["wqkv"]) + p["bqkv"]
    q, k, v = (
        qkv[:, i * HIDDEN : (i + 1) * HIDDEN].reshape(TOKENS, HEADS, d).transpose(1, 0, 2) for i in range(3)
    )
    scores = mm(np.ascontiguousarray(q), np.ascontiguousarray(k.transpose(0, 2, 1))) * float(1.0 / np.sqrt(d))
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    ctx = mm(scores, np.ascontiguousarray(v)).transpose(1, 0, 2).reshape(TOKENS, HIDDEN)
    h = norm(x + mm(np.ascontiguousarray(ctx), p["wo"]) + p["bo"])
    up = mm(h, p["w1"]) + p["b1"]
    up = 0.5 * up * (1.0 + np.tanh(0.7978845608 * (up + 0.044715 * up**3)))
    return norm(h + mm(up.astype(np.float32), p["w2"]) + p["b2"]).astype(np.float32)


def _pairs(p: dict[str, np.ndarray], x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The operands of the layer's six products, in the layer's order (``CHAIN_NAMES``)."""
    return [
        (x, p["wqkv"]),
        (p["q"], p["kt"]),
        (p["probs"], p["v"]),
        (x, p["wo"]),
        (x, p["w1"]),
        (p["up"], p["w2"]),
    ]


def _products(mm: Any, p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The layer's six products alone, back to back, on the same operand shapes (a chain of
    products with no NumPy work between them: no pause in which a pool's threads stop)."""
    out = x
    for a, b in _pairs(p, x):
        out = mm(a, b)
    return out


LAYERS = {"full": _layer, "products": _products}


def _params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])).astype(np.float32)

    return {
        "wqkv": w(HIDDEN, 3 * HIDDEN),
        "bqkv": w(1, 3 * HIDDEN)[0],
        "wo": w(HIDDEN, HIDDEN),
        "bo": w(1, HIDDEN)[0],
        "w1": w(HIDDEN, FFN),
        "b1": w(1, FFN)[0],
        "w2": w(FFN, HIDDEN),
        "b2": w(1, HIDDEN)[0],
        # the attention products' operands and the FFN's hidden state, for "products"
        "q": rng.standard_normal((HEADS, TOKENS, HIDDEN // HEADS), dtype=np.float32),
        "kt": rng.standard_normal((HEADS, HIDDEN // HEADS, TOKENS), dtype=np.float32),
        "probs": rng.random((HEADS, TOKENS, TOKENS), dtype=np.float32),
        "v": rng.standard_normal((HEADS, TOKENS, HIDDEN // HEADS), dtype=np.float32),
        "up": rng.standard_normal((TOKENS, FFN), dtype=np.float32),
    }


def worker(rounds: int, layers: int, kind: str) -> dict[str, Any]:
    """One run in this process (its cache file: ``UNIMATMUL_CACHE``)."""
    _layer = LAYERS[kind]
    import unimatmul
    from unimatmul.api import TABLE
    from unimatmul.tuning.selector import get_selector

    rng = np.random.default_rng(7)
    p = _params(rng)
    x = rng.standard_normal((TOKENS, HIDDEN), dtype=np.float32)
    started = time.perf_counter()
    with unimatmul.mode("tune"):
        tuned = _layer(unimatmul.matmul, p, x)
    tune_s = time.perf_counter() - started
    reference = _layer(np.matmul, p, x)
    error = float(np.abs(tuned - reference).max())
    judged = 0
    while judged < 300:  # until every window has judged (a window: 2 + 32 calls, then one more)
        _layer(unimatmul.matmul, p, x)
        judged += 1
        if judged % 20 == 0 and not any(
            plan.confirming for key, plan in TABLE.plans.items() if key[0] == "cached"
        ):
            break
    samples: dict[str, list[float]] = {"numpy": [], "unimatmul": []}
    fns = {"numpy": np.matmul, "unimatmul": unimatmul.matmul}
    for r in range(rounds):
        for name in ("numpy", "unimatmul") if r % 2 == 0 else ("unimatmul", "numpy"):
            fn = fns[name]
            t0 = time.perf_counter()
            for _ in range(layers):
                _layer(fn, p, x)
            samples[name].append((time.perf_counter() - t0) / layers)
    selector = get_selector()
    selector.settle(timeout=30)
    products = []
    for _namespace, key, record in selector.store.items():
        found = record.settings.get("confirm") or {}
        products.append(
            {
                "problem": key,
                "winner": record.winner,
                "tuned_speedup": (record.default_s / record.winner_s)
                if record.default_s and record.winner_s
                else None,
                "in_situ": found.get("verdict"),
                "in_situ_kernel": found.get("kernel"),
                "in_situ_kernel_s": found.get("kernel_s"),
                "in_situ_default_s": found.get("default_s"),
                "in_situ_kernel_span_s": found.get("kernel_span_s"),
                "in_situ_default_span_s": found.get("default_span_s"),
            }
        )
    numpy_s, routed_s = statistics.median(samples["numpy"]), statistics.median(samples["unimatmul"])
    return {
        "tune_s": tune_s,
        "warm_layers": judged,
        "max_abs_error": error,
        "numpy_ms": numpy_s * 1e3,
        "unimatmul_ms": routed_s * 1e3,
        "speedup": numpy_s / routed_s,
        "rounds": {k: [s * 1e3 for s in v] for k, v in samples.items()},
        "products": sorted(products, key=lambda r: r["problem"]),
        "load_after": os.getloadavg()[0],
    }


CHAIN_NAMES = ("QKV", "scores", "probs x V", "out proj", "FFN up", "FFN down")


def chain_worker(rounds: int) -> dict[str, Any]:
    """The products of ``_products`` timed one by one: NumPy, oneDNN, and mixed."""
    from unimatmul.backend import Candidate, Target
    from unimatmul.core.arrays import CPU, adapter_for_kind
    from unimatmul.core.problem import Problem
    from unimatmul_backends.onednn.backend import OneDNNBackend

    rng = np.random.default_rng(7)
    p = _params(rng)
    x = rng.standard_normal((TOKENS, HIDDEN), dtype=np.float32)
    pairs = _pairs(p, x)
    outs = [np.empty(np.matmul(a, b).shape, np.float32) for a, b in pairs]
    adapter = adapter_for_kind("numpy")
    target = Target(adapter, CPU)
    backend = OneDNNBackend()
    kernels = []
    for a, b in pairs:
        problem = Problem.from_operands(adapter, a, b)[0]
        kernels.append(backend.prepare(problem, Candidate.make("onednn", "gemm:jit:f32"), target))

    def numpy_call(i: int) -> None:
        np.matmul(*pairs[i], out=outs[i])

    def onednn_call(i: int) -> None:
        kernels[i](*pairs[i], outs[i])

    plans = {
        "numpy": [numpy_call] * 6,
        "onednn": [onednn_call] * 6,
        "mixed": [onednn_call, onednn_call] + [numpy_call] * 4,
    }
    times: dict[str, list[list[float]]] = {k: [[] for _ in pairs] for k in plans}
    for calls in plans.values():
        for _ in range(5):
            for i, call in enumerate(calls):
                call(i)
    for r in range(rounds):
        for name in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            for i, call in enumerate(plans[name]):
                t0 = time.perf_counter()
                call(i)
                times[name][i].append(time.perf_counter() - t0)
    ref = [a.astype(np.float64) @ b.astype(np.float64) for a, b in pairs]
    error = max(float(np.abs(o - r).max() / np.abs(r).max()) for o, r in zip(outs, ref, strict=True))
    return {
        "wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "median_ms": {k: [statistics.median(t) * 1e3 for t in v] for k, v in times.items()},
        "max_rel_error": error,
    }


def chain_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| wait policy | chain | " + " | ".join(CHAIN_NAMES) + " | layer (sum) |",
        "| --- | --- | " + " | ".join("---:" for _ in CHAIN_NAMES) + " | ---: |",
    ]
    for r in runs:
        for name, ms in r["median_ms"].items():
            cells = " | ".join(f"{m:.2f}" for m in ms)
            lines.append(f"| {r['wait_policy']} | {name} | {cells} | {sum(ms):.2f} |")
    return "\n".join(lines) + "\n"


def _spawn(what: str, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> dict[str, Any]:
    """This script with ``argv`` in a fresh process; the JSON its last line prints."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a {what} run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _chain(rounds: int, repeats: int) -> list[dict[str, Any]]:
    runs = []
    for _ in range(repeats):
        for policy in (None, "passive"):
            env = dict(os.environ)
            if policy is not None:
                env["OMP_WAIT_POLICY"] = policy
            runs.append(_spawn("chain", ["--chain-worker", "--rounds", str(rounds)], env))
            print(chain_table(runs[-1:]).splitlines()[-3:], flush=True)
    return runs


def _run(
    code: str, pythonpath: str | None, rounds: int, layers: int, kind: str, tmp: Path, i: int
) -> dict[str, Any]:
    env = dict(os.environ)
    env["UNIMATMUL_CACHE"] = str(tmp / f"{code}-{i}.msgpack")
    env.pop("UNIMATMUL_MODE", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    argv = ["--worker", "--rounds", str(rounds), "--layers", str(layers), "--layer", kind]
    # From the temporary folder: a checkout in the working directory would shadow --pythonpath.
    return _spawn(code, argv, env, cwd=tmp) | {"code": code}


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| run | code | numpy ms/layer | unimatmul ms/layer | unimatmul/numpy speed | kernels kept in situ | reverted in situ |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(runs):
        kept = [p for p in r["products"] if p["winner"] != "default/default" and p["in_situ"] == "confirmed"]
        reverted = [p for p in r["products"] if p["in_situ"] == "reverted"]
        lines.append(
            f"| {i // 2 + 1 if len({x['code'] for x in runs}) > 1 else i + 1} | {r['code']} | {r['numpy_ms']:.2f} "
            f"| {r['unimatmul_ms']:.2f} | {r['speedup']:.3f}x | {len(kept)} | {len(reverted)} |"
        )
    lines.append("")
    for code in dict.fromkeys(r["code"] for r in runs):
        ratios = [r["speedup"] for r in runs if r["code"] == code]
        lines.append(
            f"- {code}: unimatmul/numpy speed {min(ratios):.3f}-{max(ratios):.3f}x over {len(ratios)} runs "
            f"(median {statistics.median(ratios):.3f}x)"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    codes = list(dict.fromkeys(r["code"] for r in runs))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for j, code in enumerate(codes):
        ratios = [r["speedup"] for r in runs if r["code"] == code]
        ax.scatter([j] * len(ratios), ratios, label=code)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(codes)), codes)
    ax.set_ylabel("unimatmul / numpy speed (per layer)")
    ax.set_title("NumPy BERT-base layer, tuned then cached, 2-core CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _machine() -> dict[str, Any]:
    """The CPU, its libraries and NumPy's BLAS, as the CPU presets' benchmark states them."""
    from cpu_presets import machine_facts

    from unimatmul.backend import Target
    from unimatmul.cache.protocol import open_store
    from unimatmul.core.arrays import CPU, adapter_for_kind
    from unimatmul.core.plugins import PluginManager
    from unimatmul.tuning.selector import Selector

    with tempfile.TemporaryDirectory() as tmp:  # a Selector over no user's cache file
        selector = Selector(plugins=PluginManager(), store=open_store(Path(tmp) / "facts.msgpack"))
        return machine_facts(selector, Target(adapter_for_kind("numpy"), CPU))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--runs", type=int, default=4, help="fresh processes per code")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=10, help="layers a timed sample")
    ap.add_argument(
        "--layer",
        choices=sorted(LAYERS),
        default="full",
        help="full: the layer with its NumPy work; products: its six products back to back",
    )
    ap.add_argument(
        "--pythonpath", default=None, help="also run the package in this folder (the code before)"
    )
    ap.add_argument("--chain", action="store_true", help="the two thread pools alone, without tuning")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--chain-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.rounds, args.layers, args.layer)))
        return 0
    if args.chain_worker:
        print(json.dumps(chain_worker(args.rounds)))
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.chain:
        chain_runs = _chain(args.rounds * 4, args.runs)
        args.out.mkdir(parents=True, exist_ok=True)
        chain_data: dict[str, Any] = {
            "what": "BERT-base's six products back to back: NumPy, oneDNN, mixed",
            "runs": chain_runs,
        }
        (args.out / "cpu-chain.json").write_text(json.dumps(chain_data, indent=1) + "\n")
        text = chain_table(chain_runs)
        (args.out / "cpu-chain.md").write_text(text)
        print(text)
        return 0
    codes: list[tuple[str, str | None]] = [("now", None)]
    if args.pythonpath:
        codes.insert(0, ("before", args.pythonpath))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for code, path in codes if i % 2 == 0 else codes[::-1]:
                r = _run(code, path, args.rounds, args.layers, args.layer, Path(tmp), i)
                print(
                    f"{code} run {i + 1}: {r['numpy_ms']:.2f} / {r['unimatmul_ms']:.2f} ms, {r['speedup']:.3f}x",
                    flush=True,
                )
                runs.append(r)
    data = {
        "what": "NumPy BERT-base layer through unimatmul.matmul (tuned, then cached) against numpy.matmul",
        "machine": _machine(),
        "settings": {
            "runs": args.runs,
            "rounds": args.rounds,
            "layers": args.layers,
            "layer": args.layer,
            "tokens": TOKENS,
        },
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu-mixed.json").write_text(json.dumps(data, indent=1) + "\n")
    text = table(runs)
    (args.out / "cpu-mixed.md").write_text(text)
    plot(runs, args.out / "cpu-mixed.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
