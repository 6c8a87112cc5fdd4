"""What the confirmation windows of a Hugging Face run cost, from their own in-situ medians.

A window (``unimatmul/tuning/confirm.py``) runs its choice and PyTorch's kernel by turns: a
warm-up call of each, then N timed calls of each. Against routing off, only the choice's
calls can cost anything, and only where the choice turned out slower than Default there (a
reverted window): (N + 1) x (kernel - Default). Against routing with the choice from the
first call (no windows), a confirmed window gave up (N + 1) x (Default - kernel) on its
Default calls. Both come from the medians each window stored in its cache record
(``settings["confirm"]``), so they are the program's own times, not a separate timing run
(a direct A/B of a whole ``generate`` with and without windows could not resolve 1 % on a
shared host: ``benchmarks/results/host-time/README.md``).

For every row of a ``benchmarks/hf_models.py`` run it sums those over the products the row
met and sets them against one routed call of the row (a ``generate`` of 64 tokens, say):
a window runs once per process and key, so this is the cost in the first such call.

    python benchmarks/window_cost.py benchmarks/results/hf-h200 [--md FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def window_costs(results: dict[str, Any], records: dict[str, Any]) -> list[dict[str, Any]]:
    """Per row: the windows judged on its products, and their cost against off and against no windows."""
    rows = []
    for row in results["rows"]:
        if "routed" not in row:
            continue
        call_s = row["routed"].get("median_s")
        if call_s is None:
            continue
        against_off = against_choice = 0.0
        judged = []
        for problem in row.get("problems", []):
            found = records.get(problem["problem"])
            confirm = found.settings.get("confirm") if found is not None else None
            if (
                not isinstance(confirm, dict)
                or confirm.get("kernel_s") is None
                or confirm.get("default_s") is None
            ):
                continue
            calls = int(confirm.get("calls") or 0) + 1  # the warm-up call of each, too
            kernel_s, default_s = float(confirm["kernel_s"]), float(confirm["default_s"])
            if confirm.get("verdict") == "reverted":
                against_off += calls * max(kernel_s - default_s, 0.0)
            elif confirm.get("verdict") == "confirmed":
                against_choice += calls * max(default_s - kernel_s, 0.0)
            judged.append(
                (problem["shape"], confirm.get("verdict"), confirm.get("kernel"), kernel_s, default_s)
            )
        rows.append(
            {
                "row": row["id"],
                "call_s": call_s,
                "windows": len(judged),
                "against_off_s": against_off,
                "against_no_windows_s": against_choice,
                "judged": judged,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], source: str) -> str:
    lines = [
        f"# What the confirmation windows cost ({source})",
        "",
        "From the in-situ medians the windows stored (`benchmarks/window_cost.py`). Against routing",
        "off a window costs only where its choice lost there; against routing with the choice from",
        "the first call, a confirmed window gave up its Default calls' difference. Both once per",
        "process and product, set against one routed call of the row. A window takes 34 calls of",
        "its product: a decode product (64 calls a `generate`) closes it within the first call, a",
        "prefill product (once a layer) within a few calls, over which its cost is spread.",
        "",
        "| row | one routed call | windows judged | cost against off | cost against no windows |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        call = r["call_s"]
        lines.append(
            f"| {r['row']} | {call * 1e3:.1f} ms | {r['windows']} | "
            f"{r['against_off_s'] * 1e3:.3f} ms ({100 * r['against_off_s'] / call:.2f} %) | "
            f"{r['against_no_windows_s'] * 1e3:.3f} ms ({100 * r['against_no_windows_s'] / call:.2f} %) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run", type=Path, help="a hf_models.py output directory (results.json, cache.msgpack)"
    )
    parser.add_argument(
        "--cache", type=Path, default=None, help="the run's cache (default: RUN/cache.msgpack)"
    )
    parser.add_argument("--md", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    from unimatmul.cache.file_store import MsgpackFileStore

    results_path = args.run / "results.json"
    cache_path = args.cache or args.run / "cache.msgpack"
    for path in (results_path, cache_path):
        if not path.is_file():
            print(f"window_cost: error: {path} is not a file", file=sys.stderr)
            return 2
    results = json.loads(results_path.read_text())
    store = MsgpackFileStore(cache_path, read_only=True)
    records = {key: record for _, key, record in store.items()}
    text = markdown(window_costs(results, records), args.run.name)
    print(text, end="")
    if args.md is not None:
        try:
            args.md.write_text(text)
        except OSError as exc:
            print(f"window_cost: error: cannot write {args.md}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
