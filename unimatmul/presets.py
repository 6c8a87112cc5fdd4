"""Shape suites of real models, registered through the same hook plugins use.

Each shape is ``MxNxK`` for ``y[M, N] = x[M, K] @ W[K, N]`` at the model's usual
row count for one sequence on a CPU (batch 1 x 128 tokens); GPU benchmarks sweep M.
Attention products are batched over heads (``HxMxNxK``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from unimatmul.core.hookspecs import hookimpl

TOKENS = 128

PRESETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bert-base": (
        "BERT-base encoder layer (hidden 768, FFN 3072, 12 heads), 128 tokens",
        (
            f"{TOKENS}x2304x768",  # fused Q, K, V projection
            f"{TOKENS}x768x768",  # attention output projection
            f"{TOKENS}x3072x768",  # FFN up
            f"{TOKENS}x768x3072",  # FFN down
            f"12x{TOKENS}x{TOKENS}x64",  # scores Q @ K^T per head
            f"12x{TOKENS}x64x{TOKENS}",  # probabilities @ V per head
        ),
    ),
    "gpt2": (
        "GPT-2 small decoder layer (hidden 768, MLP 3072) and LM head, 128 tokens",
        (
            f"{TOKENS}x2304x768",  # c_attn
            f"{TOKENS}x768x768",  # attn c_proj
            f"{TOKENS}x3072x768",  # mlp c_fc
            f"{TOKENS}x768x3072",  # mlp c_proj
            f"{TOKENS}x50257x768",  # lm_head (vocabulary 50257: a misaligned N)
        ),
    ),
    "llama3-8b": (
        "Llama-3-8B decoder layer (hidden 4096, GQA 32/8 heads, MLP 14336), 128 tokens",
        (
            f"{TOKENS}x6144x4096",  # fused q (4096) + k (1024) + v (1024)
            f"{TOKENS}x4096x4096",  # o_proj
            f"{TOKENS}x28672x4096",  # fused gate + up
            f"{TOKENS}x4096x14336",  # down
        ),
    ),
    "resnet50": (
        "ResNet-50 convolutions as im2col GEMMs, batch 1 at 224x224, and the classifier",
        (
            "12544x64x147",  # conv1 7x7/2
            "3136x64x64",  # layer1 1x1 reduce
            "3136x64x576",  # layer1 3x3
            "3136x256x64",  # layer1 1x1 expand
            "784x128x1152",  # layer2 3x3
            "784x512x128",  # layer2 1x1 expand
            "196x256x2304",  # layer3 3x3
            "196x1024x256",  # layer3 1x1 expand
            "49x512x4608",  # layer4 3x3
            "49x2048x512",  # layer4 1x1 expand
            "1x1000x2048",  # fc
        ),
    ),
}


@hookimpl
def unimatmul_register_presets(register: Callable[[str, str, Sequence[str]], None]) -> None:
    for name, (description, shapes) in PRESETS.items():
        register(name, description, shapes)
