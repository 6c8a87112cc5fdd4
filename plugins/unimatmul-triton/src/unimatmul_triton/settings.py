"""The plugin's own variables (``UNIMATMUL_TRITON_INTERPRET`` and the others below), declared in unimatmul's settings registry
(one parser, one idea of "true", errors that name the variable; listed in this plugin's
README)."""

from __future__ import annotations

from unimatmul import settings

OWNER = "triton"

INTERPRET = settings.declare(
    "UNIMATMUL_TRITON_INTERPRET",
    "bool",
    False,
    settings.parse_bool,
    "`1`: test mode: the kernels run in Triton's interpreter on CPU torch tensors (set before triton is imported)",
    owner=OWNER,
)
CANDIDATES = settings.declare(
    "UNIMATMUL_TRITON_CANDIDATES",
    "int",
    None,
    settings.parse_int(1),
    "how many configs the model offers per problem (default 8 on a GPU, 3 in the interpreter)",
    owner=OWNER,
)
PRECOMPILE = settings.declare(
    "UNIMATMUL_TRITON_PRECOMPILE",
    "bool",
    True,
    settings.parse_bool,
    "`0`: do not start compiling the offered configs in a thread pool when they are listed",
    owner=OWNER,
)
COMPILE_THREADS = settings.declare(
    "UNIMATMUL_TRITON_COMPILE_THREADS",
    "int",
    None,
    settings.parse_int(1),
    "threads that compile configs ahead of their first run (default: one per compile process, "
    "else the CPU count, at most 8)",
    owner=OWNER,
)
COMPILE_PROCESSES = settings.declare(
    "UNIMATMUL_TRITON_COMPILE_PROCESSES",
    "int",
    None,
    settings.parse_int(0),
    "processes that compile configs into Triton's cache beside the threads (default: the CPU "
    "count less one where there are 4 or more CPUs, else 0; `0`: compile in this process only)",
    owner=OWNER,
)
KEY_MEMO = settings.declare(
    "UNIMATMUL_TRITON_KEY_MEMO",
    "bool",
    True,
    settings.parse_bool,
    "`0`: every process hashes Triton's sources and `libtriton` for its key (about 0.5 s), "
    "instead of reading the key kept by an earlier process for the same files",
    owner=OWNER,
)
GROUPED_NATIVE = settings.declare(
    "UNIMATMUL_TRITON_GROUPED_NATIVE",
    "bool",
    False,
    settings.parse_bool,
    "`1`: a grouped kernel's runner describes its launch to torch routing's native grouped table, "
    "which then launches it itself; off by default until that launch has passed its GPU tests "
    "(tests/torch/test_grouped_routing_gpu.py): without it the table sends such calls to the Python kernel",
    owner=OWNER,
)
