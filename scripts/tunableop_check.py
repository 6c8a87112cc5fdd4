"""Does PyTorch TunableOp run the benchmark's blocks on its own? No unimatmul in the process.

Run with TORCH_DEVICE_BACKEND_AUTOLOAD=0 (else torch imports the autoload hook).

Runs each model of benchmarks/torch_models.py (prefill, batch 1) with TunableOp tuning,
in a process that never imports unimatmul, and prints what happened per model.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from torch_models import FULL, Stack

assert "unimatmul" not in sys.modules
for name in sys.argv[1:] or ["gpt2", "llama"]:
    torch.manual_seed(0)
    model = Stack(FULL[name]).to(device="cuda", dtype=torch.bfloat16).eval()
    x = torch.randn(1, 512, FULL[name].dim, device="cuda", dtype=torch.bfloat16)
    tunable = torch.cuda.tunable
    tunable.set_filename(f"/tmp/tunableop_check_{name}%d.csv")
    tunable.tuning_enable(True)
    tunable.enable(True)
    try:
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize()
        print(name, "TunableOp ran; results:", len(tunable.get_results()))
    except Exception as exc:
        print(name, "TunableOp failed:", type(exc).__name__, str(exc).splitlines()[0])
        traceback.print_exc(limit=3)
        break
    finally:
        tunable.enable(False)
print("unimatmul imported:", "unimatmul" in sys.modules)
