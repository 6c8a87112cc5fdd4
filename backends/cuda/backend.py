"""CublasLtBackend: cuBLASLt algos as Candidates, named by their algo configuration.

An identity reads ``cublaslt/gemm?algo=..&cluster=..&custom=..&inner=..&reduction=..
&splitk=..&stages=..&swizzle=..&tile=..`` (``pad`` or ``pad-dims`` instead of
``gemm`` for the alignment candidates, whose algo runs on the padded problem). It is stored with the cuBLASLt version (``versions()``), and
``check`` rebuilds it with ``algo_init`` + config attributes + ``algo_check`` when a
record written under another version is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from unimatmul import settings
from unimatmul_backends.lt.abi import decode_cublaslt_version
from unimatmul_backends.lt.backend import LtBackend
from unimatmul_backends.lt.driver import CublasLtConfig, LtAlgo, LtDriver, LtPlan


class CublasLtBackend(LtBackend):
    """NVIDIA cuBLASLt on torch CUDA tensors and CuPy arrays (see the module docstring)."""

    name = "cublaslt"
    version_name = "cublaslt"
    device_kinds = frozenset({"cuda"})
    array_kinds = frozenset({"torch", "cupy"})

    def __init__(self, library: str | None = None) -> None:
        super().__init__()
        self.library_request = library
        #: "nvmath" or "ctypes" once loaded.
        self.library: str | None = None
        self._codec: CublasLtConfig | None = None

    def load_driver(self) -> LtDriver:
        from unimatmul_backends.cuda.library import load_driver

        driver, self.library = load_driver(self.library_request)
        self._codec = CublasLtConfig(driver)
        return driver

    @property
    def codec(self) -> CublasLtConfig:
        self.driver()
        assert self._codec is not None
        return self._codec

    def format_version(self, version: int) -> str:
        return ".".join(str(part) for part in decode_cublaslt_version(version))

    def algo_params(self, plan: LtPlan, algo: LtAlgo) -> dict[str, int]:
        return self.codec.params(algo)

    def algo_from_params(self, plan: LtPlan, params: Mapping[str, Any]) -> LtAlgo:
        return self.codec.rebuild(plan, {k: int(v) for k, v in params.items()})

    def extra_params(self, plan: LtPlan, seeds: Sequence[Mapping[str, int]]) -> list[dict[str, int]]:
        found, stats = self.codec.enumerate(
            plan,
            seeds,
            max_checks=settings.LT_EXHAUSTIVE_CHECKS.get(),
            max_found=settings.LT_EXHAUSTIVE_MAX.get(),
        )
        self.last_search = dict(stats, offered=len(found))
        return found
