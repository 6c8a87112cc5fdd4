"""transformers' decode switch (grouped_mm experts to batched_mm on a GPU) while routing is on.

The CPU tests run transformers' own switch on a real Qwen3-MoE model built from a small
config; transformers only switches off the CPU, so there the model reports a CUDA device
(its ``device`` property; no GPU is touched: entering the switch only reads and sets the
experts implementation). The GPU test runs a real ``generate()``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
generation = pytest.importorskip("transformers.generation.utils")

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch import hf_decode  # noqa: E402

NAME = "_optimize_model_for_decode"
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 97,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
}


def _model(device: str = "cpu", dtype: Any = None) -> Any:
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model.to(device).eval()


def _reporting_cuda(model: Any) -> Any:
    """The model, its ``device`` reading cuda (what transformers' switch tests)."""
    cls = model.__class__
    model.__class__ = type(cls.__name__, (cls,), {"device": property(lambda self: torch.device("cuda"))})
    return model


def _implementation_in_decode(model: Any) -> str:
    with model._optimize_model_for_decode():
        return str(model.get_experts_implementation()[""])


@pytest.fixture
def routing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Routing on, with ``UNIMATMUL_HF_DECODE=grouped`` (the default leaves transformers' switch)."""
    monkeypatch.setenv("UNIMATMUL_HF_DECODE", "grouped")
    was = ut.is_enabled()
    ut.enable()
    try:
        yield
    finally:
        if not was:
            ut.disable()


def test_the_model_runs_grouped_mm_by_default() -> None:
    assert _model().get_experts_implementation()[""] == "grouped_mm"


def test_routing_wraps_the_switch_and_disable_puts_transformers_own_back() -> None:
    original = generation.GenerationMixin.__dict__[NAME]
    was = ut.is_enabled()
    ut.disable()
    try:
        assert generation.GenerationMixin.__dict__[NAME] is original
        ut.enable()
        wrapped = generation.GenerationMixin.__dict__[NAME]
        assert wrapped is not original
        assert wrapped.__unimatmul_original__ is original
        ut.enable()  # idempotent: not wrapped twice
        assert generation.GenerationMixin.__dict__[NAME] is wrapped
        ut.disable()
        assert generation.GenerationMixin.__dict__[NAME] is original
    finally:
        if was:
            ut.enable()


def test_a_gpu_model_keeps_its_grouped_experts_in_decode_while_routed(routing: None) -> None:
    model = _reporting_cuda(_model(dtype=torch.bfloat16))
    assert _implementation_in_decode(model) == "grouped_mm"
    assert model.get_experts_implementation()[""] == "grouped_mm"


@pytest.mark.parametrize("why", ["default", "setting", "mode off", "float64", "routing off"])
def test_otherwise_transformers_switches_to_batched_mm_and_back(
    routing: None, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    model = _reporting_cuda(_model(dtype=torch.float64 if why == "float64" else torch.bfloat16))
    if why == "setting":
        monkeypatch.setenv("UNIMATMUL_HF_DECODE", "transformers")
    if why == "default":
        monkeypatch.delenv("UNIMATMUL_HF_DECODE")
    if why == "routing off":
        ut.disable()
    with unimatmul.mode("off") if why == "mode off" else contextlib.nullcontext():
        assert _implementation_in_decode(model) == "batched_mm"
    assert model.get_experts_implementation()[""] == "grouped_mm"


def test_a_cpu_model_is_left_as_transformers_leaves_it(routing: None) -> None:
    model = _model()
    assert not hf_decode.keeps_grouped(model)
    assert _implementation_in_decode(model) == "grouped_mm"


def test_a_bad_setting_is_named(routing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.settings import SettingError

    monkeypatch.setenv("UNIMATMUL_HF_DECODE", "bmm")
    with pytest.raises(SettingError, match="UNIMATMUL_HF_DECODE"):
        hf_decode.keeps_grouped(_reporting_cuda(_model()))


def test_transformers_imported_after_enable_is_wrapped_at_the_first_grouped_call() -> None:
    code = textwrap.dedent(
        """
        import sys
        import torch
        import unimatmul.torch as ut
        ut.enable()
        assert "transformers" not in sys.modules
        import transformers.generation.utils as g
        name = "_optimize_model_for_decode"
        assert not hasattr(g.GenerationMixin.__dict__[name], "__unimatmul_original__")
        torch.manual_seed(0)
        a, b = torch.randn(6, 16), torch.randn(2, 8, 16).transpose(-2, -1)
        offs = torch.tensor([2, 6], dtype=torch.int32)
        out = torch._grouped_mm(a, b, offs)
        ref = torch.cat([a[:2] @ b[0], a[2:] @ b[1]])
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
        assert hasattr(g.GenerationMixin.__dict__[name], "__unimatmul_original__")
        print("ok")
        """
    )
    env = {"UNIMATMUL_TORCH_NATIVE": "0", "UNIMATMUL_MODE": "cached"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(env)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    return env | extra


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_generate_s_decode_runs_the_routed_grouped_door(
    routing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With UNIMATMUL_HF_DECODE=grouped, decode steps reach the grouped door (two products
    a layer a step) and give what transformers gives with routing off (its batched_mm
    decode), in bf16: the logits of every step whose tokens so far agree, within bf16's
    rounding. By default decode is transformers' again: only the prefill reaches the door."""
    model = _model("cuda", torch.bfloat16)
    prompt = torch.randint(0, CONFIG["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1)).cuda()
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "output_logits": True}
    kwargs |= {"return_dict_in_generate": True, "attention_mask": torch.ones_like(prompt)}
    with unimatmul.mode("off"):
        ref = model.generate(prompt, **kwargs)
    ut.reset_stats()
    with unimatmul.mode("cached"):
        got = model.generate(prompt, **kwargs)
    routed = ut.grouped_stats()["routed"]
    assert routed >= 2 * CONFIG["num_hidden_layers"] * 4  # prefill and three decode steps
    steps = 0
    for step, (g, r) in enumerate(zip(got.logits, ref.logits, strict=True)):
        if not torch.equal(got.sequences[:, : 5 + step], ref.sequences[:, : 5 + step]):
            break
        assert float((g.double() - r.double()).norm() / r.double().norm()) < 2e-2
        steps += 1
    assert steps >= 2  # the prefill's logits and at least one decode step's compared
    ut.reset_stats()
    monkeypatch.delenv("UNIMATMUL_HF_DECODE")  # the default: transformers' switch
    with unimatmul.mode("cached"):
        model.generate(prompt, **kwargs)
    assert ut.grouped_stats()["routed"] == 2 * CONFIG["num_hidden_layers"]  # the prefill only
