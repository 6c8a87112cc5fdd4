"""The Backend protocol: a source of kernels, each offered as a Candidate.

A backend says whether it is available, reports the versions of the libraries whose
kernels it offers, lists Candidates for a Problem and prepares a Runner for one. It
raises :class:`~unimatmul.core.errors.UnsupportedProblem` for what it cannot run; any other
exception is a bug of the backend, which the selector contains (warn once, Default).
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from unimatmul.core.errors import UnsupportedProblem

if TYPE_CHECKING:
    from unimatmul.core.arrays import ArrayAdapter, Device
    from unimatmul.core.problem import Problem

ParamValue = int | str | float | bool


_PREPARE_DEADLINE: ContextVar[float] = ContextVar("unimatmul_prepare_deadline", default=math.inf)


def prepare_deadline() -> float:
    """The ``time.perf_counter()`` time by which a :meth:`Backend.prepare` that waits for
    work in progress (a compile started ahead) should stop waiting and raise
    :class:`NotReady`: the problem's tuning cap while the harness prepares a candidate
    (``math.inf`` without a cap, and outside the harness)."""
    return _PREPARE_DEADLINE.get()


@contextlib.contextmanager
def preparing_until(deadline: float) -> Iterator[None]:
    """Within this block, :func:`prepare_deadline` is ``deadline`` (the harness's)."""
    token = _PREPARE_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _PREPARE_DEADLINE.reset(token)


@dataclass(frozen=True)
class Candidate:
    """One kernel choice with a stable identity (never a position in a list).

    ``params`` holds what the backend needs to rebuild exactly this kernel, e.g. a
    cuBLASLt algo configuration or a oneDNN implementation name; ``identity`` is its
    one text form, stored in the cache and compared across processes.
    """

    backend: str
    name: str
    params: tuple[tuple[str, ParamValue], ...] = ()

    @property
    def identity(self) -> str:
        if not self.params:
            return f"{self.backend}/{self.name}"
        args = "&".join(f"{k}={_encode(v)}" for k, v in self.params)
        return f"{self.backend}/{self.name}?{args}"

    def param(self, name: str, default: Any = None) -> Any:
        for key, value in self.params:
            if key == name:
                return value
        return default

    @classmethod
    def make(cls, backend: str, name: str, **params: ParamValue) -> Candidate:
        return cls(backend, name, tuple(sorted(params.items())))

    @classmethod
    def from_identity(cls, identity: str) -> Candidate:
        backend, sep, rest = identity.partition("/")
        if not sep or not backend or not rest:
            msg = f"not a candidate identity: {identity!r} (expected 'backend/name[?k=v&...]')"
            raise ValueError(msg)
        name, _, args = rest.partition("?")
        params: list[tuple[str, ParamValue]] = []
        if args:
            for item in args.split("&"):
                key, eq, text = item.partition("=")
                if not eq:
                    msg = f"bad parameter {item!r} in candidate identity {identity!r}"
                    raise ValueError(msg)
                params.append((key, _decode(text)))
        return cls(backend, name, tuple(params))

    def __str__(self) -> str:
        return self.identity


def _encode(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "b:1" if value else "b:0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"f:{value!r}"
    return f"s:{value}"


def _decode(text: str) -> ParamValue:
    if text.startswith("b:"):
        return text == "b:1"
    if text.startswith("f:"):
        return float(text[2:])
    if text.startswith("s:"):
        return text[2:]
    return int(text)


DEFAULT = Candidate("default", "default")


class Runner(Protocol):
    """A prepared kernel: descriptors built once, called many times on the hot path.

    ``out`` already holds C when ``beta != 0``. A runner must not allocate, synchronise
    or log per call; it runs on the caller's current stream. It returns None, having
    written ``out``; only a grouped Default may return its own output instead, where the
    door lent ``out`` (``unimatmul.core.grouped.serve_default``), and wrappers pass on
    what they call returned.
    """

    candidate: Candidate

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> Any: ...


@dataclass(frozen=True)
class NativeCall:
    """A runner's call as plain numbers, for a native caller to make it without Python.

    A runner may offer ``native_call() -> NativeCall | None`` (torch routing's C++
    kernels take it; ``unimatmul/torch/_native.cpp`` reads the words); a grouped runner's
    takes the operands of the call it is laid out for and its output dtype,
    ``native_call(a, b, offs, out_dtype)`` (its launch depends on their sizes and strides,
    which its bucketed Problem does not fix). ``kind``: ``"lt"``
    (a cuBLASLt/hipBLASLt call: ``LtRunner.native_call`` lists the words),
    ``"onednn"`` (a oneDNN primitive: ``MatmulPrimitive.native_words``), ``"scaled_lt"``
    (a scaled, fp8, call: three words first, the descriptor attribute ids of the library's
    A and B scale pointers and 1 when the library's C pointer is the output (hipBLASLt)
    or 0 when it is the caller's B (cuBLASLt), then the ``"lt"`` words;
    ``ScaledLtRunner.native_call``) or ``"launch"``
    (one driver-API launch of a compiled GPU function: the addresses of
    ``cuLaunchKernel``/``hipModuleLaunchKernel`` and ``cuCtxSetCurrent``/``hipCtxSetCurrent``,
    the device's primary context, the function, grid x/y/z, block x, dynamic shared bytes,
    the stream of a split-K workspace and whether the kernel is bound to it, the number
    of parameters, then ``(role, bytes, value)`` per parameter in order: role 0 a constant
    ``value``, the others :attr:`LAUNCH_ROLES`: 1-4 the a, b, out and bias pointers, 5-6
    alpha and beta as fp32, 7-8 a scaled product's scale_a and scale_b pointers (both or
    neither: only torch routing's ``_scaled_mm`` table takes them), 9 a grouped product's
    offs pointer (only its ``_grouped_mm`` table takes it); the Triton plugin's
    ``CompiledRunner.native_call`` makes them). For the padded
    Lt runner, ``buffers`` holds the A, B and C buffers and their corner views (None
    where that operand is not copied) and ``flags`` (a_first, b_first): a
    batch-broadcast operand is copied as its first matrix. Whatever the words point
    at belongs to the runner, which must outlive the native caller's use of them.
    """

    #: A ``"launch"``'s per-call parameters by role name, as their role codes.
    LAUNCH_ROLES: ClassVar[dict[str, int]] = {
        "a": 1,
        "b": 2,
        "out": 3,
        "bias": 4,
        "alpha": 5,
        "beta": 6,
        "scale_a": 7,
        "scale_b": 8,
        "offs": 9,
    }

    kind: str
    words: list[int]
    buffers: tuple[Any, ...] = ()
    flags: tuple[int, ...] = ()

    @property
    def padded(self) -> bool:
        return bool(self.buffers)


@dataclass(frozen=True)
class Target:
    """What a backend is asked to serve: an array library's arrays on one device."""

    adapter: ArrayAdapter
    device: Device

    @property
    def array_kind(self) -> str:
        return self.adapter.kind


class Backend(ABC):
    """A source of kernels for some devices and array kinds."""

    #: Unique, stable name; the first part of every Candidate identity.
    name: ClassVar[str]
    #: Device kinds served (``cpu``, ``cuda``, ``hip``).
    device_kinds: ClassVar[frozenset[str]]
    #: Array libraries whose arrays the runners take (``numpy``, ``torch``, ``cupy``).
    array_kinds: ClassVar[frozenset[str]]
    #: The Problem ops whose candidates it lists (``Problem.op``): a backend is never asked
    #: about an op it does not name, so a grouped problem only reaches grouped kernels.
    ops: ClassVar[frozenset[str]] = frozenset({"gemm", "scaled_gemm"})

    def serves(self, target: Target) -> bool:
        return target.device.kind in self.device_kinds and target.array_kind in self.array_kinds

    @abstractmethod
    def availability(self) -> str | None:
        """None when usable here, else why not (the library missing, ...)."""

    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Exact versions of every library whose kernels are candidates."""

    @abstractmethod
    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        """Every kernel this backend offers for ``problem`` (may be empty)."""

    @abstractmethod
    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        """A Runner for one Candidate, or UnsupportedProblem if it no longer applies."""

    def platform_info(self, target: Target) -> dict[str, Any]:
        """Extra Platform facts this backend knows (arch, device name, ...)."""
        return {}

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        """Whether a stored Candidate still exists and applies (after a version change).

        The default asks ``candidates`` again; backends with a cheaper check override it.
        """
        try:
            return candidate in self.candidates(problem, target)
        except UnsupportedProblem:
            return False

    def ahead(self, problem: Problem, target: Target) -> None:  # noqa: B027 - optional
        """A hint that ``problem`` will be tuned soon: start what its tuning will wait for
        (compiling its kernels, say) and return at once. Most backends have nothing to start."""

    def ahead_over(self) -> None:  # noqa: B027 - optional
        """The tuning :meth:`ahead` announced is over, or ended early: drop what was started
        for it that nothing waits for (compiles not begun), so that the process's exit does
        not wait for it. Runners already prepared stay valid."""

    def close(self) -> None:  # noqa: B027 - optional, most backends hold nothing to release
        """Release library handles (tests and plugin unloading)."""
