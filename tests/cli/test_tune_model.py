"""``unimatmul tune --model``, ``--dry-run`` and ``--budget``: real tuning on this CPU
(oneDNN and CPU torch), the real cache file."""

from __future__ import annotations

import json
import re
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from unimatmul.cli import EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main
from unimatmul.tuning.model_configs import MODELS
from unimatmul.tuning.model_gemms import load_config, model_gemms

pytest.importorskip("torch")


def run(argv: list[str]) -> tuple[int, str]:
    out = StringIO()
    code = main(argv, out=out)
    return code, out.getvalue()


def tiny_config(tmp_path: Path) -> Path:
    """A Llama-shaped model small enough to tune many of its products in a second."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 80,
        "torch_dtype": "float32",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def _rows(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.startswith(("geometric-mean", "coverage:", "cache:")) or "GEMMs;" in line:
            break
        rows.append(line.split())
    return rows


def test_dry_run_lists_every_gemm_with_its_share_and_writes_nothing(isolated: Any) -> None:
    code, text = run(
        ["tune", "--model", "qwen3-30b-a3b", "--tokens", "1,2048", "--dry-run", "--device", "cuda"]
    )
    assert code == EXIT_OK
    assert text.startswith("model: built-in qwen3-30b-a3b (https://huggingface.co/Qwen/Qwen3-30B-A3B/")
    rows = _rows(text)
    assert len(rows) == 16  # 8 GEMMs a pass (q, k, v, o, router, 2 expert groups, lm_head) x 2
    shares = [float(next(c for c in row if c.endswith("%"))[:-1]) for row in rows]
    assert sum(shares) == pytest.approx(100.0, abs=0.05)
    experts = [row for row in rows if row[0].startswith("mlp.experts")]
    assert len(experts) == 4 and all(row[-2:] == ["tune", "grouped"] for row in experts)
    # 1 token: 8 rows over 128 experts; 2048 tokens: 16384 rows (top-8)
    assert {row[2] for row in experts} == {
        "128x(8/128)x1536x2048",
        "128x(8/128)x2048x768",
        "128x(16384/128)x1536x2048",
        "128x(16384/128)x2048x768",
    }
    expert_share = sum(float(row[6][:-1]) for row in experts)
    assert 30 < expert_share < 80  # the experts are most of an MoE model's GEMM time
    assert "16 GEMMs; 14 distinct problems to tune, 4 of them grouped (100.0% of the GEMM time)" in text
    assert "skipped" not in text and "cannot tune" not in text
    assert "grouped: the experts as transformers' grouped_mm runs them" in text
    assert "simple roofline" in text
    assert not isolated.cache_path.exists()


def test_dry_run_follows_tp_and_dtype(isolated: Any) -> None:
    code, text = run(
        ["tune", "--model", "llama-3-8b", "--tokens", "8", "--tp", "2", "--dtype", "f16", "--dry-run"]
    )
    assert code == EXIT_OK
    rows = {row[0]: row for row in _rows(text)}
    assert rows["q_proj"][2] == "8x2048x4096" and rows["o_proj"][2] == "8x4096x2048"
    assert rows["mlp.down_proj"][2] == "8x4096x7168" and rows["lm_head"][2] == "8x64128x4096"
    assert {row[4] for row in rows.values()} == {"f16"}


def test_tune_model_tunes_each_distinct_problem_once(isolated: Any, tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    code, text = run(["tune", "--model", str(config), "--tokens", "1,4", "--quiet"])
    assert code == EXIT_OK
    derived = model_gemms(load_config(str(config))[0], (1, 4))
    keys = {g.problem().key for g in derived}
    assert isolated.store_count() == len(keys) == 10  # q=o, k=v, gate=up, down, lm_head: 5 a pass
    namespace = next(iter(isolated.selector.store.namespaces()))
    assert {key for _, key, _ in isolated.selector.store.items(namespace)} == keys
    assert len(_rows(text)) == 10
    assert "coverage: 100.0% of the GEMM time tuned in" in text
    # again: all from the cache, nothing tuned
    code, text = run(["tune", "--model", str(config), "--tokens", "1,4", "--quiet"])
    assert code == EXIT_OK and text.count("cached") == 10


def test_a_budget_stops_the_run_and_stores_what_it_finished(isolated: Any, tmp_path: Path) -> None:
    config = tiny_config(tmp_path)
    tokens = ",".join(str(t) for t in range(1, 61))
    distinct = {g.problem().key for g in model_gemms(load_config(str(config))[0], range(1, 61))}
    budget = 1.0
    started = time.perf_counter()
    code, text = run(["tune", "--model", str(config), "--tokens", tokens, "--budget", str(budget), "--quiet"])
    wall = time.perf_counter() - started
    assert code == EXIT_OK
    stored = isolated.store_count()
    assert 0 < stored < len(distinct)
    assert len(_rows(text)) == stored
    found = re.search(
        r"coverage: (\d+\.\d)% of the GEMM time tuned in (\d+\.\d) s \(budget 1 s for the whole run, "
        r"(\d+\.\d) s of it before tuning\); left out: (\d+) products \((\d+\.\d)%\): budget spent",
        text,
    )
    assert found, text
    coverage, spent, before = float(found[1]), float(found[2]), float(found[3])
    left, left_share = int(found[4]), float(found[5])
    assert left == len(distinct) - stored
    assert coverage + left_share == pytest.approx(100.0, abs=0.2)
    # The run stopped at the budget, counted from the command's start (the last problem
    # may finish its Default and checks).
    assert before + spent <= budget + 0.5
    assert wall < budget + 3.0  # the command's own start (plugins, platform) on top
    # What was finished is in the cache file: a new process would use it.
    code, text = run(["tune", "--model", str(config), "--tokens", tokens, "--budget", "0.01", "--quiet"])
    assert code == EXIT_OK and text.count("cached") >= stored


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--model", "nope"], EXIT_USAGE, "unknown model 'nope'"),
        (["--model", "llama-3-8b", "--tp", "3", "--dry-run"], EXIT_USAGE, "does not split over --tp 3"),
        (["--model", "llama-3-8b", "--tokens", "1,x"], EXIT_USAGE, "--tokens '1,x'"),
        (["--model", "llama-3-8b", "--budget", "0"], EXIT_USAGE, "--budget must be a positive number"),
        (["--shape", "8x8x8", "--cap", "-1"], EXIT_USAGE, "--cap must be a positive number"),
        (["--shape", "8x8x8", "--tokens", "1"], EXIT_USAGE, "--tokens only applies with --model"),
        (["--shape", "8x8x8", "--dry-run"], EXIT_USAGE, "--dry-run lists a model's GEMMs"),
        (["--model", "llama-3-8b", "--buckets"], EXIT_USAGE, "does not take --buckets"),
        (["--model", "llama-3-8b", "--shape", "8x8x8"], EXIT_USAGE, "in a run of their own"),
        (["--model", "/no/such/config.json"], EXIT_UNAVAILABLE, "cannot read --model /no/such/config.json"),
    ],
)
def test_bad_model_options_are_refused_with_a_reason(
    isolated: Any, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    assert run(["tune", *argv])[0] == code
    assert message in capsys.readouterr().err
    assert not isolated.cache_path.exists()


def test_every_built_in_model_derives(isolated: Any) -> None:
    for name in MODELS:
        code, text = run(["tune", "--model", name, "--tokens", "1,512", "--dry-run"])
        assert code == EXIT_OK, name
        assert "huggingface.co" in text.splitlines()[0]


def test_a_record_files_call_counts_order_a_budgeted_run(isolated: Any, tmp_path: Path) -> None:
    from unimatmul.core.problem import Problem

    problems = [Problem.from_shape(16, 8 * (i + 1), 24, "f32") for i in range(3)]
    calls = [5, 4000, 300]  # the second is called most: it goes first, then the third
    lines = [
        json.dumps({"problem": p.key, "array": "numpy", "device": "cpu", "calls": c})
        for p, c in zip(problems, calls, strict=True)
    ]
    record = tmp_path / "recorded.jsonl"
    record.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, text = run(["tune", "--from", str(record), "--budget", "120", "--quiet"])
    assert code == EXIT_OK
    assert [row[0] for row in _rows(text)] == ["16x16x24", "16x24x24", "16x8x24"]
    assert "coverage: 100.0% of the GEMM time tuned" in text


def tiny_moe_config(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """A Qwen3-MoE-shaped model: 8 experts, top-2, hidden 64, experts' intermediate 48."""
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 80,
        "torch_dtype": "float32",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return config, path


