"""Every ``UNIMATMUL_*`` environment variable, declared once: name, type, default, meaning.

A variable is read through its :class:`Setting` (``settings.LT_HEURISTICS.get()``),
never with ``os.environ`` directly, so that each one has one parser, one idea of
"true", one error message for a bad value (:class:`SettingError`, which names the
variable and what it takes), and one line of documentation. The table of
variables in docs/settings.md is checked against :data:`REGISTRY` by a test, and the test suite clears
every registered variable before it runs.

Values are read when asked for (the environment may change while a process runs);
the one read on the per-call hot path, ``UNIMATMUL_MODE``, has its own fast reader in
:mod:`unimatmul.core.modes`. A plugin declares its own variables with :func:`declare`.

This module imports nothing of unimatmul and nothing heavy: PyTorch's autoload hook
reads ``UNIMATMUL_TORCH`` through it at ``import torch``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class SettingError(ValueError):
    """An environment variable holds a value its Setting cannot take."""

    def __init__(self, msg: str, *, name: str) -> None:
        super().__init__(msg)
        self.name = name


class Setting(Generic[T]):
    """One ``UNIMATMUL_*`` variable: how to read it and what it means."""

    __slots__ = ("default", "doc", "kind", "name", "owner", "parse")

    def __init__(
        self, name: str, kind: str, default: T, parse: Callable[[str], T], doc: str, owner: str
    ) -> None:
        self.name = name
        self.kind = kind  # for documentation: "bool", "int", "float", "path", "list", a choice, ...
        self.default = default
        self.parse = parse
        self.doc = doc
        self.owner = owner

    def raw(self) -> str | None:
        """The variable's text, stripped; None when unset or empty."""
        text = os.environ.get(self.name)
        if text is None:
            return None
        text = text.strip()
        return text or None

    def get(self) -> T:
        """The parsed value, or the default when unset; SettingError for a bad value."""
        text = self.raw()
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except SettingError:
            raise
        except (ValueError, TypeError) as exc:
            msg = f"{self.name}={text!r} {exc}"
            raise SettingError(msg, name=self.name) from None

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self.kind})"


REGISTRY: dict[str, Setting[Any]] = {}


def declare(
    name: str, kind: str, default: T, parse: Callable[[str], T], doc: str, *, owner: str = "core"
) -> Setting[T]:
    """Add a variable to the registry (once: a second declaration of a name is an error)."""
    if not name.startswith("UNIMATMUL_"):
        msg = f"setting {name!r} must start with UNIMATMUL_"
        raise ValueError(msg)
    found = REGISTRY.get(name)
    if found is not None:
        if found.owner == owner and found.kind == kind:
            return found  # the same declaration again (a module imported twice): the one setting
        msg = f"setting {name} is declared twice (by {found.owner} and by {owner})"
        raise ValueError(msg)
    setting = Setting(name, kind, default, parse, doc, owner)
    REGISTRY[name] = setting
    return setting


# --- parsers ----------------------------------------------------------------------------


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    msg = f"is neither true ({', '.join(TRUE)}) nor false ({', '.join(FALSE)})"
    raise ValueError(msg)


def parse_int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = "is not an integer"
            raise ValueError(msg) from None
        if value < minimum:
            msg = f"is less than {minimum}"
            raise ValueError(msg)
        return value

    return parse


