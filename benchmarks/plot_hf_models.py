"""Plot an hf_models.py result: routed over off per row, eager and compiled panels.

    python benchmarks/plot_hf_models.py benchmarks/results/hf-cpu-small/results.json

Writes ``results.png`` beside the JSON file (needs matplotlib, not a unimatmul
dependency). A panel is drawn only where it has rows; the whiskers span the rounds'
own ratios.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    titles = {"eager": "eager", "compiled": "compiled (torch.compile; static cache for generate)"}
    panels = [(v, t) for v, t in titles.items() if any(r["variant"] == v for r in data["rows"])]
    if not panels:
        print(f"{path}: no rows to plot")
        return 1
    widths = [sum(1 for r in data["rows"] if r["variant"] == v) for v, _ in panels]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(3 + 0.55 * sum(widths), 5.5), squeeze=False, width_ratios=widths
    )
    for ax, (variant, title) in zip(axes[0], panels, strict=True):
        rows = [r for r in data["rows"] if r["variant"] == variant]
        ratios = [r["ratio"] for r in rows]
        low = [r["ratio"] - min(r["round_ratios"]) for r in rows]
        high = [max(r["round_ratios"]) - r["ratio"] for r in rows]
        colors = ["tab:green" if x >= 1 else "tab:red" for x in ratios]
        ax.bar(range(len(rows)), ratios, color=colors, yerr=[low, high], capsize=3)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(
            [f"{r['model']} {r['phase']} b{r['batch']}" for r in rows], rotation=60, ha="right", fontsize=8
        )
        top = max(max(r["round_ratios"]) for r in rows)
        bottom = min(min(r["round_ratios"]) for r in rows)
        ax.set_ylim(min(0.9, bottom - 0.02), max(1.1, top + 0.02))
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("tokens/s routed over off")
    m = data["machine"]
    fig.suptitle(
        f"unimatmul.torch in transformers {m['transformers']} on {m.get('gpu') or m['cpu']}, "
        f"{data['dtype']}, torch {m['torch']}",
        fontsize=10,
    )
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