def test_dry_run_says_which_experts_cannot_be_tuned_and_why(isolated: Any) -> None:
    code, text = run(["tune", "--model", "mixtral-8x7b", "--tokens", "4", "--dtype", "f64", "--dry-run"])
    assert code == EXIT_OK
    rows = {row[0]: row for row in _rows(text)}
    assert rows["mlp.experts.gate_up"][-1] == "skipped" and rows["q_proj"][-1] == "tune"
    found = re.search(
        r"skipped: (\d+\.\d)% of the GEMM time is grouped \(MoE experts\) in f64: "
        r"torch._grouped_mm and the grouped door take bf16, f16, f32 only",
        text,
    )
    assert found, text
    tuned = re.search(r"4 distinct problems to tune, 0 of them grouped \((\d+\.\d)% of the GEMM time\)", text)
    assert tuned, text
    assert float(found[1]) + float(tuned[1]) == pytest.approx(100.0, abs=0.15)


def test_a_moe_model_tunes_its_experts_as_the_grouped_door_calls_them(isolated: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from grouped_cases import close, reference
    from hf_experts import experts_forward, top_k_routing

    import unimatmul
    from unimatmul.core._backend import Target
    from unimatmul.core.arrays import CPU, adapter_for_kind
    from unimatmul.core.grouped import grouped_problem_of
    from unimatmul.grouped import TABLE
    from unimatmul.tuning.selector import get_selector

    config, path = tiny_moe_config(tmp_path)
    code, text = run(["tune", "--model", str(path), "--tokens", "2,5", "--device", "cpu", "--quiet"])
    assert code == EXIT_OK, text
    derived = model_gemms(config, (2, 5))
    keys = {g.problem().key for g in derived}
    grouped = {g.problem().key for g in derived if g.grouped}
    # gate_up (N 96) and down (N 64) at 2 x 2 = 4 rows and 5 x 2 = 10 rows (bucket 16)
    assert len(grouped) == 4
    namespace = next(iter(isolated.selector.store.namespaces()))
    stored = {key: record for _, key, record in isolated.selector.store.items(namespace)}
    assert set(stored) == keys
    assert {key for key in stored if key.startswith("grouped_gemm:")} == grouped
    assert "coverage: 100.0% of the GEMM time tuned in" in text and "left out" not in text
    assert len([row for row in _rows(text) if row[0].count("x") == 3]) == 4  # GxMxNxK rows

    # transformers' experts in cached mode, through the door: every call finds its record,
    # 7 tokens (14 rows) too, which shares the bucket of 5 (10 rows).
    gen = torch.Generator().manual_seed(3)
    gate_up, down = torch.randn(8, 96, 64, generator=gen), torch.randn(8, 64, 48, generator=gen)
    adapter, target = adapter_for_kind("torch"), Target(adapter_for_kind("torch"), CPU)
    TABLE.reset_stats()
    with unimatmul.mode("cached"):
        for tokens in (2, 5, 7):
            x = torch.randn(tokens, 64, generator=gen)
            routing = top_k_routing(tokens, 8, 2, seed=tokens)
            _, calls = experts_forward(x, gate_up, down, routing)
            _, door_calls = experts_forward(x, gate_up, down, routing, grouped_mm=unimatmul.grouped_matmul)
            for (a, b, offs), (a2, b2, offs2) in zip(calls, door_calls, strict=True):
                problem = grouped_problem_of(adapter, a2, b2, offs2)
                assert problem.key in stored, (tokens, problem.key)
                assert get_selector().decide(problem, target, "cached").source == "cache"
                assert close(unimatmul.grouped_matmul(a, b, offs), reference("m", a, b, offs), "f32")
    assert TABLE.stats()["by_source"] == {"cache": 12}  # 3 passes x 2 products, each twice
    assert isolated.store_count() == len(keys)  # nothing tuned in cached mode


def test_grouped_experts_need_torch_tensors(isolated: Any, tmp_path: Path) -> None:
    config, path = tiny_moe_config(tmp_path)
    code, text = run(["tune", "--model", str(path), "--tokens", "2", "--array", "numpy", "--quiet"])
    assert code == EXIT_OK, text
    dense = {g.problem().key for g in model_gemms(config, (2,)) if not g.grouped}
    namespace = next(iter(isolated.selector.store.namespaces()))
    assert {key for _, key, _ in isolated.selector.store.items(namespace)} == dense
    found = re.search(
        r"coverage: (\d+\.\d)% .*left out: 2 products \((\d+\.\d)%\): grouped \(MoE experts\): "
        r"grouped problems tune on torch tensors only",
        text,
    )
    assert found, text
    assert float(found[1]) + float(found[2]) == pytest.approx(100.0, abs=0.2)


def test_backends_hear_of_the_problems_ahead_and_that_the_run_is_over(
    isolated: Any, registered: Any, tmp_path: Path
) -> None:
    """``unimatmul tune`` announces the problems it will tune to every backend
    (``Backend.ahead``, from a thread of its own while the first is measured) and, when the
    run ends, that it is over (``Backend.ahead_over``: what was started and is not wanted is
    dropped). A backend that fails while listening costs nothing: the run goes on."""
    import threading

    from unimatmul.backend import Backend

    class Listening(Backend):
        name = "listening"
        device_kinds = frozenset({"cpu"})
        array_kinds = frozenset({"torch"})

        def __init__(self) -> None:
            self.told: list[str] = []
            self.threads: set[str] = set()
            self.over = 0

        def availability(self) -> str | None:
            return None

        def versions(self) -> dict[str, str]:
            return {}

        def candidates(self, problem: Any, target: Any) -> list[Any]:
            return []

        def prepare(self, problem: Any, candidate: Any, target: Any) -> Any:
            raise AssertionError("no candidates, nothing to prepare")

        def ahead(self, problem: Any, target: Any) -> None:
            self.told.append(problem.key)
            self.threads.add(threading.current_thread().name)
            if len(self.told) == 2:
                raise RuntimeError("this backend cannot look ahead at its second problem")

        def ahead_over(self) -> None:
            self.over += 1

    listening = Listening()
    config = tiny_config(tmp_path)
    with registered(isolated.plugins, listening):
        code, text = run(["tune", "--model", str(config), "--tokens", "1,4", "--device", "cpu", "--quiet"])
    assert code == EXIT_OK, text
    keys = {key for _, key, _ in isolated.selector.store.items(None)}
    assert len(keys) == 10 and set(listening.told) == keys  # every problem, once each
    assert len(listening.told) == len(keys)
    assert listening.threads == {"unimatmul-ahead"}
    assert listening.over == 1


def test_without_torch_a_model_says_what_to_install_and_tunes_against_numpy(tmp_path: Path) -> None:
    """``--model`` defaults to torch's baseline: where torch is missing (here: hidden from the
    child process as an environment without it has it), one line says what to do, and
    ``--array numpy`` tunes the model's f32 products for real."""
    import os
    import subprocess
    import sys

    config = tiny_config(tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from unimatmul.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "UNIMATMUL_CACHE": str(tmp_path / "c.msgpack"),
    }
    refused = subprocess.run(
        [sys.executable, "-c", code, "tune", "--model", str(config), "--tokens", "4"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert refused.returncode == EXIT_UNAVAILABLE
    assert "torch is not installed" in refused.stderr and "--array numpy" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "c.msgpack").exists()
    tuned = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "tune",
            "--model",
            str(config),
            "--tokens",
            "4",
            "--array",
            "numpy",
            "-q",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert tuned.returncode == EXIT_OK, tuned.stderr
    rows = _rows(tuned.stdout)
    assert rows and all(row[1] == "numpy" for row in rows)
    assert (tmp_path / "c.msgpack").exists()