def parse_float(minimum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            msg = "is not a number"
            raise ValueError(msg) from None
        if not value >= minimum:  # NaN fails too
            msg = f"is less than {minimum:g}"
            raise ValueError(msg)
        return value

    return parse


def parse_choice(*choices: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            msg = f"is not one of {', '.join(choices)}"
            raise ValueError(msg)
        return value

    return parse


def parse_names(text: str) -> frozenset[str]:
    """A comma-separated list of names."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def parse_text(text: str) -> str:
    return text


# --- the variables ----------------------------------------------------------------------
# Grouped by what reads them. docs/settings.md's table lists exactly these (a test checks it).

MODES = ("off", "cached", "tune", "record")

MODE = declare(
    "UNIMATMUL_MODE",
    "choice",
    "cached",
    parse_choice(*MODES),
    "`off`, `cached` (default), `tune` or `record` (see Modes)",
)
CACHE = declare(
    "UNIMATMUL_CACHE",
    "path",
    None,
    parse_text,
    "the cache file (default `$XDG_CACHE_HOME/unimatmul/cache.msgpack`, i.e. "
    "`~/.cache/unimatmul/cache.msgpack`); `:memory:` for none",
)
CACHE_READONLY = declare(
    "UNIMATMUL_CACHE_READONLY",
    "bool",
    False,
    parse_bool,
    "`1`: read the cache file, never write it (results stay in the process)",
)
CACHE_LOCK_TIMEOUT = declare(
    "UNIMATMUL_CACHE_LOCK_TIMEOUT",
    "float",
    30.0,
    parse_float(0.0),
    "seconds to wait for the cache file's lock (default 30)",
)
LRU_SIZE = declare(
    "UNIMATMUL_LRU_SIZE",
    "int",
    None,
    parse_int(1),
    "bound of each in-process map of prepared kernels (default 4096; the API's own map 8192)",
)
RECORD_FILE = declare(
    "UNIMATMUL_RECORD_FILE",
    "path",
    None,
    parse_text,
    "where `record` mode writes the problems it meets (default beside the cache)",
)
BUCKETS = declare(
    "UNIMATMUL_BUCKETS",
    "spec",
    "pow2",
    parse_text,
    "buckets of m for dynamic shapes (`pow2`, `pow2:MAX`, `M1,M2,...`, `off`; see `docs/torch.md`)",
)
PLUGINS = declare(
    "UNIMATMUL_PLUGINS",
    "list",
    None,
    parse_names,
    "comma-separated entry-point names: load only these plugins (`none`: no plugin at all)",
)
DISABLE_PLUGINS: Setting[frozenset[str]] = declare(
    "UNIMATMUL_DISABLE_PLUGINS",
    "list",
    frozenset[str](),
    parse_names,
    "comma-separated entry-point names never to load (e.g. `onednn`)",
)
TUNE_MEMORY = declare(
    "UNIMATMUL_TUNE_MEMORY",
    "float",
    8.0,
    parse_float(1.0),
    "the most memory tuning a product larger than twice the last-level cache may take: this multiple "
    "of its own operands (A, B and C; default 8: the check keeps B in float64, 4x a bf16 weight; a B or "
    "an A larger than 2 of the check's blocks, an fp8 product's above all, a range of its columns or "
    "rows at a time) plus twice that cache (smaller ones: the inputs rotated "
    "through it and the check); never over 3/4 of the memory free. A product that needs more runs "
    "Default (one warning)",
)
TUNE_LIMIT_S = declare(
    "UNIMATMUL_TUNE_LIMIT_S",
    "float",
    10.0,
    parse_float(0.0),
    "a candidate's time limit in tuning, at least (default 10): past it, or past "
    "`UNIMATMUL_TUNE_LIMIT_RATIO` times Default's time if that is more, the candidate is abandoned "
    "(recorded `abandoned`; on the CPU even in the middle of a call, see `docs/plugins.md`)",
)
TUNE_LIMIT_RATIO = declare(
    "UNIMATMUL_TUNE_LIMIT_RATIO",
    "float",
    10.0,
    parse_float(1.0),
    "a candidate's time limit in tuning as a multiple of Default's time over the same steps (default 10; "
    "never below `UNIMATMUL_TUNE_LIMIT_S`)",
)
GPU_BUDGET_S = declare(
    "UNIMATMUL_GPU_BUDGET_S",
    "float",
    0.002,
    parse_float(0.0),
    "measuring time per candidate on a GPU (default 0.002)",
)
GPU_BATCH_CALLS = declare(
    "UNIMATMUL_GPU_BATCH_CALLS",
    "int",
    10,
    parse_int(1),
    "calls in each timed batch of a candidate on a GPU, at least (default 10; fewer where a batch "
    "would run past 6 ms); another value is named in the records' timer",
)

TUNE_BUDGET_S = declare(
    "UNIMATMUL_TUNE_BUDGET_S",
    "float",
    None,
    parse_float(0.0),
    "seconds of tuning a program may spend in `tune` mode (default: no limit); once spent, problems "
    "not tuned yet run Default and are not tuned in that process (one warning; see `docs/tuning.md`)",
)
TUNE_CAP_S = declare(
    "UNIMATMUL_TUNE_CAP_S",
    "float",
    None,
    parse_float(0.0),
    "the most seconds tuning one problem may take (default: no cap); candidates not measured when it "
    "is spent are left out of that problem's record (see `docs/tuning.md`)",
)

TUNE_RETIRE_AFTER = declare(
    "UNIMATMUL_TUNE_RETIRE_AFTER",
    "int",
    3,
    parse_int(0),
    "in a tuning run on a GPU (`unimatmul tune`), a kernel family (e.g. `triton/tile`) 1.3x or more "
    "behind the best on this many problems of a class in a row is not measured on the rest of that "
    "class in the run (default 3; 0: never; see `docs/tuning.md`)",
)

# Confirming tuned choices where they run (unimatmul.tuning.confirm)
CONFIRM = declare(
    "UNIMATMUL_CONFIRM",
    "bool",
    True,
    parse_bool,
    "`0`: keep a tuned choice without confirming it on its first real calls (default `1`: "
    "alternate it with Default, timed in-stream, and keep it only if it wins there; see `docs/torch.md`)",
)
SCALED_GRAPH_MIN_GAIN = declare(
    "UNIMATMUL_SCALED_GRAPH_MIN_GAIN",
    "float",
    0.05,
    parse_float(0.0),
    "a scaled (fp8) choice is captured into a CUDA graph only where it beat Default by this "
    "fraction when tuned (default 0.05); below it the graph holds PyTorch's kernel, as for a tie "
    "(see `docs/torch.md`)",
)
CONFIRM_CALLS = declare(
    "UNIMATMUL_CONFIRM_CALLS",
    "int",
    16,
    parse_int(4),
    "timed real calls per candidate (the choice and Default) in a confirmation window (default 16)",
)

# The unimatmul command (unimatmul.cli)
DEBUG = declare(
    "UNIMATMUL_DEBUG",
    "bool",
    False,
    parse_bool,
    "`1`: the `unimatmul` command also prints the traceback of an unexpected error (exit code 1)",
    owner="cli",
)

# Distributed jobs (unimatmul.tuning.agreement)
DISTRIBUTED = declare(
    "UNIMATMUL_DISTRIBUTED",
    "bool",
    False,
    parse_bool,
    "`1`: in a job with an initialised `torch.distributed` group, the ranks make each tuning "
    "decision together (`warmup()` and `unimatmul.torch.agree()` become collective; see `docs/distributed.md`)",
)

# PyTorch routing (unimatmul.torch)
TORCH = declare(
    "UNIMATMUL_TORCH",
    "bool",
    False,
    parse_bool,
    "`1`: route PyTorch's matmuls through unimatmul when torch loads",
    owner="torch",
)
TORCH_NATIVE = declare(
    "UNIMATMUL_TORCH_NATIVE",
    "choice",
    "auto",
    parse_choice(
        "auto",
        "cuda",
        "0",
        aliases={"1": "auto", "on": "auto", "yes": "auto", "true": "auto", "all": "auto", "off": "0"}
        | {"no": "0", "false": "0"},
    ),
    "routing kernels in C++ (built at first use): `auto` (default: at the CPU and CUDA keys), "
    "`cuda` (the CUDA key only), `0` (Python kernels only); see `docs/torch.md`",
    owner="torch",
)
TORCH_NATIVE_BUILD = declare(
    "UNIMATMUL_TORCH_NATIVE_BUILD",
    "choice",
    "background",
    parse_choice("background", "wait", "never"),
    "where no build of the native routing kernels exists yet: `background` (default: `enable()` "
    "returns at once, the Python kernels serve while a process of its own builds them, and the "
    "native kernels take over when it is done), `wait` (`enable()` builds them first), `never` "
    "(Python kernels; only a build made before is loaded); see `docs/torch.md`",
    owner="torch",
)
HF_DECODE = declare(
    "UNIMATMUL_HF_DECODE",
    "choice",
    "auto",
    parse_choice("auto", "transformers", "grouped"),
    "MoE experts in Hugging Face `generate()` on a GPU while routing is on: `auto` (default: decode "
    "keeps the routed grouped products where generate() compiles its decode step, else transformers' "
    "switch to gathered `batched_mm` stays), `grouped` (always kept: less GPU time, more host work a "
    "step), `transformers` (its switch always stays); see `docs/torch.md`",
    owner="torch",
)

# oneDNN (backends/onednn)
DNNL_LIB = declare(
    "UNIMATMUL_DNNL_LIB",
    "path",
    None,
    parse_text,
    "path of `libdnnl.so.3` to use instead of the one from the `onednn-cpu-gomp` (or `onednn`) wheel; it must exist",
    owner="onednn",
)
ONEDNN_REF = declare(
    "UNIMATMUL_ONEDNN_REF",
    "bool",
    False,
    parse_bool,
    "`1`: also offer oneDNN's reference (`ref:`) implementations as candidates (slow; for checking)",
    owner="onednn",
)

# cuBLASLt and hipBLASLt (backends/lt, backends/cuda, backends/rocm)
LT_HEURISTICS = declare(
    "UNIMATMUL_LT_HEURISTICS",
    "int",
    16,
    parse_int(1),
    "how many cuBLASLt heuristic algos to measure (default 16)",
    owner="lt",
)
LT_PAD_HEURISTICS = declare(
    "UNIMATMUL_LT_PAD_HEURISTICS",
    "int",
    2,
    parse_int(0),
    "how many heuristic algos the alignment (padding) candidates run (default 2)",
    owner="lt",
)
LT_EXHAUSTIVE = declare(
    "UNIMATMUL_LT_EXHAUSTIVE",
    "bool",
    False,
    parse_bool,
    "`1`: also enumerate cuBLASLt algo configurations beyond the heuristic",
    owner="lt",
)
LT_EXHAUSTIVE_MAX = declare(
    "UNIMATMUL_LT_EXHAUSTIVE_MAX",
    "int",
    64,
    parse_int(1),
    "with `UNIMATMUL_LT_EXHAUSTIVE`: the most extra configurations offered (default 64)",
    owner="lt",
)
LT_EXHAUSTIVE_CHECKS = declare(
    "UNIMATMUL_LT_EXHAUSTIVE_CHECKS",
    "int",
    3000,
    parse_int(1),
    "with `UNIMATMUL_LT_EXHAUSTIVE`: the most configurations checked (default 3000)",
    owner="lt",
)
LT_LIBRARY = declare(
    "UNIMATMUL_LT_LIBRARY",
    "choice",
    "auto",
    parse_choice("auto", "nvmath", "ctypes"),
    "`auto` (default: nvmath-python if it imports, else ctypes), `nvmath` or `ctypes`: "
    "which bindings drive cuBLASLt",
    owner="cublaslt",
)
LT_WORKSPACE_MB = declare(
    "UNIMATMUL_LT_WORKSPACE_MB",
    "int",
    32,
    parse_int(0),
    "the most workspace an Lt algo may use (default 32)",
    owner="lt",
)
CUBLASLT_PATH = declare(
    "UNIMATMUL_CUBLASLT_PATH",
    "path",
    None,
    parse_text,
    "explicit path of libcublasLt (overrides every search)",
    owner="cublaslt",
)
HIPBLASLT_LIB = declare(
    "UNIMATMUL_HIPBLASLT_LIB",
    "path",
    None,
    parse_text,
    "explicit path of libhipblaslt (overrides every search)",
    owner="rocm",
)
ROCBLAS_LIB = declare(
    "UNIMATMUL_ROCBLAS_LIB",
    "path",
    None,
    parse_text,
    "explicit path of librocblas (overrides every search)",
    owner="rocm",
)
HIPBLASLT_HEURISTICS = declare(
    "UNIMATMUL_HIPBLASLT_HEURISTICS",
    "int",
    256,
    parse_int(1),
    "how many hipBLASLt solutions to ask for (default 256)",
    owner="rocm",
)


def parse_pool(text: str) -> int:
    """``all`` (-1), ``0`` (the heuristic only) or a count of solutions beyond the heuristic's."""
    value = text.strip().lower()
    if value in ("all", "auto", "on"):
        return -1
    if value in ("off", "no", "false"):
        return 0
    return parse_int(0)(value)


HIPBLASLT_POOL = declare(
    "UNIMATMUL_HIPBLASLT_POOL",
    "int",
    -1,
    parse_pool,
    "hipBLASLt solutions offered beyond the heuristic's, through the extension shim built at first "
    "use: `all` (default: every solution of the type that supports the problem, as TunableOp), "
    "`0` (the heuristic only, no shim) or a count (the best by the analytic order); see `docs/rocm.md`",
    owner="rocm",
)

# The conformance suite
CONFORMANCE_BACKEND = declare(
    "UNIMATMUL_CONFORMANCE_BACKEND",
    "text",
    None,
    parse_text,
    "the backend the conformance pytest plugin checks when no option names one",
    owner="conformance",
)

#: The variables of unimatmul itself (the table of docs/settings.md); plugins add theirs to REGISTRY.
BUILTIN: dict[str, Setting[Any]] = dict(REGISTRY)
