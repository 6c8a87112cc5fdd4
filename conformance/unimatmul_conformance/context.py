"""What a check sees of the suite that runs it: the backend, the targets, the matrix.

The checks (``checks``, ``gpu``) are functions of this view, not of the ``Suite``
class, so that the suite can import them without the checks importing it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from unimatmul.backend import Backend, Candidate, Target
    from unimatmul.core.problem import Problem
    from unimatmul_conformance.matrix import Case
    from unimatmul_conformance.numerics import CaseData


class SuiteContext(Protocol):
    """The parts of :class:`unimatmul_conformance.suite.Suite` a check uses."""

    backend: Backend
    spec: str | None
    seed: int
    targets: dict[str, Target]

    @property
    def target(self) -> Target: ...

    @property
    def cases(self) -> list[Case]: ...

    def offered_now(self, problem: Problem, kind: str) -> Any: ...

    def offered(self, case: Case) -> Any: ...

    def offered_planned(self, label: str) -> list[str] | None: ...

    def other_candidates(self, case: Case) -> list[Candidate]: ...

    def case_data(self, case: Case) -> CaseData: ...

    def forget_case_data(self, case: Case) -> None: ...
