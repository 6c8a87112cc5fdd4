"""Plot a torch_models.py result: each mode's speed over routing off, eager and CUDA graphs.

    python benchmarks/plot_torch_models.py benchmarks/results/torch-h200/results.json

Writes ``results.png`` beside the JSON file (needs matplotlib, not a unimatmul dependency).
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
    rows = data["models"]
    labels = [f"{r['model']} {r['phase']} b{r['batch']}" for r in rows]
    panels = [("eager", "eager (host time counts)"), ("graphs", "decode as CUDA graph replays")]
    panels = [(key, title) for key, title in panels if any(r[key] for r in rows)]
    widths = [sum(1 for r in rows if r[key]) for key, _ in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 + 0.7 * sum(widths), 5.5), squeeze=False)
    fig.subplots_adjust(wspace=0.25)
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        shown = [(label, r[key]) for label, r in zip(labels, rows, strict=True) if r[key]]
        modes = [m for m in dict.fromkeys(m for _, res in shown for m in res) if m != "off"]
        width = 0.8 / max(len(modes), 1)
        for i, mode in enumerate(modes):
            ratios = [
                res["off"]["median_s"] / res[mode]["median_s"] if mode in res else 0 for _, res in shown
            ]
            ax.bar([x + i * width for x in range(len(shown))], ratios, width, label=f"{mode} / off")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(modes) - 1) / 2 for x in range(len(shown))])
        ax.set_xticklabels([label for label, _ in shown], rotation=60, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylabel("tokens/s over routing off")
        ax.legend(fontsize=8)
    m = data["machine"]
    fig.suptitle(f"unimatmul.torch on {m.get('gpu') or m['cpu']}, {data['dtype']}, torch {m['torch']}")
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
